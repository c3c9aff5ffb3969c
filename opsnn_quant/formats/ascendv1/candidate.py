"""An AscendV1 directory (ours or msModelSlim's) as an evaluation candidate.

The float baseline gives the architecture (and the tokenizer, scheduler and other non-weight
parts); every weight then comes from the candidate directory:

* a directory with a description is one AscendV1 model: loaded into the whole model, or into the
  one component whose names it fits (msModelSlim writes a diffusion ``transformer`` flat, its
  tensor names relative to it, ``ascendv1.md`` §7);
* a diffusers pipeline directory (``model_index.json``): each component subdirectory with a
  description is loaded as AscendV1, each other one with safetensors weights is loaded as float
  weights (strictly, every tensor), so what is evaluated is the directory as written.
"""

from __future__ import annotations

import json
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
from opsnn_quant.formats.safetensors_io import open_tensor_files
from opsnn_quant.models.base import ModelAdapter


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


def apply_ascendv1_dir(model: nn.Module, directory: str | Path) -> list[str]:
    """Load an AscendV1 directory or pipeline directory into ``model`` (in place).

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
        apply_ascendv1(part, ckpt)
        return [name]
    if not (root / "model_index.json").is_file():
        raise AscendV1Error(f"{root}: no quant_model_description.json; not an AscendV1 directory")
    loaded = []
    for name, child in model.named_children():
        sub = root / name
        if is_ascendv1_dir(sub):
            apply_ascendv1(child, read_ascendv1(sub))
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
    ``directory`` on top."""
    from opsnn_quant.models import load_adapter

    adapter = load_adapter(
        family, baseline, device=device, dtype=dtype, allow_pickle=allow_pickle, **settings
    )
    apply_ascendv1_dir(adapter.model, directory)
    adapter.model_id = str(directory)
    return adapter
