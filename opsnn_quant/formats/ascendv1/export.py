"""``export/ascendv1/``: our quantized model as a directory the Ascend serving engines load.

Layout. A diffusers pipeline (a source directory with ``model_index.json``) comes out as a
diffusers pipeline directory: every component holding a quantized Linear becomes an AscendV1
directory (``unet/``, ``transformer/``, ``text_encoder/``: its ``config.json`` and helper files,
``quant_model_description.json``, ``quant_model_weights.safetensors``), the other components and
top-level files are copied untouched. Any other model (a transformers directory) comes out as one
AscendV1 directory. Tensor names are the component's own ``state_dict`` names, as msModelSlim
writes them for ``pipeline.transformer`` (``ascendv1.md`` §7) and as the engines look them up.

Helper files: msModelSlim's ``copy_files`` copies ``*.json/*.py/*.txt/*.jinja``; we copy every
file that is not a weight file (tokenizer models included) and, as its
``remove_quantization_config`` does, drop ``quantization_config`` from ``config.json``.
Weights: one file below :data:`DEFAULT_SHARD_BYTES` (MindIE-SD opens exactly one file), else
msModelSlim's shards + index.

Description keys: the tensors', and for a model class whose vLLM layer prefixes differ from its
checkpoint names (vLLM 0.23.0's Whisper), each Linear's weight key again under the prefix vLLM
asks vLLM-Ascend's quantization config for (:mod:`opsnn_quant.formats.ascendv1.vllm_prefixes`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.folding.fold_check import Fold
from opsnn_quant.folding.smooth_fold import Call, plan_folds
from opsnn_quant.formats.ascendv1.contract import DESCRIPTION_FILE, GLOBAL_KEYS, WEIGHTS_PREFIX
from opsnn_quant.formats.ascendv1.vllm_prefixes import WHY, architectures, vllm_prefix_aliases
from opsnn_quant.formats.ascendv1.writer import CONV_REASON, ComponentExport, component_export
from opsnn_quant.formats.safetensors_io import read_header, tensor_bytes, write_tensors
from opsnn_quant.io import empty_dir
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.confine import (
    DIRECTORY,
    WEIGHT_SUFFIXES,
    check_export_sources,
    escape,
    export_refusal,
)
from opsnn_quant.models.offload import BlockOffload, offload_of
from opsnn_quant.ownership import LEDGER, MARKER
from opsnn_quant.quant.modules import QuantLinear, QuantModule

log = logging.getLogger(__name__)
OUTPUT_KIND = "ascendv1"
DEFAULT_SHARD_BYTES = 4 * 2**30  # msModelSlim's part_file_size default, 4 GB
OURS = (MARKER, LEDGER)  # our bookkeeping in a source directory is not the model's
LINEARS = (nn.Linear, QuantLinear)


@dataclass
class AscendV1Export:
    """What :func:`export_ascendv1` wrote.

    Attributes:
        path: the output directory.
        components: component name (``""`` for a single model) -> its export, for the
            components written as AscendV1.
        copied: components copied untouched from the source.
        notes: one line per module not exported in its quantized form, and per caveat.
    """

    path: Path
    components: dict[str, ComponentExport] = field(default_factory=dict)
    copied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _components(model: nn.Module, source: Path) -> dict[str, nn.Module]:
    if not (source / "model_index.json").is_file():
        return {"": model}
    return {n: m for n, m in model.named_children() if (source / n).is_dir()}


def _relative(name: str, component: str) -> str:
    return name[len(component) + 1 :] if component else name


def _component_of(components: Sequence[str]) -> Callable[[str], str]:
    def scope(name: str) -> str:
        for c in components:
            if not c or name == c or name.startswith(f"{c}."):
                return c
        return "<none>"

    return scope


def _source_keys(directory: Path) -> set[str] | None:
    """Tensor names of the float model's safetensors in ``directory`` (None: none there)."""
    files = sorted(p for p in directory.glob("*.safetensors") if not p.name.startswith("quant_"))
    if not files:
        return None
    return {k for f in files for k in read_header(f)}


def _files(src: Path, root: Path) -> list[Path]:
    """The files under ``src`` an export may copy, each a regular file inside the model
    directory ``root`` (a link resolving inside it stands for the file it names).

    Raises:
        ModelLoadError: a link leading out of ``root`` (a folder's included), or an entry that
            is no regular file (a FIFO, a device, a broken link).
    """
    out = []
    for path in sorted(src.rglob("*")):
        if path.name in OURS:
            continue
        why = escape(path, root)
        if why is not None and why != DIRECTORY:
            raise ModelLoadError(export_refusal(path, why))
        if why is None:
            out.append(path)
    return out


