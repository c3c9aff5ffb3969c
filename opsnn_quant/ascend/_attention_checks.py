"""Argument checks of the fused attention references: the combinations the op docs and tilings allow.

Sources (cited by file and line; op-plugin at commit 517f2e7d, ops-transformer at c29bc106):

- op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_prompt_flash_attention.md`` ("PFA doc"):
  dtypes l.31-42, deq/quant scales l.56-58, ``quant_scale2`` l.59-62, layouts l.73, GQA l.74,
  axis limits l.116-117, int8 combinations l.128-133, int8-output interception l.141-145.
- op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md`` ("FIA
  doc"): axis table and D alignment l.73-80, quant scales l.106-116, key/value shapes l.264-265,
  int8 combinations and layouts l.272-282, D alignment l.400, decode "qkv全int8：不支持" l.429.
- ops-transformer ``attention/prompt_flash_attention/op_host/prompt_flash_attention_tiling.cpp``
  ("PFA tiling"): deq-scale dtype flags l.4098-4102, int8 needs the three scales l.4214-4222,
  int8 with fp16 output refuses ``quant_scale2`` l.4104-4107, empty tensors and int8 l.4192,
  unaligned D limits B to 128 l.5157-5160.
- ops-transformer ``attention/incre_flash_attention/op_host/incre_flash_attention_tiling.cpp``
  ``IFATiling::SetQuantFlag`` l.531-535: an int8 query on the decode (IFA) branch is the MLA
  page-attention NZ mode only.

Every refusal is a one-line :class:`ShapeError`. "The op refuses" and "not supported by the
reference" are worded apart, so a user knows whether torch_npu would have run it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.errors import ShapeError

FLOATS = (torch.float16, torch.bfloat16)
MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)
DEQ_SCALE_DTYPES = (torch.uint64, torch.float32)
MAX_B, MAX_N, MAX_D, MAX_S = 65536, 256, 512, 20971520  # FIA doc l.75-80, PFA doc l.116-117
MAX_GQA_RATIO = 64  # PFA doc l.74
ALIGN_BYTES = 32  # int8 D: FIA doc l.78 and l.400
UNALIGNED_MAX_B = 128  # PFA tiling l.5157-5160, PFA doc l.116
# input_layout -> (layout of query/key/value, layout of the output): PFA doc l.73, FIA doc l.282.
LAYOUTS: dict[str, tuple[str, str]] = {
    "BSH": ("BSH", "BSH"),
    "BSND": ("BSND", "BSND"),
    "BNSD": ("BNSD", "BNSD"),
    "BNSD_BSND": ("BNSD", "BSND"),
}
# Layouts the ops document but the reference does not implement (variable-length and transposed
# outputs need actual_seq_lengths bookkeeping the references leave out).
OTHER_LAYOUTS = ("TND", "NTD", "TND_NTD", "NTD_TND", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD")
# sparse_mode: 0 defaultMask, 1 allMask (reference); 2-4 need the 2048x2048 compressed mask.
# op-plugin FlashAttentionKernelNpuOpApi.cpp l.1010-1014 maps PFA's 10..14 to 0..4 in high precision.
SPARSE_SUPPORTED = (0, 1)
SPARSE_DOCUMENTED = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class AttentionPlan:
    """Shapes and mode of one checked call: batch, heads, sequence lengths, head dim."""

    layout: str  # layout of query/key/value: BSH, BSND or BNSD
    out_layout: str  # layout of the output
    b: int
    n: int
    n_kv: int
    s1: int
    s2: int
    d: int
    int8: bool


def _bnsd_shape(t: torch.Tensor, layout: str, heads: int, name: str, op: str) -> tuple[int, ...]:
    """(B, N, S, D) of ``t`` in ``layout``; ``heads`` splits BSH's H."""
    want = 3 if layout == "BSH" else 4
    if t.dim() != want:
        raise ShapeError(f"{op}: {name} must be {want}-D in layout {layout}, got {tuple(t.shape)}")
    if layout == "BSH":
        b, s, h = t.shape
        if heads <= 0 or h % heads:
            raise ShapeError(f"{op}: {name}'s H={h} is not a multiple of its {heads} heads")
        return b, heads, s, h // heads
    if layout == "BSND":
        b, s, n, d = t.shape
        return b, n, s, d
    return tuple(t.shape)


def check_layout(input_layout: str, op: str) -> tuple[str, str]:
    """(input layout, output layout) of ``input_layout``."""
    if input_layout in LAYOUTS:
        return LAYOUTS[input_layout]
    if input_layout in OTHER_LAYOUTS:
        raise ShapeError(
            f"{op}: input_layout {input_layout!r} is not supported by the reference "
            f"(it implements {', '.join(LAYOUTS)})"
        )
    raise ShapeError(
        f"{op}: input_layout must be one of {', '.join(LAYOUTS)}, got {input_layout!r}"
    )


