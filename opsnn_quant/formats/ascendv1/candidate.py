"""An AscendV1 directory (ours or msModelSlim's) as an evaluation candidate.

The float baseline gives the architecture (and the tokenizer, scheduler and other non-weight
parts); every weight then comes from the candidate directory:

* a directory with a description is one AscendV1 model: loaded into the whole model, or into the
  one component whose names it fits (msModelSlim writes a diffusion ``transformer`` flat, its
  tensor names relative to it, ``ascendv1.md`` §7);
* a diffusers pipeline directory (``model_index.json``): each component subdirectory with a
  description is loaded as AscendV1, each other one with safetensors weights is loaded as float
  weights (strictly, every tensor), so what is evaluated is the directory as written.

The quantized Linears run in the model dtype the engine runs the directory in
(:meth:`~opsnn_quant.formats.ascendv1.reader.AscendV1Checkpoint.params_dtype`): where the
checkpoint does not say it, ``vllm serve``'s default from the directory's ``config.json``, else
from the float model's (msModelSlim's savers write none; a user copies the float model's to
serve the files). A Whisper description without the keys vLLM 0.23.0 looks its layers up under
(:mod:`~opsnn_quant.formats.ascendv1.vllm_prefixes`; msModelSlim 26.1.0 writes none) is judged
all the same, with a warning: vLLM-Ascend would not build the model (``KeyError``), another
AscendV1 engine may.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from torch import nn

from opsnn_quant.formats.ascendv1.consumer import apply_ascendv1
from opsnn_quant.formats.ascendv1.contract import AscendV1Error
from opsnn_quant.formats.ascendv1.reader import (
    AscendV1Checkpoint,
    find_description,
    is_ascendv1_dir,
    read_ascendv1,
)
from opsnn_quant.formats.ascendv1.vllm_prefixes import WHY, architectures, vllm_prefix_aliases
from opsnn_quant.formats.safetensors_io import open_tensor_files
from opsnn_quant.models.base import ModelAdapter

log = logging.getLogger(__name__)


def looks_ascendv1(directory: Path) -> bool:
    """A directory meant as AscendV1: a ``quant_model_*`` file in it or in a subdirectory (so
    that a broken one is reported as such, not as a model of unknown family)."""
    if not directory.is_dir():
        return False
    dirs = [directory, *(p for p in sorted(directory.iterdir()) if p.is_dir())]
    return any(any(d.glob("quant_model_*")) for d in dirs)


def check_ascendv1_candidate(directory: Path) -> list[AscendV1Checkpoint]:
    """Read and check every AscendV1 directory of a candidate (before anything is written).

    Raises:
        AscendV1Error: see :func:`~opsnn_quant.formats.ascendv1.reader.read_ascendv1`.
    """
    if is_ascendv1_dir(directory) or not (directory / "model_index.json").is_file():
        return [read_ascendv1(directory)]
    found = [read_ascendv1(p) for p in sorted(directory.iterdir()) if is_ascendv1_dir(p)]
    if not found:
        raise AscendV1Error(f"{directory}: no component holds a quant_model_description.json")
    return found


def recorded_source(directory: Path) -> str | None:
    """The float model our export recorded (``metadata.opsnn_quant.source_model``), if any."""
    paths = [directory] if is_ascendv1_dir(directory) else sorted(directory.iterdir())
    for path in paths:
        desc = find_description(path) if path.is_dir() else None
        if desc is None:
            continue
        try:
            doc = json.loads(desc.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        ours = meta.get("opsnn_quant") if isinstance(meta, dict) else None
        if isinstance(ours, dict) and isinstance(ours.get("source_model"), str):
            return str(ours["source_model"])
    return None


def _fits(module: nn.Module, ckpt: AscendV1Checkpoint) -> bool:
    names = {n for n, _ in module.named_modules()}
    state = set(module.state_dict())
    return all(p in names for p in ckpt.linears) and all(f in state for f in ckpt.floats)


def _float_config(float_dir: Path | None, component: str) -> Path | None:
    """The float model's ``config.json`` of ``component`` (``""``: the model's own)."""
    if float_dir is None:
        return None
    config = float_dir / component / "config.json" if component else float_dir / "config.json"
    return config if config.is_file() else None


def _apply(part: nn.Module, ckpt: AscendV1Checkpoint, config: Path | None) -> None:
    """Load ``ckpt`` into ``part`` in the engine's dtype, warning where vLLM-Ascend would not
    build the model from its description."""
    own = ckpt.directory / "config.json"
    source = own if own.is_file() else config
    archs = architectures(source) if source is not None else []
    linears = [n for n, m in part.named_modules() if isinstance(m, nn.Linear)]
    wanted = vllm_prefix_aliases(ckpt.description, archs, linears)
    missing = [key for key in wanted if key not in ckpt.description]
    if missing:
        log.warning(
            "%s: judged, but vLLM-Ascend 0.23.0.post1 would not build this %s from it: its "
            "description lacks the %d keys vLLM looks the layers up under (%r, ...; KeyError). %s",
            ckpt.directory, archs[0], len(missing), missing[0], WHY,
        )  # fmt: skip
    apply_ascendv1(part, ckpt, params_dtype=ckpt.params_dtype(config))


def apply_ascendv1_dir(
    model: nn.Module, directory: str | Path, float_dir: Path | None = None
) -> list[str]:
    """Load an AscendV1 directory or pipeline directory into ``model`` (in place).

    ``float_dir``: the float model's directory, whose ``config.json`` (the component's, for a
    component) gives the engine's dtype where the candidate's files do not.

    Returns:
        The module names loaded as AscendV1 (``""``: the whole model).

    Raises:
        AscendV1Error: not an AscendV1 directory, a checkpoint that fits no part of the model,
            or any error of :func:`~opsnn_quant.formats.ascendv1.consumer.apply_ascendv1`.
    """
    root = Path(directory)
    if is_ascendv1_dir(root):
        ckpt = read_ascendv1(root)
        parts = [("", model), *model.named_children()]
        fitting = [(n, m) for n, m in parts if _fits(m, ckpt)]
        if not fitting:
            raise AscendV1Error(f"{root}: its tensor names fit neither the model nor a component")
        name, part = fitting[0]
        _apply(part, ckpt, _float_config(float_dir, name))
        return [name]
    if not (root / "model_index.json").is_file():
        raise AscendV1Error(f"{root}: no quant_model_description.json; not an AscendV1 directory")
    loaded = []
    for name, child in model.named_children():
        sub = root / name
        if is_ascendv1_dir(sub):
            _apply(child, read_ascendv1(sub), _float_config(float_dir, name))
            loaded.append(name)
        elif sub.is_dir():
            _load_float(child, sub)
    if not loaded:
        raise AscendV1Error(f"{root}: no component holds a quant_model_description.json")
    return loaded


def _load_float(module: nn.Module, directory: Path) -> None:
    """Copy a float component's safetensors weights into ``module``, every tensor."""
    import torch

    indexes = sorted(directory.glob("*.safetensors.index.json"))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise AscendV1Error(f"{directory}: a model component without safetensors weights")
    index = indexes[0] if len(indexes) == 1 else None
    tensors = open_tensor_files(directory, index, files, error=AscendV1Error)
    state = module.state_dict(keep_vars=True)
    for name in sorted(set(tensors.info) - set(state)):
        raise AscendV1Error(f"{directory / name}: not a tensor of the model")
    loaded: set[int] = set()
    with torch.no_grad():
        for name in sorted(tensors.info):
            t = state[name]
            src = tensors.load(name)
            if tuple(src.shape) != tuple(t.shape):
                raise AscendV1Error(
                    f"{directory / name}: shape {list(src.shape)}, model {list(t.shape)}"
                )
            t.data.copy_(src.to(t.dtype))
            loaded.add(t.data_ptr())
    for name, t in state.items():
        if t.data_ptr() not in loaded:
            raise AscendV1Error(f"{directory}: lacks {name}")


def load_ascendv1_candidate(
    directory: str | Path,
    baseline: str,
    family: str | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    allow_pickle: bool = False,
    **settings: Any,
) -> ModelAdapter:
    """The float ``baseline`` loaded by its adapter (``allow_pickle`` and the family's
    ``settings``: see :func:`~opsnn_quant.models.load_adapter`), then the AscendV1
    ``directory`` on top, its quantized Linears in the engine's dtype (the baseline's
    ``config.json`` stands for the one the directory lacks)."""
    from opsnn_quant.models import load_adapter
    from opsnn_quant.sources import model_path

    adapter = load_adapter(
        family, baseline, device=device, dtype=dtype, allow_pickle=allow_pickle, **settings
    )
    apply_ascendv1_dir(adapter.model, directory, model_path(baseline))
    adapter.model_id = str(directory)
    return adapter