def _copy_helpers(src: Path, dst: Path, root: Path, params_dtype: str | None = None) -> None:
    for path in _files(src, root):
        rel = path.relative_to(src)
        if path.name.endswith(WEIGHT_SUFFIXES) or path.name.endswith(".index.json"):
            continue
        if path.name.startswith("quant_model_"):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel == Path("config.json"):
            text = path.read_text(encoding="utf-8")
            (dst / rel).write_text(_engine_config(text, params_dtype))
        else:
            shutil.copyfile(path, dst / rel)  # a link inside the model: the file it names


def _engine_config(text: str, params_dtype: str | None) -> str:
    """``config.json`` as the engine must read it: without ``quantization_config`` (top level and
    ``text_config``), as msModelSlim's ``remove_quantization_config``, and with ``dtype`` and
    ``torch_dtype`` the params dtype the quantized Linears were calibrated and written for.

    vLLM's ``--dtype auto`` takes the model dtype from ``config.json`` alone (``dtype``, which
    transformers fills from ``torch_dtype``; vllm 0.23.0 ``transformers_utils/
    model_arch_config_convertor.py`` ``get_torch_dtype``, ``config/model.py``
    ``_resolve_auto_dtype``: fp16 stays fp16) and never reads the description: a float16 source
    config made ``vllm serve`` run a bfloat16 export in fp16, where vllm-ascend's static
    ``deq_scale`` parameter is int64 (``w8a8_static.py`` ``get_perchannel_param``) and our float32
    values were cast to 0. Other text is kept byte for byte when nothing changes.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return text
    if not isinstance(doc, dict):
        return text
    changed = doc.pop("quantization_config", None) is not None
    sub = doc.get("text_config")
    if isinstance(sub, dict):
        changed |= sub.pop("quantization_config", None) is not None
    if params_dtype is not None:
        for key in ("dtype", "torch_dtype"):
            changed |= doc.get(key) != params_dtype
            doc[key] = params_dtype
    return json.dumps(doc, indent=2, sort_keys=True) + "\n" if changed else text


def _copy_tree(src: Path, dst: Path, root: Path) -> None:
    why = escape(src, root)
    if why is not None and why != DIRECTORY:
        raise ModelLoadError(export_refusal(src, why))
    for path in _files(src, root):
        (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dst / path.relative_to(src))


def _write_component(
    export: ComponentExport,
    src: Path,
    dst: Path,
    shard_bytes: int,
    root: Path,
    linears: Collection[str] = (),
) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    _copy_helpers(src, dst, root, export.params_dtype if export.int8 else None)
    # the keys vLLM's model class asks vLLM-Ascend's quantization config for, where its layer
    # prefixes are not the checkpoint's names (vLLM 0.23.0's Whisper: a KeyError while the model
    # is built otherwise; see opsnn_quant.formats.ascendv1.vllm_prefixes)
    aliases = vllm_prefix_aliases(export.description, architectures(src / "config.json"), linears)
    if aliases:
        described = dict(export.description)
        globals_ = {k: described.pop(k) for k in list(described) if k in GLOBAL_KEYS}
        meta = globals_.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("opsnn_quant"), dict):
            meta["opsnn_quant"]["vllm_prefix_aliases"] = WHY
        export.description = described | dict(sorted(aliases.items())) | globals_
    total = sum(tensor_bytes(t) for t in export.tensors.values())
    write_tensors(
        export.tensors, dst, WEIGHTS_PREFIX, shard_bytes if total >= shard_bytes else None
    )
    # indent 4 as AscendV1Saver's JsonWriter; keys in a fixed order: same model, same bytes
    (dst / DESCRIPTION_FILE).write_text(json.dumps(export.description, indent=4) + "\n")


def export_ascendv1(
    adapter: ModelAdapter,
    out: str | Path,
    *,
    calls: Mapping[str, Sequence[Call]],
    source_dir: Path | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> AscendV1Export:
    """Write ``adapter``'s quantized model into ``out`` in the AscendV1 layout.

    Args:
        adapter: an adapter whose model holds frozen quantized modules.
        out: a new or empty directory (see :func:`~opsnn_quant.io.empty_dir`).
        calls: recorded calls per root (:class:`opsnn_quant.recording.RecordedRoots.calls`):
            one per root is run to find where SmoothQuant factors can be folded.
        source_dir: the float model's directory (default: the adapter's source).
        shard_bytes: shard size; a model below it is written as one file.

    Returns:
        The :class:`AscendV1Export`; same model and inputs give byte-identical files.

    Raises:
        ModelLoadError: a file to copy from the source that is no regular file inside it (a
            link leading out of it, a FIFO): the output is not written.
    """
    from opsnn_quant.sources import model_path

    source = source_dir or model_path(adapter.model_id)
    check_export_sources(str(source))  # the files copied below: before anything is written
    model = adapter.model
    components = _components(model, source)
    # an offloaded model (--max-memory): block by block, each tensor read again from its
    # block's file when written; SmoothQuant folds (traced and checked on the whole model, and
    # written into the producers' weights) still want every block loaded
    off = offload_of(model)
    folding = bool(_smooth_factors(model))
    stream = off if off is not None and not folding else None
    with off.resident() if off is not None and folding else contextlib.nullcontext():
        smooth = _smooth_factors(model)  # read once loaded: an offloaded block's are on meta
        return _export(adapter, out, components, smooth, calls, source, shard_bytes, stream)


def _smooth_factors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each SmoothQuant module's factor (name -> the input quantizer's ``smooth``)."""
    smooth: dict[str, torch.Tensor] = {}
    for n, m in model.named_modules():
        factor = getattr(m.input_quantizer, "smooth", None) if isinstance(m, QuantModule) else None
        if isinstance(factor, torch.Tensor):
            smooth[n] = factor
    return smooth