def check_qkv(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    input_layout: str,
    num_heads: int,
    num_key_value_heads: int,
    op: str,
) -> AttentionPlan:
    """Dtypes, contiguity, layout, heads and axis limits of query/key/value."""
    layout, out_layout = check_layout(input_layout, op)
    for name, t in (("query", query), ("key", key), ("value", value)):
        require_dtype(name, t, (*FLOATS, torch.int8), op)
        if not t.is_contiguous():  # PFA doc l.29-39: "不支持非连续的Tensor"
            raise ShapeError(f"{op}: {name} must be contiguous (the op takes no strided tensors)")
    if not query.dtype == key.dtype == value.dtype:
        raise ShapeError(
            f"{op}: query, key and value must share one dtype, got {query.dtype}, {key.dtype}, "
            f"{value.dtype} (int8 key/value with a float query is KV antiquant, not supported "
            "by the reference)"
        )
    if key.shape != value.shape:  # FIA doc l.265
        raise ShapeError(
            f"{op}: key and value must have the same shape, got {tuple(key.shape)} and "
            f"{tuple(value.shape)}"
        )
    if num_heads <= 0:
        raise ShapeError(f"{op}: num_heads must be positive, got {num_heads}")
    n_kv = num_key_value_heads or num_heads
    if num_key_value_heads < 0 or num_heads % n_kv or num_heads // n_kv > MAX_GQA_RATIO:
        raise ShapeError(
            f"{op}: num_key_value_heads={num_key_value_heads} must divide num_heads={num_heads} "
            f"with a ratio of at most {MAX_GQA_RATIO}"
        )
    b, n, s1, d = _bnsd_shape(query, layout, num_heads, "query", op)
    bk, nk, s2, dk = _bnsd_shape(key, layout, n_kv, "key", op)
    if n != num_heads or nk != n_kv:
        raise ShapeError(
            f"{op}: query has {n} heads and key {nk}, but num_heads={num_heads} and "
            f"num_key_value_heads={num_key_value_heads}"
        )
    if bk != b or dk != d:
        raise ShapeError(
            f"{op}: query {tuple(query.shape)} and key {tuple(key.shape)} differ in batch or "
            f"head dim (layout {layout})"
        )
    if b > MAX_B or n > MAX_N or d > MAX_D or max(s1, s2) > MAX_S:
        raise ShapeError(
            f"{op}: B={b}, N={n}, S={max(s1, s2)}, D={d} exceed the op's limits "
            f"(B <= {MAX_B}, N <= {MAX_N}, S <= {MAX_S}, D <= {MAX_D})"
        )
    int8 = query.dtype == torch.int8
    if int8 and d % ALIGN_BYTES:
        raise ShapeError(
            f"{op}: int8 query/key/value need a head dim aligned to {ALIGN_BYTES} bytes, got D={d}"
        )
    if not int8 and (d * query.element_size()) % ALIGN_BYTES and b > UNALIGNED_MAX_B:
        raise ShapeError(
            f"{op}: a head dim not aligned to {ALIGN_BYTES} bytes (D={d}) allows a batch of at "
            f"most {UNALIGNED_MAX_B}, got B={b}"
        )
    return AttentionPlan(layout, out_layout, b, n, n_kv, s1, s2, d, int8)


def _per_tensor(name: str, t: torch.Tensor, dtypes: Sequence[torch.dtype], op: str) -> None:
    require_dtype(name, t, dtypes, op)
    if t.numel() != 1:
        raise ShapeError(f"{op}: {name} is per-tensor (one element), got shape {tuple(t.shape)}")


