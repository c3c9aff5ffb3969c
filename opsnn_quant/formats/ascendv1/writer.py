"""The AscendV1 tensors and description of one model component holding our quantized modules.

Per quantized module (see :mod:`opsnn_quant.formats.ascendv1.contract` for the table):

* ``QuantLinear`` W8A8 -> ``W8A8``: our int8 weight, ``quant_bias`` (the int32 bias with the
  asymmetric offset folded, as msModelSlim's ``change_bias``), ``deq_scale`` as msModelSlim's
  ``deqscale2int64_by_dtype`` writes it (``save/utils/deqscale.py``: a float16 model's int64
  holds the plain fp32 bits, the kernel keeps their top 19; bf16: fp32), ``input_scale`` [1]
  (in the params dtype for a module made for vLLM-Ascend, as its loader declares it; fp32
  otherwise) and ``input_offset`` fp32 [1], ``weight_scale`` fp32 [n, 1] and zero
  ``weight_offset``.
* W8A8_DYNAMIC -> ``W8A8_DYNAMIC`` (weight, weight_scale, weight_offset, bias); W8A16 ->
  ``W8A16``; a module whose precision is ``w4a16`` -> ``W4A16`` (:func:`w4a16_tensors`).
* Anything AscendV1 cannot express is written ``FLOAT`` with its dequantized weight (what our
  int8 weight means) and the reason: Conv2d (the engines quantize Linear only: msModelSlim's
  ``linear_quant`` wraps ``nn.Linear``, MindIE-SD replaces ``nn.Linear``), SmoothQuant without a
  producer to fold into, an output dtype other than the component's.

The engines compute ``1 / input_scale``; we store our multiplier ``1 / s`` (rounded once from the
observer's float64 scale). :func:`engine_input_scale` picks the fp32 ``input_scale`` whose fp32
reciprocal is exactly our multiplier when one exists (about 9 in 10 do); the others are listed.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from opsnn_quant.folding.fold_check import Fold, dequantized_weight, effective_bias
from opsnn_quant.formats.ascendv1.contract import VERSION, model_quant_type
from opsnn_quant.formats.safetensors_io import LazyTensor, Tensorish
from opsnn_quant.models.offload import BlockOffload
from opsnn_quant.quant.engine import TORCH_DTYPES, deqscale2int64
from opsnn_quant.quant.engines import VLLM_ASCEND
from opsnn_quant.quant.modules import QuantLinear, QuantModule
from opsnn_quant.types import Precision
from opsnn_quant.version import __version__

_QTYPES = {Precision.W8A8: "W8A8", Precision.W8A8_DYNAMIC: "W8A8_DYNAMIC", Precision.W8A16: "W8A16"}
CONV_REASON = "a quantized Conv2d: AscendV1 engines quantize Linear layers only"


@dataclass
class ComponentExport:
    """What :func:`component_export` produced.

    Attributes:
        tensors: tensor name -> tensor (names relative to the component); derived float
            weights are :class:`~opsnn_quant.formats.safetensors_io.LazyTensor`.
        description: the ``quant_model_description.json`` object.
        exported_float: quantized module -> why it is written FLOAT.
        inexact_input_scale: W8A8 modules whose multiplier no fp32 ``input_scale`` reproduces.
        params_dtype: ``float16`` or ``bfloat16``.
        int8: the quantized modules written in a quantized form (module names).
    """

    tensors: dict[str, Tensorish]
    description: dict[str, Any]
    exported_float: dict[str, str] = field(default_factory=dict)
    inexact_input_scale: list[str] = field(default_factory=list)
    params_dtype: str = "float16"
    int8: list[str] = field(default_factory=list)


# AscendV1 holds one static input_scale per Linear; a per-step-group table has no place there.
TIMESTEP_REASON = (
    "w8a8_timestep: AscendV1 has one static input_scale per Linear, no per-step table "
    "(quant/model.safetensors holds it)"
)


def engine_input_scale(inv_scale: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The fp32 ``input_scale`` [1] whose fp32 reciprocal (the engines' ``1 / input_scale``)
    equals our multiplier ``inv_scale`` [1]; ``(closest, False)`` when none does."""
    inv = inv_scale.reshape(1).to(torch.float32)
    start = (1.0 / inv.double()).float().view(torch.int32)
    best, best_err = start.view(torch.float32), float("inf")
    for step in (0, -1, 1, -2, 2, -3, 3, -4, 4):
        cand = (start + step).view(torch.float32)
        got = 1.0 / cand
        if torch.equal(got, inv):
            return cand, True
        err = abs(float(got.double() - inv.double()))
        if err < best_err:
            best, best_err = cand, err
    return best, False


