"""``export/ascendv1/``: our quantized model as a directory the Ascend serving engines load.

Layout. A diffusers pipeline (a source directory with ``model_index.json``) comes out as a
diffusers pipeline directory: every component holding a quantized Linear becomes an AscendV1
directory (``unet/``, ``transformer/``, ``text_encoder/``: its ``config.json`` and helper files,
``quant_model_description.json``, ``quant_model_weights.safetensors``), the other components
``model_index.json`` names and the top-level helper files are copied untouched. Any other model
(a transformers directory) comes out as one AscendV1 directory. Tensor names are the component's
own ``state_dict`` names, as msModelSlim writes them for ``pipeline.transformer``
(``ascendv1.md`` §7) and as the engines look them up.

What is copied: what the engines read, nothing else
(:mod:`opsnn_quant.models.loader_files`: vLLM / vllm-ascend and diffusers read a model's configs,
tokenizer and processor files, chat templates, remote code and weights, at the top of the model
directory or of a component the index names; msModelSlim's ``copy_files`` globs
``*.json/*.py/*.txt/*.jinja`` are the floor). A dotfile, a dot-directory (``.git/``,
``.cache/``), a key, a ``README.md``, a folder the index does not name stay behind, and the
notes say so. Each file is a regular file inside the model directory, written with a mode no
wider than its source's (a 0600 file stays 0600). As msModelSlim's
``remove_quantization_config`` does, ``quantization_config`` is dropped from ``config.json``.
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
import os
import shutil
import stat
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
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.confine import DIRECTORY, escape
from opsnn_quant.models.loader_files import (
    ModelFiles,
    check_model_sources,
    is_weight,
    model_files,
    refusal,
)
from opsnn_quant.models.offload import BlockOffload, offload_of
from opsnn_quant.output.files import empty_dir
from opsnn_quant.quant.modules import QuantLinear, QuantModule

log = logging.getLogger(__name__)
OUTPUT_KIND = "ascendv1"
DEFAULT_SHARD_BYTES = 4 * 2**30  # msModelSlim's part_file_size default, 4 GB
LINEARS = (nn.Linear, QuantLinear)
WEIGHT_INDEXES = (".safetensors.index.json", ".bin.index.json")  # a float component's shards'
SHOWN = 12  # entries a copied / left-out note names before "+N more"


@dataclass
class AscendV1Export:
    """What :func:`export_ascendv1` wrote.

    Attributes:
        path: the output directory.
        components: component name (``""`` for a single model) -> its export, for the
            components written as AscendV1.
        copied: components copied untouched from the source.
        helpers: what was copied from the model directory, relative to it (a folder copied
            whole as ``name/``).
        left_out: what of the model directory no engine reads, so was not copied -> why.
        notes: one line per module not exported in its quantized form, and per caveat; then
            what was copied and what left out.
    """

    path: Path
    components: dict[str, ComponentExport] = field(default_factory=dict)
    copied: list[str] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
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


def _copy_file(path: Path, dst: Path, root: Path, edit: Callable[[str], str] | None = None) -> None:
    """Copy ``path``, a regular file inside the model directory ``root`` (a link inside: the
    file it names), to ``dst`` with a mode no wider than its own (``copyfile`` gave a 0600
    key 0644); ``edit``: the text written instead of the file's own.

    Raises:
        ModelLoadError: a link leading out of ``root``, or no regular file (a FIFO is opened
            without waiting and refused).
    """
    why = escape(path, root)
    if why is not None:
        raise ModelLoadError(refusal(path, why))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as src:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced since it was looked at
            raise ModelLoadError(refusal(path, "is not a regular file"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        with os.fdopen(os.open(dst, flags, stat.S_IMODE(mode) & 0o666), "wb") as out:
            if edit is None:
                shutil.copyfileobj(src, out, 1 << 20)
            else:
                text = src.read().decode("utf-8", "surrogateescape")  # bytes kept as read
                out.write(edit(text).encode("utf-8", "surrogateescape"))


def _copy_helpers(
    files: ModelFiles, cname: str, dst: Path, params_dtype: str | None = None
) -> list[str]:
    """A component written as AscendV1 (``""``: the model itself): its helper files, not its
    float weights (nor their index); returns what was copied, relative to the model directory."""
    done = []
    for path in files.read.get(cname, []):
        name = path.name
        if is_weight(name) or name.endswith(WEIGHT_INDEXES) or name.startswith("quant_model_"):
            continue
        edit = (lambda text: _engine_config(text, params_dtype)) if name == "config.json" else None
        _copy_file(path, dst / name, files.root, edit)
        done.append(path.relative_to(files.root).as_posix())
    return done


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


def _copy_tree(files: ModelFiles, cname: str, dst: Path) -> list[str]:
    """A component copied untouched: the helper and weight files its loader reads."""
    folder = files.root / cname
    why = escape(folder, files.root)
    if why is not None and why != DIRECTORY:
        raise ModelLoadError(refusal(folder, why))
    dst.mkdir(parents=True, exist_ok=True)
    for path in files.read.get(cname, []):
        _copy_file(path, dst / path.name, files.root)
    return [f"{cname}/"]


def _write_component(
    export: ComponentExport,
    files: ModelFiles,
    cname: str,
    dst: Path,
    shard_bytes: int,
    linears: Collection[str] = (),
) -> list[str]:
    dst.mkdir(parents=True, exist_ok=True)
    src = files.root / cname if cname else files.root
    copied = _copy_helpers(files, cname, dst, export.params_dtype if export.int8 else None)
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
    return copied


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
        out: a new or empty directory (see :func:`~opsnn_quant.output.files.empty_dir`).
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
    from opsnn_quant.sources import Source, model_path

    source = source_dir or model_path(adapter.model_id)
    check_model_sources(Source(str(source)))  # the files copied below: before anything is written
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
    files = model_files(source)
    tmp = empty_dir(out)
    if "" not in components:
        result.helpers += _copy_top(files, tmp, list(components))
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
            result.helpers += _copy_tree(files, cname, dst)
            result.copied.append(cname)
            convs = [n for n, r in export.exported_float.items() if r == CONV_REASON]
            export.exported_float = {n: CONV_REASON + " (original float weights: the "
                                     "component is copied from the source)" for n in convs}  # fmt: skip
        else:
            linears = [n for n, m in module.named_modules() if isinstance(m, LINEARS)]
            result.helpers += _write_component(export, files, cname, dst, shard_bytes, linears)
            result.components[cname] = export
        result.notes += _notes(cname, export)
    result.helpers.sort()
    result.left_out = dict(files.left_out)
    result.notes += _copied_notes(result.helpers, result.left_out)
    return result


def _copy_top(files: ModelFiles, tmp: Path, components: list[str]) -> list[str]:
    """A pipeline's top-level helper files (``model_index.json``) and the components its index
    names that are no model modules (tokenizer, scheduler, feature extractor)."""
    done = []
    for path in files.read[""]:
        _copy_file(path, tmp / path.name, files.root)
        done.append(path.name)
    for cname in files.read:
        if cname and cname not in components:
            done += _copy_tree(files, cname, tmp / cname)
    return done


def _copied_notes(copied: list[str], left_out: Mapping[str, str]) -> list[str]:
    """What was copied from the model directory, and what was left out, grouped by why."""
    notes = [f"copied from the model directory: {_listed(copied) or 'nothing'}"]
    by_why: dict[str, list[str]] = {}
    for name, why in left_out.items():
        by_why.setdefault(why, []).append(name)
    if by_why:
        groups = "; ".join(f"{_listed(names)} ({why})" for why, names in sorted(by_why.items()))
        notes.append(f"left out (no engine reads them): {groups}")
    return notes


def _listed(names: Sequence[str]) -> str:
    more = len(names) - SHOWN
    return ", ".join(names[:SHOWN]) + (f", +{more} more" if more > 0 else "")


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
