"""The AscendV1 tensor contract: file names, quant types, and the tensors of each quantized Linear.

AscendV1 is msModelSlim's deployable format (``quant_model_description.json`` +
``quant_model_weights.safetensors``), documented in msModelSlim
``docs/zh/user_guide/quantization_formats/ascendv1.md`` and written by
``msmodelslim/core/quant_service/modelslim_v1/save/ascendv1.py`` (``AscendV1Saver``). The tensors
per Linear are the ones the engines declare: vLLM-Ascend ``vllm_ascend/quantization/methods/
w8a8_static.py`` (``AscendW8A8LinearMethod``), ``w8a8_dynamic.py``, ``w8a16.py``; SGLang
``layers/quantization/modelslim/schemes/modelslim_w8a8_int8.py``; MindIE-LLM
``atb_llm/utils/quantize/w8a8.py``, ``w8a16.py``, ``w4a16.py``.

Per Linear of ``n`` outputs and ``k`` inputs (``G`` = the global ``group_size``):

==============  =============================  ===============================================
type            tensor (``<linear>.<suffix>``)  dtype, shape
==============  =============================  ===============================================
W8A8            weight                         int8 [n, k]
                input_scale, input_offset      float [1] (offset: integer values; int8 too)
                quant_bias                     int32 [n]
                deq_scale                      int64 [n] (fp16 model) or float32 [n] (bf16)
                weight_scale, weight_offset    float [n, 1], optional (v0 and vLLM declare them)
W8A8_MIX        the W8A8 set, weight_scale and weight_offset required
W8A8_DYNAMIC    weight                         int8 [n, k]
                weight_scale, weight_offset    float [n, 1]
W8A16           weight                         int8 [n, k]
                weight_scale, weight_offset    float [n, 1] or [n, k / G]
W4A16           weight                         int8 [n, k / 2] (per channel) or [n / 2, k]
                                               (per group): two int4 values per byte
                weight_scale, weight_offset    float [n, 1] or [n, k / G]
any             bias                           float [n], optional, tagged ``FLOAT``
==============  =============================  ===============================================

Where the sources disagree we follow msModelSlim's v1 saver code (see DESIGN notes in each
rule): input scales are float32 (the v0 doc says fp16/bf16; both are read); W8A8 weight scales
are written although the v1 saver omits them (vLLM and SGLang declare them; the issue asks for
them); W4A16 is a v0-only type (``_w4a16_pack_int4`` in msModelSlim's ``complex_quantifier.py``),
read as MindIE-LLM's ``W4A16LinearStatic`` reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from opsnn_quant.errors import CheckpointError

DESCRIPTION_FILE = "quant_model_description.json"
WEIGHTS_FILE = "quant_model_weights.safetensors"
WEIGHTS_PREFIX = "quant_model_weights"
INDEX_FILE = f"{WEIGHTS_FILE}.index.json"
VERSION = "1.0.0"  # AscendV1Saver.post_run always writes "1.0.0"

# AscendV1Saver.QUANT_TYPE_PRIORITY (later wins): model_quant_type is the highest type present.
# W4A8_DYNAMIC is deliberately absent there (a code comment: it never becomes the model type).
QUANT_TYPE_PRIORITY: tuple[str, ...] = (
    "FLOAT", "W16A16S", "W8A16", "W8A8_DYNAMIC", "W8A8_MIX", "W8A8", "WFP8AFP8_DYNAMIC",
    "W8A8_MXFP8", "W4A8_MXFP", "W4A4_DYNAMIC", "W4A4_MXFP4", "W4A4_MXFP4_DUALSCALE",
    "W4A4_MXFP4_SVD",
)  # fmt: skip
# W4A16 is v0-only (QuantType of llm_ptq_utils.py); it ranks as the weight-only type it is.
_RANK = {t: i for i, t in enumerate(QUANT_TYPE_PRIORITY)} | {"W4A16": 1.5}
# Every type string the format documents (ascendv1.md enum + the v0 QuantType enum).
KNOWN_TYPES = frozenset(QUANT_TYPE_PRIORITY) | frozenset(
    {"W4A8_DYNAMIC", "W4A16", "W8A8S", "W8A8SC", "C8", "FAQuant", "NF4", "W8A8_TIMESTEP",
     "W4A4_FLATQUANT_DYNAMIC", "W16A16SC", "FAKQuant"}
)  # fmt: skip
# Keys of the description that are not tensor names (AscendV1Saver.post_run, json_append).
GLOBAL_KEYS = frozenset(
    {"version", "model_quant_type", "group_size", "metadata", "optional", "kv_cache_type",
     "kv_quant_type", "fa_quant_type", "reduce_quant_type"}
)  # fmt: skip
# The types this package's consumer runs (the others are refused with a one-line reason).
SUPPORTED_TYPES = ("FLOAT", "W8A8", "W8A8_MIX", "W8A8_DYNAMIC", "W8A16", "W4A16")

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_INPUT_OFFSET = (*_FLOATS, torch.int8)  # vLLM declares input_offset int8; the v1 saver writes fp32


class AscendV1Error(CheckpointError):
    """A directory that is not a valid AscendV1 model (one line, naming the tensor or file)."""


@dataclass(frozen=True)
class Rule:
    """One tensor of a quantized Linear: allowed dtypes, shape kind, and whether it is required.

    ``shape`` kinds: ``nk`` [n, k]; ``n`` [n]; ``one`` one element ([1], or [] as msModelSlim
    unsqueezes 0-d scalars); ``n1`` [n, 1]; ``n1_or_groups`` [n, 1] or [n, k / G];
    ``w4`` the packed int4 weight.
    """

    dtypes: tuple[torch.dtype, ...]
    shape: str
    required: bool = True


_BIAS = Rule(_FLOATS, "n", required=False)
_W8A8 = {
    "weight": Rule((torch.int8,), "nk"),
    "input_scale": Rule(_FLOATS, "one"),
    "input_offset": Rule(_INPUT_OFFSET, "one"),
    "quant_bias": Rule((torch.int32,), "n"),
    "deq_scale": Rule((torch.int64, torch.float32), "n"),
    "weight_scale": Rule(_FLOATS, "n1", required=False),
    "weight_offset": Rule(_FLOATS, "n1", required=False),
    "bias": _BIAS,
}
CONTRACT: dict[str, dict[str, Rule]] = {
    "W8A8": _W8A8,
    "W8A8_MIX": _W8A8 | {"weight_scale": Rule(_FLOATS, "n1"), "weight_offset": Rule(_FLOATS, "n1")},
    "W8A8_DYNAMIC": {
        "weight": Rule((torch.int8,), "nk"),
        "weight_scale": Rule(_FLOATS, "n1"),
        "weight_offset": Rule(_FLOATS, "n1"),
        "bias": _BIAS,
    },
    "W8A16": {
        "weight": Rule((torch.int8,), "nk"),
        "weight_scale": Rule(_FLOATS, "n1_or_groups"),
        "weight_offset": Rule(_FLOATS, "n1_or_groups"),
        "bias": _BIAS,
    },
    "W4A16": {
        "weight": Rule((torch.int8,), "w4"),
        "weight_scale": Rule(_FLOATS, "n1_or_groups"),
        "weight_offset": Rule(_FLOATS, "n1_or_groups", required=False),
        "bias": _BIAS,
    },
}


def model_quant_type(types: Iterable[str]) -> str:
    """The description's ``model_quant_type``: the highest-priority type present (msModelSlim's
    ``update_quant_type`` ignores types outside its list; ``Unknown`` when none is in it)."""
    ranked = [t for t in types if t in _RANK]
    return max(ranked, key=_RANK.__getitem__) if ranked else "Unknown"


def linear_prefixes(description: Mapping[str, object]) -> dict[str, str]:
    """Quantized Linear prefix -> its type, from the ``<prefix>.weight`` entries (as vLLM-Ascend's
    ``get_linear_quant_type`` reads ``quant_description[prefix + ".weight"]``)."""
    out: dict[str, str] = {}
    for key, value in description.items():
        if key.endswith(".weight") and isinstance(value, str) and value != "FLOAT":
            out[key.removesuffix(".weight")] = value
    return out


def _expect(rule: Rule, n: int, k: int, group: int) -> str:
    """Words for the shapes ``rule`` allows (for messages)."""
    if rule.shape == "nk":
        return f"[{n}, {k}]"
    if rule.shape == "n":
        return f"[{n}]"
    if rule.shape == "one":
        return "[1]"
    if rule.shape == "n1":
        return f"[{n}, 1]"
    if rule.shape == "w4":
        return f"[{n}, {k // 2}] (per channel) or [{n // 2}, {k}] (per group)"
    groups = f" or [{n}, {k // group}]" if group else ""
    return f"[{n}, 1]{groups}"


def _shape_ok(
    rule: Rule, shape: tuple[int, ...], n: int, k: int, group: int, per_group: bool
) -> bool:
    if rule.shape == "nk":
        return shape == (n, k)
    if rule.shape == "n":
        return shape == (n,)
    if rule.shape == "one":
        return shape in ((1,), ())
    if rule.shape == "n1":
        return shape == (n, 1)
    if rule.shape == "w4":  # msModelSlim: per-channel packs along k, per-group along n
        return shape == ((n // 2, k) if per_group else (n, k // 2))
    if per_group:
        return group > 0 and k % group == 0 and shape == (n, k // group)
    return shape == (n, 1)


def check_linear(
    prefix: str,
    qtype: str,
    tensors: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    group_size: int,
) -> tuple[int, int]:
    """Check one quantized Linear's tensors against :data:`CONTRACT`; returns ``(n, k)``.

    Args:
        prefix: the Linear's name.
        qtype: its type (a key of :data:`CONTRACT`).
        tensors: suffix -> (dtype, shape) of every tensor under ``prefix`` in the checkpoint.
        group_size: the description's ``group_size`` (0: none).

    Raises:
        AscendV1Error: a missing or unexpected tensor, or a dtype/shape the contract forbids.
    """
    rules = CONTRACT[qtype]
    for suffix, rule in rules.items():
        if rule.required and suffix not in tensors:
            raise AscendV1Error(f"{prefix}.{suffix}: missing ({qtype} needs it)")
    extra = sorted(set(tensors) - set(rules))
    if extra:
        raise AscendV1Error(f"{prefix}.{extra[0]}: not a tensor of a {qtype} Linear")
    w_shape = tensors["weight"][1]
    if len(w_shape) != 2:
        raise AscendV1Error(f"{prefix}.weight: a Linear weight is 2-D, got {list(w_shape)}")
    scale_shape = tensors["weight_scale"][1] if "weight_scale" in tensors else None
    per_group = scale_shape is not None and len(scale_shape) == 2 and scale_shape[1] != 1
    n, k = w_shape
    if per_group and qtype in ("W8A8", "W8A8_MIX", "W8A8_DYNAMIC"):
        # msModelSlim has per-group W8A8_DYNAMIC, but npu_quant_matmul's int8 modes on A2/A3
        # take per-channel weight scales only (the engines' Linear methods declare [n, 1]).
        raise AscendV1Error(f"{prefix}.weight_scale: per-group scales are not allowed for {qtype}")
    if qtype == "W4A16":  # unpack the weight's shape first
        n, k = (2 * n, k) if per_group else (n, 2 * k)
    for suffix, (dtype, shape) in tensors.items():
        rule = rules[suffix]
        if dtype not in rule.dtypes:
            allowed = "/".join(str(d).removeprefix("torch.") for d in rule.dtypes)
            raise AscendV1Error(
                f"{prefix}.{suffix}: dtype {str(dtype).removeprefix('torch.')} is not allowed "
                f"for {qtype} ({allowed})"
            )
        if not _shape_ok(rule, tuple(shape), n, k, group_size, per_group):
            want = _expect(rule, n, k, group_size)
            raise AscendV1Error(
                f"{prefix}.{suffix}: shape {list(shape)} does not fit a {qtype} Linear "
                f"of {n} outputs and {k} inputs (expected {want})"
            )
    return n, k