def w4a16_tensors(
    values: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """AscendV1 W4A16 tensors of int4 ``values`` [n, k] with ``scale`` [n, 1] or [n, k / G].

    Packing as msModelSlim's ``_w4a16_pack_int4`` (``complex_quantifier.py``): two values per
    int8, the first in the low nibble; along k for per-channel scales (weight [n, k / 2]), along
    n for per-group ones (weight [n / 2, k]). ``offset`` is the zero point (default zeros).
    """
    v = values.to(torch.int16)
    per_group = scale.dim() == 2 and scale.shape[1] != 1
    if per_group:
        pairs = v.reshape(-1, 2, v.shape[1])  # rows 2i, 2i+1
        low, high = pairs[:, 0], pairs[:, 1]
    else:
        pairs = v.reshape(v.shape[0], -1, 2)
        low, high = pairs[..., 0], pairs[..., 1]
    packed = ((high << 4) | (low & 0x0F)).to(torch.int16)
    packed = torch.where(packed >= 128, packed - 256, packed).to(torch.int8)
    s = scale.to(torch.float32).reshape(scale.shape[0], -1)
    off = torch.zeros_like(s) if offset is None else offset.to(torch.float32).reshape(s.shape)
    return {"weight": packed, "weight_scale": s, "weight_offset": off}


def _precision(module: QuantModule[Any]) -> str:
    return str(getattr(module.spec.precision, "value", module.spec.precision))


def _w4a16_of(module: QuantModule[Any]) -> dict[str, torch.Tensor]:
    """W4A16 tensors of a w4a16 module (int4 values in ``weight``: int8, or int32 holding eight
    as :func:`opsnn_quant.ascend.pack_int4` does; scales (n,) or (n, groups))."""
    from opsnn_quant.ascend import unpack_int4

    w = module.weight
    values = unpack_int4(w) if w.dtype == torch.int32 else w
    values = values.reshape(module.out_n, module.in_k)
    scale = module.weight_quantizer.scale.reshape(module.out_n, -1)
    offset = getattr(module.weight_quantizer, "offset", None)
    return w4a16_tensors(values, scale, offset)


def _quant_tensors(
    module: QuantModule[Any], qtype: str, params_dtype: str, folded: bool, had_bias: bool
) -> tuple[dict[str, torch.Tensor], bool]:
    """(suffix -> tensor, input scale exact) of one exportable quantized Linear."""
    n = module.out_n
    if qtype == "W4A16":
        t = _w4a16_of(module)
    else:
        s_w = module.weight_quantizer.scale.to(torch.float32).reshape(n, 1)
        t = {"weight": module.weight.reshape(n, -1), "weight_scale": s_w,
             "weight_offset": torch.zeros_like(s_w)}  # fmt: skip
    exact = True
    if qtype == "W8A8":
        iq = module.input_quantizer
        if module.spec.engine_def is VLLM_ASCEND:  # the scale the engine holds, in its dtype
            scale = iq.scale.reshape(1).to(TORCH_DTYPES[params_dtype])
        elif folded:  # the factor went into the producer: the per-tensor part of the multiplier
            scale = iq.scale.reshape(1).to(torch.float32)
        else:
            scale, exact = engine_input_scale(iq.inv_scale)
        t["input_scale"] = scale
        t["input_offset"] = iq.offset.reshape(1).to(torch.float32)
        t["quant_bias"] = module.quant_bias
        # a float16 model's int64 deq_scale: the fp32 bits, as msModelSlim's deqscale2int64
        t["deq_scale"] = (
            deqscale2int64(module.deq_scale) if params_dtype == "float16" else module.deq_scale
        )
    bias = effective_bias(module)
    if bias is not None and had_bias:
        t["bias"] = bias
    return {k: v.detach().cpu().contiguous() for k, v in t.items()}, exact


def _float_tensors(
    module: QuantModule[Any], dtype: torch.dtype, had_bias: bool
) -> dict[str, Tensorish]:
    """FLOAT weight (dequantized, SmoothQuant undone; made when written) and bias of a module
    AscendV1 cannot hold."""
    scale_shape = (-1, *[1] * (module.weight.dim() - 1))
    shapes = [module.weight.shape, module.weight_quantizer.scale.reshape(scale_shape).shape]
    smooth = getattr(module.input_quantizer, "smooth", None)
    if smooth is not None:
        shapes.append(smooth.reshape(1, -1).shape)
    out: dict[str, Tensorish] = {
        "weight": LazyTensor(dtype, tuple(torch.broadcast_shapes(*shapes)),
                             partial(_float_weight, module, dtype))
    }  # fmt: skip
    bias = effective_bias(module)
    if bias is not None and had_bias:
        out["bias"] = bias.to(dtype)
    return out


def _float_weight(module: QuantModule[Any], dtype: torch.dtype) -> torch.Tensor:
    return dequantized_weight(module).to(dtype)


def _params_dtype(linears: Mapping[str, QuantModule[Any]]) -> str:
    """The component's engine dtype: the output dtype most of its quantized Linears use."""
    counts: Counter[str] = Counter(m.spec.output_dtype for m in linears.values())
    return max(("float16", "bfloat16"), key=lambda d: (counts[d], d == "float16"))


def component_export(
    component: nn.Module,
    *,
    folds: list[Fold],
    refused: Mapping[str, str],
    source_keys: set[str] | None,
    source_model: str | None = None,
    off: BlockOffload | None = None,
    prefix: str = "",
) -> ComponentExport:
    """AscendV1 tensors + description of ``component`` (names relative to it).

    Args:
        component: a module holding frozen quantized modules (and float ones).
        folds: SmoothQuant folds of its modules (component-relative names).
        refused: smoothed module -> why no fold was found (written FLOAT).
        source_keys: tensor names of the float model's checkpoint files. They give the names
            written (the engines look tensors up by the checkpoint's names, which a library may
            load under other module names: see :func:`checkpoint_prefix`) and whether a Linear
            has a bias (our static modules fold it away); None: the module names, and a
            non-zero int32 bias taken as one.
        source_model: the float model's id, recorded in ``metadata.opsnn_quant``.
        off: the model's offloader (``--max-memory``, no folds): each block is opened in turn,
            and what is taken from its tensors is read again from its file when written
            (:class:`~opsnn_quant.formats.safetensors_io.LazyTensor`).
        prefix: the component's name in the offloaded model, with its dot ("" for the model).
    """
    assert off is None or not folds, "folds are written with every block loaded"
    qmods = {n: m for n, m in component.named_modules() if isinstance(m, QuantModule)}
    linears = {n: m for n, m in qmods.items() if type(m) is QuantLinear or _precision(m) == "w4a16"}
    params = _params_dtype(linears) if linears else "float16"
    folded = {c: f for f in folds for c in f.consumers}
    state = {k: v for k, v in component.state_dict().items()
             if not any(k.startswith(f"{q}.") for q in qmods)}  # fmt: skip
    model_dtype = _model_dtype(state)
    where = prefix
    if off is not None:
        tensors: dict[str, Tensorish] = {
            k: LazyTensor(v.dtype, tuple(v.shape), partial(_stored, off, where + k))
            if off.owner(where + k) is not None
            else v.detach().cpu()
            for k, v in state.items()
        }
        types = dict.fromkeys(tensors, "FLOAT")
    else:
        floats, types = _float_state(state)
        _apply_folds(floats, folds)
        tensors = dict(floats)
    del state
    prefix = checkpoint_prefix(set(component.state_dict()), source_keys)
    out = ComponentExport({}, {}, params_dtype=params)
    with off.window() if off is not None else contextlib.nullcontext():
        for name, module in qmods.items():
            if off is not None:
                off.touch(where + name)
            _export_module(out, tensors, types, name, module, linears, params, folded,
                           refused, prefix, source_keys, model_dtype, off, where)  # fmt: skip
    out.tensors = {prefix + k: v for k, v in tensors.items()}
    types = {prefix + k: v for k, v in types.items()}
    out.description = _description(types, out, folds, source_model)
    return out


def _stored(off: BlockOffload, name: str) -> torch.Tensor:
    return off.stored(name).cpu().contiguous()


def _deferred(off: BlockOffload | None, where: str, t: Tensorish) -> Tensorish:
    """``t``, or where it is a view of an offloaded block's tensor (or a derived weight made
    when written), a lazy tensor that reads it again when written."""
    if off is None:
        return t
    if isinstance(t, LazyTensor):  # made from the module's weights: its block opened then
        return LazyTensor(t.dtype, t.shape, partial(_opened, off, where, t.make))
    make = off.deferred(t)
    return t if make is None else LazyTensor(t.dtype, tuple(t.shape), make)


def _opened(off: BlockOffload, name: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    with off.opened(name):
        return make()


def _export_module(
    out: ComponentExport,
    tensors: dict[str, Tensorish],
    types: dict[str, str],
    name: str,
    module: QuantModule[Any],
    linears: Mapping[str, QuantModule[Any]],
    params: str,
    folded: Mapping[str, Fold],
    refused: Mapping[str, str],
    prefix: str,
    source_keys: set[str] | None,
    model_dtype: torch.dtype,
    off: BlockOffload | None,
    where: str,
) -> None:
    had_bias = _had_bias(prefix + name, module, source_keys)
    qtype = "W4A16" if _precision(module) == "w4a16" else _QTYPES.get(module.spec.precision)
    reason = None
    part: Mapping[str, Tensorish]
    if name not in linears or qtype is None:
        reason = (
            CONV_REASON if name not in linears else f"{_precision(module)} has no AscendV1 form"
        )
    elif getattr(module.spec, "timestep_bounds", None):
        reason = TIMESTEP_REASON
    elif module.spec.output_dtype != params:
        reason = f"output dtype {module.spec.output_dtype}, but the component's is {params}"
    elif getattr(module.input_quantizer, "smooth", None) is not None and name not in folded:
        reason = "SmoothQuant: " + refused.get(name, "no producer to fold its factor into")
    if reason is not None:
        out.exported_float[name] = reason
        part = _float_tensors(module, model_dtype, had_bias)
        suffix_types = dict.fromkeys(part, "FLOAT")
    else:
        assert qtype is not None
        part, exact = _quant_tensors(module, qtype, params, name in folded, had_bias)
        out.int8.append(name)
        if not exact:
            out.inexact_input_scale.append(name)
        suffix_types = {s: ("FLOAT" if s == "bias" else qtype) for s in part}
    for suffix, t in part.items():
        tensors[f"{name}.{suffix}"] = _deferred(off, where + name, t)
        types[f"{name}.{suffix}"] = suffix_types[suffix]


def checkpoint_prefix(state_keys: set[str], source_keys: set[str] | None) -> str:
    """The prefix the float checkpoint puts before the module's ``state_dict`` names ("" when
    they match): transformers 5 loads a CLIP text encoder's ``text_model.encoder...`` tensors as
    ``encoder...``; the engines read the checkpoint's names."""
    if not source_keys:
        return ""
    best, hits = "", sum(k in source_keys for k in state_keys)
    tried: set[str] = set()
    for src in sorted(source_keys):
        if hits * 2 > len(state_keys):
            break
        parts = src.split(".")
        for i in range(1, len(parts)):
            p = ".".join(parts[:i]) + "."
            if p in tried or ".".join(parts[i:]) not in state_keys:
                continue
            tried.add(p)
            n = sum(p + k in source_keys for k in state_keys)
            if n > hits:
                best, hits = p, n
    return best


def _model_dtype(state: Mapping[str, torch.Tensor]) -> torch.dtype:
    floats = Counter(t.dtype for t in state.values() if t.is_floating_point())
    return floats.most_common(1)[0][0] if floats else torch.float32


def _float_state(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """FLOAT tensors; tied ones are written twice (as msModelSlim does): the writer copies
    bytes, so they need no copy here."""
    tensors = {k: v.detach().cpu() for k, v in state.items()}
    return tensors, dict.fromkeys(tensors, "FLOAT")


def _apply_folds(tensors: dict[str, torch.Tensor], folds: list[Fold]) -> None:
    for fold in folds:
        s = fold.factor.to(torch.float64)
        for suffix in ("weight", "bias"):
            key = f"{fold.producer}.{suffix}"
            if key in tensors:
                t = tensors[key]
                tensors[key] = (t.double() / s.reshape(-1, *[1] * (t.dim() - 1))).to(t.dtype)
        for name in fold.compensated:
            t = tensors[f"{name}.weight"]
            tensors[f"{name}.weight"] = (t.double() * s.reshape(1, -1)).to(t.dtype)


def _had_bias(name: str, module: QuantModule[Any], source_keys: set[str] | None) -> bool:
    if source_keys is not None and f"{name}.weight" in source_keys:
        return f"{name}.bias" in source_keys
    if not module.spec.static_activations:
        return module.bias is not None
    b = effective_bias(module)
    return b is not None and bool(b.ne(0).any())


def _description(
    types: dict[str, str], out: ComponentExport, folds: list[Fold], source: str | None
) -> dict[str, Any]:
    meta = {
        "opsnn_quant": {
            "version": __version__,
            "source_model": source,
            "params_dtype": out.params_dtype,
            "exported_float": dict(sorted(out.exported_float.items())),
            "smoothquant_folded_into": {c: f.producer for f in folds for c in f.consumers},
            "input_scale_inexact": sorted(out.inexact_input_scale),
        }
    }
    group = 0
    for name, t in out.tensors.items():
        if name.endswith(".weight_scale") and types[name] in ("W8A16", "W4A16") and t.shape[1] != 1:
            # per group the weight keeps all k columns ([n, k], or [n / 2, k] packed int4)
            group = out.tensors[name.removesuffix("_scale")].shape[1] // t.shape[1]
    # AscendV1Saver.post_run appends these last, in this order (ascendv1.py lines 209-238)
    return {
        **dict(sorted(types.items())),
        "version": VERSION,
        "model_quant_type": model_quant_type(types.values()),
        "metadata": meta,
        "group_size": group,
        "optional": {},
    }