def _export(
    adapter: ModelAdapter,
    out: str | Path,
    components: dict[str, nn.Module],
    smooth: dict[str, torch.Tensor],
    calls: Mapping[str, Sequence[Call]],
    source: Path,
    shard_bytes: int,
    off: BlockOffload | None,
) -> AscendV1Export:
    model = adapter.model
    scope = _component_of(list(components))
    folds, refused = plan_folds(model, smooth, calls, scope) if smooth else ([], {})
    result = AscendV1Export(Path(out))
    tmp = empty_dir(out)
    if "" not in components:
        _copy_top(source, tmp, list(components))
    for cname, module in components.items():
        src, dst = (source / cname, tmp / cname) if cname else (source, tmp)
        mine = [
            Fold(_relative(f.producer, cname), f.factor,
                 tuple(_relative(c, cname) for c in f.consumers),
                 tuple(_relative(c, cname) for c in f.compensated))
            for f in folds if scope(f.producer) == cname
        ]  # fmt: skip
        export = component_export(
            module, folds=mine,
            refused={_relative(k, cname): v for k, v in refused.items() if scope(k) == cname},
            source_keys=_source_keys(src), source_model=adapter.model_id,
            off=off, prefix=f"{cname}." if cname else "",
        )  # fmt: skip
        quantized = any(
            v != "FLOAT" for k, v in export.description.items() if k.endswith(".weight")
        )
        if cname and not quantized:
            _copy_tree(src, dst, source)
            result.copied.append(cname)
            convs = [n for n, r in export.exported_float.items() if r == CONV_REASON]
            export.exported_float = {n: CONV_REASON + " (original float weights: the "
                                     "component is copied from the source)" for n in convs}  # fmt: skip
        else:
            linears = [n for n, m in module.named_modules() if isinstance(m, LINEARS)]
            _write_component(export, src, dst, shard_bytes, source, linears)
            result.components[cname] = export
        result.notes += _notes(cname, export)
    return result


def _copy_top(source: Path, tmp: Path, components: list[str]) -> None:
    """A pipeline's top-level files and the directories that are not model components."""
    for path in sorted(source.iterdir()):
        if path.name in OURS:
            continue
        why = escape(path, source)
        if why is None:
            shutil.copyfile(path, tmp / path.name)
        elif why != DIRECTORY:
            raise ModelLoadError(export_refusal(path, why))
        elif path.name not in components:
            _copy_tree(path, tmp / path.name, source)


def _notes(cname: str, export: ComponentExport) -> list[str]:
    full = (lambda n: f"{cname}.{n}") if cname else (lambda n: n)
    convs = [full(n) for n, r in export.exported_float.items() if r.startswith(CONV_REASON)]
    notes = [
        f"{full(n)}: exported FLOAT ({r})"
        for n, r in sorted(export.exported_float.items())
        if not r.startswith(CONV_REASON)
    ]
    if convs:
        shown = ", ".join(convs[:3]) + (f", +{len(convs) - 3}" if len(convs) > 3 else "")
        copied = (
            " (component copied from the source)" if "copied" in str(export.exported_float) else ""
        )
        notes.append(
            f"{len(convs)} quantized Conv2d exported FLOAT{copied}: AscendV1 engines quantize "
            f"Linear layers only ({shown}; all listed in the description's metadata)"
        )
    if export.inexact_input_scale:
        names = ", ".join(full(n) for n in export.inexact_input_scale[:4])
        more = len(export.inexact_input_scale) - 4
        notes.append(
            f"{len(export.inexact_input_scale)} W8A8 module(s) ({names}{f', +{more}' if more > 0 else ''}): "
            "no fp32 input_scale has our multiplier as its reciprocal; the engines' 1/input_scale "
            "differs from ours by one ulp, so a rare activation lands one int8 step away"
        )
    return notes