def check_quant_scales(
    plan: AttentionPlan,
    deq_scale1: torch.Tensor | None,
    quant_scale1: torch.Tensor | None,
    deq_scale2: torch.Tensor | None,
    quant_scale2: torch.Tensor | None,
    quant_offset2: torch.Tensor | None,
    input_dtype: torch.dtype,
    op: str,
) -> None:
    """The int8 combinations of PFA doc l.128-133 / FIA doc l.272-279 and the scales' forms."""
    full = (deq_scale1, quant_scale1, deq_scale2)
    if plan.int8:
        if any(t is None for t in full):
            raise ShapeError(
                f"{op}: int8 query/key/value need deq_scale1, quant_scale1 and deq_scale2"
            )
        assert deq_scale1 is not None and quant_scale1 is not None and deq_scale2 is not None
        _per_tensor("deq_scale1", deq_scale1, DEQ_SCALE_DTYPES, op)
        _per_tensor("quant_scale1", quant_scale1, (torch.float32,), op)
        _per_tensor("deq_scale2", deq_scale2, DEQ_SCALE_DTYPES, op)
        if deq_scale1.dtype != deq_scale2.dtype:
            # prompt_flash_attention_s1s2_bns1_x910_base.h InitQuant l.1560/1569 reads deq_scale1
            # with deq_scale2's dtype flag and the other way round: mixed forms are misread.
            raise ShapeError(
                f"{op}: deq_scale1 and deq_scale2 must share one form (both uint64 or both "
                "float32): the A2 kernel reads each with the other's dtype"
            )
    elif any(t is not None for t in full):
        raise ShapeError(
            f"{op}: deq_scale1, quant_scale1 and deq_scale2 are for int8 query/key/value only"
        )
    if quant_scale2 is None:
        if quant_offset2 is not None:
            raise ShapeError(f"{op}: quant_offset2 needs quant_scale2 (int8 output)")
        return
    dtypes = (torch.float32, torch.bfloat16) if input_dtype == torch.bfloat16 else (torch.float32,)
    require_dtype("quant_scale2", quant_scale2, dtypes, op)
    channels = plan.n * plan.d
    if quant_scale2.numel() not in (1, channels):
        raise ShapeError(
            f"{op}: quant_scale2 must have 1 or N*D={channels} elements, got shape "
            f"{tuple(quant_scale2.shape)}"
        )
    if quant_scale2.numel() > 1 and plan.d % ALIGN_BYTES:  # PFA doc l.133, int8 output: 1 B/elt
        raise ShapeError(
            f"{op}: a per-channel quant_scale2 needs D aligned to {ALIGN_BYTES} bytes, got {plan.d}"
        )
    if quant_offset2 is not None and (
        quant_offset2.dtype != quant_scale2.dtype or quant_offset2.shape != quant_scale2.shape
    ):
        raise ShapeError(f"{op}: quant_offset2 must have quant_scale2's dtype and shape")


def check_mask(
    plan: AttentionPlan,
    atten_mask: torch.Tensor | None,
    sparse_mode: int,
    op: str,
) -> None:
    """``atten_mask`` dtype/shape (PFA doc l.51, FIA doc l.98) and ``sparse_mode`` (l.79-85)."""
    if sparse_mode not in SPARSE_DOCUMENTED:
        raise ShapeError(f"{op}: sparse_mode must be 0 to 4, got {sparse_mode}")
    if sparse_mode not in SPARSE_SUPPORTED:
        raise ShapeError(
            f"{op}: sparse_mode={sparse_mode} (compressed 2048x2048 causal/band mask) is not "
            "supported by the reference; pass the full mask with sparse_mode 0 or 1"
        )
    if atten_mask is None:
        if sparse_mode == 1:
            raise ShapeError(f"{op}: sparse_mode=1 (allMask) needs atten_mask")
        return
    require_dtype("atten_mask", atten_mask, MASK_DTYPES, op)
    b, s1, s2 = plan.b, plan.s1, plan.s2
    allowed = {(s1, s2), (1, s1, s2), (b, s1, s2), (b, 1, s1, s2), (1, 1, s1, s2)}
    if plan.s1 == 1:
        allowed.add((b, s2))  # FIA doc l.98: Q_S = 1 takes (B, KV_S)
    if tuple(atten_mask.shape) not in allowed:
        raise ShapeError(
            f"{op}: atten_mask shape {tuple(atten_mask.shape)} is not one of "
            f"(S1, S2), (1, S1, S2), (B, S1, S2), (B, 1, S1, S2), (1, 1, S1, S2) with "
            f"B={b}, S1={s1}, S2={s2}"
        )


def check_int8_output_rows(
    plan: AttentionPlan,
    atten_mask: torch.Tensor | None,
    sparse_mode: int,
    pre_tokens: int,
    next_tokens: int,
    quant_offset2: torch.Tensor | None,
    op: str,
) -> None:
    """PFA doc l.141-143: an int8 output with ``quant_offset2`` is refused when sparse_mode 0
    leaves whole rows out (``S1 - S2 - pre_tokens > 0`` or ``next_tokens < 0``)."""
    if quant_offset2 is None or atten_mask is None or sparse_mode != 0:
        return
    if plan.s1 - plan.s2 - pre_tokens > 0 or next_tokens < 0:
        raise ShapeError(
            f"{op}: int8 output with quant_offset2 is refused when pre_tokens={pre_tokens} / "
            f"next_tokens={next_tokens} leave rows of the {plan.s1}x{plan.s2} scores uncomputed"
        )


def check_unused(op: str, **args: object) -> None:
    """Arguments the reference does not implement must be left at their defaults (None, 0,
    False): each one names itself in the message."""
    for name, value in args.items():
        if value is None or value is False or (isinstance(value, int) and value == 0):
            continue
        raise ShapeError(f"{op}: {name} is not supported by the reference; leave it unset")
