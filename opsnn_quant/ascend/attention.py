"""Fused attention of Atlas A2 with int8 Q/K/V: ``npu_prompt_flash_attention`` (PFA) and
``npu_fused_infer_attention_score`` (FIA, and its ``_v2``).

Sources: op-plugin (commit 517f2e7d) ``docs/zh/custom_APIs/torch_npu/``:
``torch_npu-npu_prompt_flash_attention.md`` ("PFA doc"),
``torch_npu-npu_fused_infer_attention_score.md`` ("FIA doc") and its ``_v2.md`` ("v2 doc");
``op_plugin/ops/opapi/FlashAttentionKernelNpuOpApi.cpp`` and
``FusedInferAttentionScoreKernelNpuOpApi.cpp``; ops-transformer (commit c29bc106) kernels and
tilings under ``attention/``; CANN 8.1.RC1 AscendC high-level API implementations. The argument
checks and their citations are in :mod:`opsnn_quant.ascend._attention_checks`.

**Which chip runs which.** Atlas A2 (910B) and A3 run PFA and FIA with int8 query/key/value and
per-tensor ``deq_scale1`` / ``quant_scale1`` / ``deq_scale2`` (PFA doc l.7-9, l.31, l.56-58; FIA
doc l.7-8). Atlas 300I/310P ("Atlas 推理系列加速卡产品") runs PFA with float16 only and takes none
of the quantization arguments (PFA doc l.9, l.30, l.56-58); it has no FIA. Atlas 800T/910A
("Atlas 训练系列产品") is in neither op's product table: no fused inference attention, so its
attention stays float (unfused matmuls). FIA-v2 (A2/A3) takes int8 query/key/value only in its MLA
full-quant mode (below); its FP8/MX block modes (``query_quant_mode`` 6-8, ``float8_e4m3fn``
query/key/value, as MindIE-SD 3.1.0's ``FP8RotateQuantFA`` / ``MXFP8RotateQuantFA`` call it in
``mindiesd/quantization/layer.py`` l.456-574) need FP8 hardware (Ascend 950): out of scope here.

**The int8 path** (query/key/value int8, Q_S > 1; FIA runs the PFA kernel for Q_S > 1,
``attention/fused_infer_attention_score/op_kernel/fused_infer_attention_score.cpp`` l.23-24, l.48).
The A2 kernel is ``PromptFlashAttentionS1s2Bns1X910`` in high-performance mode, whose int8 type traits
compute in float16 (ops-transformer ``attention/prompt_flash_attention/op_kernel/
prompt_flash_attention_base.h`` l.82-90: mmOutputType = softmaxType = half). Per (batch, head),
over blocks of keys (the int8 S2 tile, :func:`int8_kv_block`: 1024, or 2048 for Q_S <= 16 with a
long KV and no mask), with ``x910.h`` = ``op_kernel/prompt_flash_attention_s1s2_bns1_x910.h`` and
``x910_base.h`` = ``..._x910_base.h``::

    S   = fp16(fp32(Q @ K_blk^T) * fp19(deq_scale1))   # Cube int32, fixpipe DEQF16 (x910.h l.463)
    S   = fp16(S * fp16(scale_value))                   # Muls in half (x910.h l.563-564)
    S   = where(mask, -65504, S)                        # SelectWithBytesMask, 0xFBFF (x910_base.h l.1247-1273)
    m'  = max(m, rowmax(fp32(S)))                       # SoftmaxFlashV2, half in / fp32 max, sum
    E   = exp(fp32(S) - m');  P = fp16_away(E)          # FLOAT2HALF_ROUND_MODE = CAST_ROUND on v220
    l'  = exp(m - m') * l + rowsum(E)                   # fp32 (softmax_flashv2_update_impl.h)
    Pq  = sat_rint(fp16(P * fp16(quant_scale1)))        # AscendQuant on half (x910.h l.678)
    Oc  = fp16(fp32(Pq @ V_blk) * fp19(deq_scale2))     # Cube int32, fixpipe DEQF16 (x910.h l.782)
    O   = fp16(fp16(O * fp16_away(exp(m - m'))) + Oc)   # UpdateVmul, Bmm2UpdateAdd (x910_base.h l.2116-2146)
    out = fp16(O / fp16_away(l))                        # Bmm2UpdateDivNoTail (x910_base.h l.2063-2110)

then, with ``quant_scale2``, ``sat_rint(fp16(fp16(out * fp16(qs2)) + fp16(qo2)))`` (AscendQuant,
x910_base.h l.868-877, l.1433-1462). ``P`` is quantized *unnormalized* (in [0, 1], 1 at each
block's running row max), so ``quant_scale1`` is typically 127 and the op's output needs no
further normalization: the row sum is of the unquantized ``E``. ``fp16_away`` is fp32 -> fp16
rounding to nearest with ties away from zero (``RoundMode::CAST_ROUND``); other half arithmetic
rounds to nearest even. The Cube's int32 products are computed exactly (fp32 GEMMs on integer
values below 2**24, :func:`opsnn_quant.ascend.matmul.fp32_chunk_matmul`).

**deq_scale forms.** uint64: the packed value of :func:`~opsnn_quant.ascend.npu_trans_quant_param`
(its FP19 field is the scale). float32: the kernel reads the fp32 bits as the quant scalar
(``x910_base.h`` ``InitQuant`` l.1555-1575, tiling l.4098-4102), i.e. the same FP19 truncation.
The A2 kernel reads deq_scale1 with deq_scale2's dtype flag and the other way round (l.1560,
l.1569), so mixed forms are refused.

**The float path** (float16/bfloat16 query/key/value) is computed in fp32 (scores, softmax,
``P @ V``) and rounded once to the output dtype: the high-precision model. The kernels round ``P``
to the input dtype before ``P @ V`` and fp16's default high-performance mode runs the softmax in
half (PFA passes ``inner_precise=1``, ``FlashAttentionKernelNpuOpApi.cpp`` l.1008), so the float
path agrees with the NPU to the input dtype's rounding, not bit for bit.

**Assumptions** (kernel details that are not public): the vector unit's ``exp`` and fp32 row sums
are torch's (an fp32 ulp of difference there moves ``P`` only when it crosses an fp16 rounding
boundary); half arithmetic rounds to nearest even; the
fixpipe's fp32 -> fp16 conversion rounds to nearest even (as :func:`~opsnn_quant.ascend.
quant_matmul_epilogue`); half -> int8 casts (``CAST_NONE``) round half to even and saturate, NaN
-> 0; ``static_cast<half>`` of the per-tensor scalars rounds to nearest even. The S2 tile of
:func:`int8_kv_block` is the tiling's starting one; the tiling shrinks it only when the unified
buffer does not fit (large D): pass ``kv_block`` to :func:`int8_attention_bnsd` then.
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._attention_checks import (
    AttentionPlan,
    check_int8_output_rows,
    check_mask,
    check_qkv,
    check_quant_scales,
    check_unused,
)
from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.ascend.matmul import EXACT_FP32_CHUNK, fp32_chunk_matmul
from opsnn_quant.ascend.params import fp19, unpack_quant_param
from opsnn_quant.errors import ShapeError

KV_BLOCK = 1024  # prompt_flash_attention_tiling.cpp l.121 CVDIFF_SINNER_FACTOR_DEFAULT (int8)
KV_BLOCK_SMALL_QS = 2048  # l.122 CVDIFF_SINNER_FACTOR_SMALL_QS
SMALL_QS = 16  # l.116 CVDIFF_SMALL_QS_THRESHOLDS
HALF_MIN = -65504.0  # 0xFBFF, the masked score in half (x910_base.h l.1260)
INT_MAX = 2147483647
_FP16_MIN_NORMAL = 2.0**-14
_FP16_SUBNORMAL_STEP = 2.0**-24


@torch.no_grad()
def fp16_round_away(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp16 rounding to nearest, ties away from zero (AscendC ``RoundMode::CAST_ROUND``).

    Normal range: add half of the 13 dropped mantissa bits to the magnitude and truncate (a carry
    moves into the exponent; past 65504 the result overflows to inf). Subnormal range: multiples
    of 2**-24, rounded half up (exact in fp32). Inf and NaN pass through.
    """
    x = x.to(torch.float32)
    a = x.abs()
    r = ((a.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
    small = a < _FP16_MIN_NORMAL
    if bool(small.any()):
        # half up without an inexact "+ 0.5": a * 2**24 < 1024 is exact in fp32, and so is its
        # fraction (Sterbenz), compared with one half
        scaled = a * (1.0 / _FP16_SUBNORMAL_STEP)
        steps = torch.floor(scaled)
        steps += (scaled - steps) >= 0.5
        r = torch.where(small, steps * _FP16_SUBNORMAL_STEP, r)
    finite = torch.isfinite(x)
    if not bool(finite.all()):  # a NaN's payload must not carry into inf
        r = torch.where(finite, r, a)
    return torch.copysign(r, x).to(torch.float16)


def _sat_rint_int8(y: torch.Tensor) -> torch.Tensor:
    """half -> int8 ``Cast`` with ``CAST_NONE``: rint (half to even), saturate, NaN -> 0."""
    y = torch.nan_to_num(torch.round(y.to(torch.float32)), nan=0.0)
    return y.clamp_(-128, 127).to(torch.int8)


@torch.no_grad()
def ascend_quant_fp16(
    x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None
) -> torch.Tensor:
    """AscendC ``AscendQuant`` on a half tensor: ``sat_rint(fp16(fp16(x * scale) + offset))``.

    CANN 8.1.RC1 ``ascendc/include/highlevel_api/impl/quantization/quant/ascend_quant_pre_impl.h``
    ``AscendQuantIntrinsicsImpl`` (half source): ``Muls`` and ``Adds`` in half, then
    ``Cast<int8_t, half>`` with ``CAST_NONE``; the per-channel variant ``Mul``/``Add`` by half
    tensors. The fp32 scalar arguments are ``static_cast<half>`` first (``AscendQuantCalc``).

    Args:
        x: float16 tensor.
        scale: float16, broadcastable to ``x`` (one element for per-tensor).
        offset: optional float16, broadcastable to ``x``; None adds nothing.

    Returns:
        int8 tensor of ``x``'s shape.
    """
    op = "ascend_quant_fp16"
    require_dtype("x", x, (torch.float16,), op)
    require_dtype("scale", scale, (torch.float16,), op)
    y = x * scale
    if offset is not None:
        require_dtype("offset", offset, (torch.float16,), op)
        y = y + offset
    return _sat_rint_int8(y)


def deq_scale_value(deq_scale: torch.Tensor) -> torch.Tensor:
    """The fp32 scale the fixpipe multiplies by: the FP19 field of a uint64 quant parameter, or
    a float32 scale truncated to FP19 (its bits read as the quant scalar). Shape ``()``."""
    require_dtype("deq_scale", deq_scale, (torch.uint64, torch.float32), "deq_scale_value")
    if deq_scale.dtype == torch.uint64:
        scale, _ = unpack_quant_param(deq_scale.reshape(-1)[:1].view(torch.int64))
        return scale.reshape(())
    return fp19(deq_scale.reshape(-1)[:1]).reshape(())


def int8_kv_block(s1: int, s2: int, has_mask: bool) -> int:
    """The int8 kernel's S2 tile (``prompt_flash_attention_tiling.cpp``
    ``AdjustCVTilingCVDiff`` l.6647-6690): 1024 keys, 2048 when Q_S <= 16, KV_S > 2048 and no
    mask. The tiling's UB-fitting loop may shrink it further for a large D (not modelled)."""
    if s1 <= SMALL_QS and s2 > KV_BLOCK_SMALL_QS and not has_mask:
        return KV_BLOCK_SMALL_QS
    return KV_BLOCK


def _fixpipe_fp16(acc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Fixpipe DEQF16: int32 accumulator times the FP19 scale, to half (as quant_matmul's fp16)."""
    return acc.to(torch.float32).mul_(scale).to(torch.float16)


def _expand_kv(t: torch.Tensor, n: int) -> torch.Tensor:
    """GQA: query head h reads key/value head h // (N / N_kv)."""
    return t if t.shape[1] == n else t.repeat_interleave(n // t.shape[1], dim=1)


ROW_CHUNK_ELEMENTS = 1 << 18
"""Score elements per step of the CPU reference (about 1 MiB of fp32): the query rows are taken a
few at a time so that each block's dozen elementwise passes stay in cache. Rows are independent
(each has its own running max and sum), so the chunking changes no value."""

_P_SHORTCUT_MAX_SCALE = 4096.0
"""Up to this ``quant_scale1``, an ``E`` below the fp16 normal range (< 2**-14) quantizes to 0
whatever its subnormal rounding (``2**-14 * 4096 = 0.25``), so :func:`_quantize_p` may round
every ``E`` with the normal-range rule alone."""


def _quantize_p(e: torch.Tensor, qs1_h: torch.Tensor) -> torch.Tensor:
    """``sat_rint(fp16(fp16_away(E) * qs1_h))`` as int-valued fp32, for ``E = exp(.)`` in [0, 1]
    (or NaN), consuming ``e``.

    The fp32 product of two halves is exact (11 + 11 significant bits), so one rounding of it to
    half is the half ``Muls``. ``exp`` returns the default NaN (0x7FC00000), whose quiet bit the
    normal-range rounding keeps; NaN -> 0 as the half -> int8 cast. Other scales take
    :func:`fp16_round_away` and :func:`ascend_quant_fp16` as written.
    """
    qs = float(qs1_h)
    if not 0.0 < abs(qs) <= _P_SHORTCUT_MAX_SCALE:
        p_q = ascend_quant_fp16(fp16_round_away(e), qs1_h, torch.zeros((), dtype=torch.float16))
        return p_q.to(torch.float32)
    bits = e.view(torch.int32)
    bits.add_(0x1000).bitwise_and_(~0x1FFF)
    y = e.mul_(qs).to(torch.float16).to(torch.float32)
    return torch.nan_to_num_(torch.round_(y), nan=0.0).clamp_(-128, 127)


@torch.no_grad()
def int8_attention_bnsd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    deq_scale1: torch.Tensor,
    quant_scale1: torch.Tensor,
    deq_scale2: torch.Tensor,
    scale_value: float,
    masked: torch.Tensor | None = None,
    kv_block: int = KV_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The A2 int8 PFA kernel's arithmetic on BNSD tensors (see the module docstring).

    Args:
        query: int8 (B, N, S1, D).
        key, value: int8 (B, N_kv, S2, D), N a multiple of N_kv.
        deq_scale1, deq_scale2: per-tensor, uint64 (packed) or float32.
        quant_scale1: float32 per-tensor, the scale ``P`` is multiplied by before rounding.
        scale_value: the softmax scale (multiplied in half).
        masked: optional bool, broadcastable to (B, N, S1, S2); True = not attended.
        kv_block: keys per online-softmax block (the kernel's S2 tile).

    Returns:
        ``(out, lse)``: float16 (B, N, S1, D) and float32 (B, N, S1, 1) = ``log(l) + m``.
    """
    if kv_block <= 0:
        raise ShapeError(f"int8_attention_bnsd: kv_block must be positive, got {kv_block}")
    b, n, s1, d = query.shape
    key_t = _expand_kv(key, n).transpose(-1, -2).to(torch.float32)
    value_f = _expand_kv(value, n).to(torch.float32)
    s2 = key_t.shape[-1]
    mask = None if masked is None else masked.expand(b, n, s1, s2)
    out = torch.empty((b, n, s1, d), dtype=torch.float16)
    lse = torch.empty((b, n, s1, 1), dtype=torch.float32)
    cols = min(s2, kv_block)
    rows = min(s1, max(1, ROW_CHUNK_ELEMENTS // cols))
    heads = min(n, max(1, ROW_CHUNK_ELEMENTS // (rows * cols)))
    # short sequences: whole batches at once (one batched GEMM instead of one per sample)
    batches = min(b, max(1, ROW_CHUNK_ELEMENTS // (n * rows * cols))) if heads == n else 1
    s1_scale, s2_scale = deq_scale_value(deq_scale1), deq_scale_value(deq_scale2)
    for b0 in range(0, b, batches):
        bs = slice(b0, b0 + batches)
        for h0 in range(0, n, heads):
            hs = slice(h0, h0 + heads)
            for r0 in range(0, s1, rows):
                rs = slice(r0, r0 + rows)
                o, l_ = _int8_rows(
                    query[bs, hs, rs].to(torch.float32), key_t[bs, hs], value_f[bs, hs],
                    None if mask is None else mask[bs, hs, rs],
                    s1_scale, quant_scale1, s2_scale, scale_value, kv_block,
                )  # fmt: skip
                out[bs, hs, rs] = o
                lse[bs, hs, rs] = l_
    return out, lse


def _int8_rows(
    q: torch.Tensor,
    key_t: torch.Tensor,
    value: torch.Tensor,
    masked: torch.Tensor | None,
    s1_scale: torch.Tensor,
    quant_scale1: torch.Tensor,
    s2_scale: torch.Tensor,
    scale_value: float,
    kv_block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online softmax of :func:`int8_attention_bnsd` over some query rows. ``q``, ``key_t``
    and ``value`` hold int8 values in fp32 (their products below 2**24: exact GEMMs)."""
    scale_h = torch.tensor(scale_value, dtype=torch.float32).to(torch.float16)
    scale_f = float(scale_h)
    qs1_h = quant_scale1.reshape(()).to(torch.float32).to(torch.float16)
    out: torch.Tensor | None = None
    row_max: torch.Tensor | None = None
    row_sum: torch.Tensor | None = None
    for k0 in range(0, key_t.shape[-1], kv_block):
        blk = slice(k0, k0 + kv_block)
        k_blk = key_t[..., blk]
        if q.shape[-1] <= EXACT_FP32_CHUNK:  # every partial sum of Q K^T below 2**24: exact
            acc = torch.matmul(q, k_blk)
        else:
            acc = fp32_chunk_matmul(q, k_blk, k_blk).to(torch.float32)
        # fixpipe DEQF16, then the half Muls (the product of two halves is exact in fp32)
        x = acc.mul_(s1_scale).to(torch.float16).to(torch.float32).mul_(scale_f)
        x = x.to(torch.float16).to(torch.float32)
        if masked is not None:
            x.masked_fill_(masked[..., blk], HALF_MIN)
        block_max = x.amax(dim=-1, keepdim=True)
        new_max = block_max if row_max is None else torch.maximum(row_max, block_max)
        e = torch.exp_(x.sub_(new_max))
        e_sum = e.sum(dim=-1, keepdim=True)
        p_q = _quantize_p(e, qs1_h)
        o_blk = _fixpipe_fp16(
            fp32_chunk_matmul(p_q, value[..., blk, :], value[..., blk, :]), s2_scale
        )
        if out is None or row_max is None or row_sum is None:
            out, row_sum = o_blk, e_sum
        else:
            alpha = torch.exp(row_max - new_max)
            row_sum = alpha * row_sum + e_sum
            out = out * fp16_round_away(alpha) + o_blk
        row_max = new_max
    assert out is not None and row_sum is not None and row_max is not None
    return out / fp16_round_away(row_sum), torch.log(row_sum) + row_max


@torch.no_grad()
def float_attention_bnsd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale_value: float,
    masked: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float path in fp32: ``softmax(scale * Q K^T, masked -> fp32 min) @ V``.

    Masked scores become the fp32 minimum (0xFF7FFFFF, x910_base.h l.1257), so a fully masked
    row averages V uniformly, as the kernel without row-invalid correction does.

    Returns:
        ``(out, lse)``: float32 (B, N, S1, D) and float32 (B, N, S1, 1).
    """
    n = query.shape[1]
    q = query.to(torch.float32)
    k = _expand_kv(key, n).to(torch.float32)
    v = _expand_kv(value, n).to(torch.float32)
    scores = torch.matmul(q, k.transpose(-1, -2)) * torch.tensor(scale_value, dtype=torch.float32)
    if masked is not None:
        scores = scores.masked_fill(masked, torch.finfo(torch.float32).min)
    row_max = scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores - row_max)
    row_sum = e.sum(dim=-1, keepdim=True)
    return torch.matmul(e, v) / row_sum, torch.log(row_sum) + row_max


def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, heads, h // heads).transpose(1, 2)
    return t.transpose(1, 2) if layout == "BSND" else t


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BSH":
        b, n, s, d = t.shape
        return t.transpose(1, 2).reshape(b, s, n * d).contiguous()
    return t.transpose(1, 2).contiguous() if layout == "BSND" else t.contiguous()


def _mask_bnsd(
    plan: AttentionPlan,
    atten_mask: torch.Tensor | None,
    sparse_mode: int,
    pre_tokens: int,
    next_tokens: int,
) -> torch.Tensor | None:
    """Bool (B|1, 1, S1, S2) mask, True = not attended. sparse_mode 0 with a mask also drops the
    keys outside ``[i - pre_tokens, i + next_tokens]`` (PFA doc l.80, top-left aligned); without a
    mask, or in sparse_mode 1, pre/next_tokens are ignored (PFA doc l.124-126)."""
    if atten_mask is None:
        return None
    m = atten_mask != 0
    if m.dim() == 2 and plan.s1 == 1 and m.shape == (plan.b, plan.s2):
        m = m.reshape(plan.b, 1, 1, plan.s2)
    while m.dim() < 4:
        m = m.unsqueeze(0 if m.dim() == 2 else 1)
    if sparse_mode == 0 and plan.s1 > 1:
        i = torch.arange(plan.s1).unsqueeze(1)
        j = torch.arange(plan.s2).unsqueeze(0)
        m = m | (j - i > next_tokens) | (i - j > pre_tokens)
    return m


def _post_quant(
    out_h: torch.Tensor, plan: AttentionPlan, scale: torch.Tensor, offset: torch.Tensor | None
) -> torch.Tensor:
    """int8 output: per-tensor scalars cast to half (nearest even), per-channel (N, D) tensors
    cast with CAST_ROUND (x910_base.h l.1451-1455), then AscendQuant on half."""
    if scale.numel() == 1:
        s = scale.reshape(()).to(torch.float32).to(torch.float16)
        o = None if offset is None else offset.reshape(()).to(torch.float32).to(torch.float16)
    else:
        s = fp16_round_away(scale.to(torch.float32).reshape(plan.n, 1, plan.d))
        o = None if offset is None else fp16_round_away(offset.to(torch.float32).reshape(s.shape))
    return ascend_quant_fp16(out_h, s, o)


def _attention(
    op: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    atten_mask: torch.Tensor | None,
    deq_scale1: torch.Tensor | None,
    quant_scale1: torch.Tensor | None,
    deq_scale2: torch.Tensor | None,
    quant_scale2: torch.Tensor | None,
    quant_offset2: torch.Tensor | None,
    num_heads: int,
    scale: float,
    pre_tokens: int,
    next_tokens: int,
    input_layout: str,
    num_key_value_heads: int,
    sparse_mode: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks, then the int8 or float path; returns ``(out, lse (B, N, S1, 1))``."""
    plan = check_qkv(query, key, value, input_layout, num_heads, num_key_value_heads, op)
    check_quant_scales(
        plan, deq_scale1, quant_scale1, deq_scale2, quant_scale2, quant_offset2, query.dtype, op
    )
    check_mask(plan, atten_mask, sparse_mode, op)
    if quant_scale2 is not None:
        check_int8_output_rows(
            plan, atten_mask, sparse_mode, pre_tokens, next_tokens, quant_offset2, op
        )
    out_dtype = (
        torch.int8 if quant_scale2 is not None else (torch.float16 if plan.int8 else query.dtype)
    )  # op-plugin FlashAttentionKernelNpuOpApi.cpp l.997-1003
    q = _to_bnsd(query, plan.layout, plan.n)
    k = _to_bnsd(key, plan.layout, plan.n_kv)
    v = _to_bnsd(value, plan.layout, plan.n_kv)
    shape = (plan.b, plan.n, plan.s1, plan.d)
    lse_shape = (plan.b, plan.n, plan.s1, 1)
    if plan.int8 and (query.numel() == 0 or key.numel() == 0):
        raise ShapeError(f"{op}: int8 query/key/value cannot be empty (PFA tiling l.4192)")
    if query.numel() == 0 or key.numel() == 0:
        # PFA doc l.98: an empty query returns at once; empty key/value give a zero output.
        empty = torch.zeros(shape, dtype=out_dtype)
        return _from_bnsd(empty, plan.out_layout), torch.zeros(lse_shape, dtype=torch.float32)
    masked = _mask_bnsd(plan, atten_mask, sparse_mode, pre_tokens, next_tokens)
    if plan.int8:
        assert deq_scale1 is not None and quant_scale1 is not None and deq_scale2 is not None
        block = int8_kv_block(plan.s1, plan.s2, atten_mask is not None)
        out_h, lse = int8_attention_bnsd(
            q, k, v, deq_scale1, quant_scale1, deq_scale2, scale, masked, kv_block=block
        )
    else:
        out32, lse = float_attention_bnsd(q, k, v, scale, masked)
        out_h = out32.to(torch.float16)
    if quant_scale2 is not None:
        out = _post_quant(out_h, plan, quant_scale2, quant_offset2)
    else:
        out = out_h if plan.int8 else out32.to(out_dtype)
    return _from_bnsd(out, plan.out_layout), lse


@torch.no_grad()
def npu_prompt_flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    pse_shift: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: list[int] | None = None,
    deq_scale1: torch.Tensor | None = None,
    quant_scale1: torch.Tensor | None = None,
    deq_scale2: torch.Tensor | None = None,
    quant_scale2: torch.Tensor | None = None,
    quant_offset2: torch.Tensor | None = None,
    num_heads: int = 1,
    scale_value: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = 0,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    actual_seq_lengths_kv: list[int] | None = None,
    sparse_mode: int = 0,
) -> torch.Tensor:
    """Prefill flash attention, as ``torch_npu.npu_prompt_flash_attention`` on Atlas A2/A3.

    Same signature and defaults as torch_npu (op-plugin ``op_plugin_functions.yaml`` l.6759).
    ``softmax(scale_value * Q K^T + mask) V`` with the int8 path of the module docstring when
    query/key/value are int8 (``deq_scale1``, ``quant_scale1``, ``deq_scale2`` required), the
    fp32 float path otherwise.

    Args:
        query, key, value: contiguous, one dtype: float16, bfloat16 or int8, in ``input_layout``
            "BSH" (B, S, N*D), "BSND", "BNSD" or "BNSD_BSND" (BNSD in, BSND out). int8 needs D a
            multiple of 32 (32 bytes).
        pse_shift, padding_mask, actual_seq_lengths, actual_seq_lengths_kv: must be None (not
            supported by the reference; ``padding_mask`` is reserved by the op).
        atten_mask: optional bool/int8/uint8 (S1, S2), (1|B, S1, S2) or (1|B, 1, S1, S2);
            nonzero = not attended. With ``sparse_mode`` 0, keys outside
            ``[i - pre_tokens, i + next_tokens]`` are dropped too: PFA's default
            ``next_tokens=0`` makes a given mask causal.
        deq_scale1, deq_scale2: per-tensor uint64 (``npu_trans_quant_param(...).view(uint64)``)
            or float32, both of one form.
        quant_scale1: per-tensor float32 (``P``, unnormalized in [0, 1], is multiplied by it).
        quant_scale2, quant_offset2: optional float32 (bf16 too for bf16 inputs), 1 or N*D
            elements: int8 output ``sat_rint(out * qs2 + qo2)`` in half.
        num_heads, num_key_value_heads: query heads, key/value heads (0 = num_heads; GQA).
        scale_value: the softmax scale (multiplied in half on the int8 path).
        pre_tokens, next_tokens: the band of sparse_mode 0 with a mask.
        sparse_mode: 0 (default mask) or 1 (all mask; needs atten_mask); 10/11 are op-plugin's
            high-precision aliases of 0/1. 2-4 (compressed masks) are not supported.

    Returns:
        int8 with ``quant_scale2``, float16 for int8 inputs, else the input dtype; the query's
        shape (BSND for "BNSD_BSND").
    """
    op = "npu_prompt_flash_attention"
    check_unused(
        op,
        pse_shift=pse_shift,
        padding_mask=padding_mask,
        actual_seq_lengths=actual_seq_lengths,
        actual_seq_lengths_kv=actual_seq_lengths_kv,
    )
    if 10 <= sparse_mode <= 14:  # op-plugin FlashAttentionKernelNpuOpApi.cpp l.1010-1014
        sparse_mode -= 10
    out, _ = _attention(
        op,
        query,
        key,
        value,
        atten_mask=atten_mask,
        deq_scale1=deq_scale1,
        quant_scale1=quant_scale1,
        deq_scale2=deq_scale2,
        quant_scale2=quant_scale2,
        quant_offset2=quant_offset2,
        num_heads=num_heads,
        scale=scale_value,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        input_layout=input_layout,
        num_key_value_heads=num_key_value_heads,
        sparse_mode=sparse_mode,
    )
    return out


def _query_seq_len(query: torch.Tensor, input_layout: str) -> int:
    """Q_S of a query in ``input_layout`` (BSH/BSND: dim 1, BNSD: dim 2), 0 if it cannot tell."""
    if input_layout.startswith("BNSD"):
        return int(query.shape[2]) if query.dim() == 4 else 0
    return int(query.shape[1]) if query.dim() >= 2 else 0


def _check_inner_precise(inner_precise: int, s1: int, masked: torch.Tensor | None, op: str) -> None:
    """FIA doc l.226-237: 0-3; Q_S = 1 takes 0/1. Bit 1 (row-invalid correction) changes only
    fully masked rows, which the reference does not model."""
    if inner_precise not in (0, 1, 2, 3) or (s1 == 1 and inner_precise > 1):
        raise ShapeError(f"{op}: inner_precise must be 0-3 (0/1 when Q_S = 1), got {inner_precise}")
    if inner_precise & 2 and masked is not None and bool(masked.all(dim=-1).any()):
        raise ShapeError(
            f"{op}: inner_precise={inner_precise} corrects fully masked rows, which the reference "
            "does not model; use 0/1 or a mask without fully masked rows"
        )


@torch.no_grad()
def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    pse_shift: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: list[int] | None = None,
    actual_seq_lengths_kv: list[int] | None = None,
    dequant_scale1: torch.Tensor | None = None,
    quant_scale1: torch.Tensor | None = None,
    dequant_scale2: torch.Tensor | None = None,
    quant_scale2: torch.Tensor | None = None,
    quant_offset2: torch.Tensor | None = None,
    antiquant_scale: torch.Tensor | None = None,
    antiquant_offset: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    query_padding_size: torch.Tensor | None = None,
    kv_padding_size: torch.Tensor | None = None,
    key_antiquant_scale: torch.Tensor | None = None,
    key_antiquant_offset: torch.Tensor | None = None,
    value_antiquant_scale: torch.Tensor | None = None,
    value_antiquant_offset: torch.Tensor | None = None,
    key_shared_prefix: torch.Tensor | None = None,
    value_shared_prefix: torch.Tensor | None = None,
    actual_shared_prefix_len: list[int] | None = None,
    query_rope: torch.Tensor | None = None,
    key_rope: torch.Tensor | None = None,
    key_rope_antiquant_scale: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = INT_MAX,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    antiquant_mode: int = 0,
    softmax_lse_flag: bool = False,
    key_antiquant_mode: int = 0,
    value_antiquant_mode: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill/decode attention, as ``torch_npu.npu_fused_infer_attention_score`` on A2/A3.

    Q_S > 1 is the PFA branch: exactly :func:`npu_prompt_flash_attention`'s arithmetic (int8
    full quant with ``dequant_scale1``/``quant_scale1``/``dequant_scale2``, FIA doc l.272-282).
    Q_S = 1 is the IFA (decode) branch: float query/key/value only; all-int8 query/key/value are
    refused there (FIA doc l.429; ``incre_flash_attention_tiling.cpp`` ``SetQuantFlag``
    l.531-535 admits an int8 query only in MLA page-attention NZ mode). ``sparse_mode``,
    ``pre_tokens`` and ``next_tokens`` have no effect when Q_S = 1 (FIA doc l.204-206, l.224).

    Args:
        query, key, value, atten_mask, quant_scale2, quant_offset2, num_heads, scale, pre_tokens,
            next_tokens, input_layout, num_key_value_heads, sparse_mode: as
            :func:`npu_prompt_flash_attention` (``scale`` is its ``scale_value``; the defaults of
            pre/next_tokens are INT_MAX here). A Q_S = 1 mask may also be (B, S2).
        dequant_scale1, quant_scale1, dequant_scale2: PFA's deq_scale1/quant_scale1/deq_scale2.
        inner_precise: 0/1 (2/3 only without fully masked rows; the int8 path ignores bit 0).
        softmax_lse_flag: also return ``lse = log(sum exp) + max`` (B, N, S1, 1) float32.
        every other argument (antiquant, page attention, left padding, shared prefix, MLA rope,
            pse_shift, actual sequence lengths): must be left unset (not supported by the
            reference).

    Returns:
        ``(attention_out, softmax_lse)``; ``softmax_lse`` is an empty float32 tensor unless
        ``softmax_lse_flag`` (op-plugin ``FusedInferAttentionScoreKernelNpuOpApi.cpp``
        ``construct_fia_output_tensor`` l.352-357; the doc says shape (1,), the code builds (0,)).
    """
    op = "npu_fused_infer_attention_score"
    check_unused(
        op,
        pse_shift=pse_shift,
        actual_seq_lengths=actual_seq_lengths,
        actual_seq_lengths_kv=actual_seq_lengths_kv,
        antiquant_scale=antiquant_scale,
        antiquant_offset=antiquant_offset,
        block_table=block_table,
        query_padding_size=query_padding_size,
        kv_padding_size=kv_padding_size,
        key_antiquant_scale=key_antiquant_scale,
        key_antiquant_offset=key_antiquant_offset,
        value_antiquant_scale=value_antiquant_scale,
        value_antiquant_offset=value_antiquant_offset,
        key_shared_prefix=key_shared_prefix,
        value_shared_prefix=value_shared_prefix,
        actual_shared_prefix_len=actual_shared_prefix_len,
        query_rope=query_rope,
        key_rope=key_rope,
        key_rope_antiquant_scale=key_rope_antiquant_scale,
        block_size=block_size,
        antiquant_mode=antiquant_mode,
        key_antiquant_mode=key_antiquant_mode,
        value_antiquant_mode=value_antiquant_mode,
    )
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise ShapeError(f"{op}: {name} must be a tensor (tensor lists are not supported)")
    s1 = _query_seq_len(query, input_layout)
    if s1 == 1 and query.dtype == torch.int8:
        raise ShapeError(
            f"{op}: all-int8 query/key/value are not supported when Q_S = 1 (decode); "
            "int8 full quant runs on the prefill branch only"
        )
    if s1 == 1:
        sparse_mode, pre_tokens, next_tokens = 0, INT_MAX, INT_MAX  # no effect on decode
    plan = check_qkv(query, key, value, input_layout, num_heads, num_key_value_heads, op)
    check_mask(plan, atten_mask, sparse_mode, op)
    _check_inner_precise(
        inner_precise,
        plan.s1,
        _mask_bnsd(plan, atten_mask, sparse_mode, pre_tokens, next_tokens),
        op,
    )
    out, lse = _attention(
        op,
        query,
        key,
        value,
        atten_mask=atten_mask,
        deq_scale1=dequant_scale1,
        quant_scale1=quant_scale1,
        deq_scale2=dequant_scale2,
        quant_scale2=quant_scale2,
        quant_offset2=quant_offset2,
        num_heads=num_heads,
        scale=scale,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        input_layout=input_layout,
        num_key_value_heads=num_key_value_heads,
        sparse_mode=sparse_mode,
    )
    return out, (lse if softmax_lse_flag else torch.zeros(0, dtype=torch.float32))


# FIA-v2 arguments the reference refuses, with the reason (op-plugin
# docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score_v2.md, "v2 doc").
_V2_MLA = (
    "per-token x per-head query scales are FIA-v2's MLA full-quant mode (int8 query D=512 with "
    "query_rope/key_rope, int8 key/value as 5-D NZ page-attention blocks, bf16 output; v2 doc "
    "l.115, l.252-256): out of scope of the reference"
)
_V2_KV = "key/value dequant scales are KV antiquant, not supported by the reference"
_V2_FP8 = "is a FP8/MX/HiFloat8 mode of Ascend 950 (A2/A3 have no FP8): out of scope"
_V2_FP8_QUANT_MODES = (
    6,
    7,
    8,
)  # MX per-block / FP8 per-block modes (MindIE-SD 3.1.0 quantization/layer.py l.487, l.555-557)
_V2_REFUSED: dict[str, str] = {
    "dequant_scale_query": _V2_MLA,
    "query_quant_mode": _V2_MLA,
    "dequant_scale_key": _V2_KV,
    "dequant_offset_key": _V2_KV,
    "dequant_scale_value": _V2_KV,
    "dequant_offset_value": _V2_KV,
    "key_quant_mode": _V2_KV,
    "value_quant_mode": _V2_KV,
    "quant_scale_out": (
        "int8 output on A2/A3 needs int8 query/key/value (v2 doc l.229-232), which v2 takes only "
        "in its MLA mode: out of scope of the reference"
    ),
    "quant_offset_out": "needs quant_scale_out",
    "query_dtype": _V2_FP8,
    "key_dtype": _V2_FP8,
    "value_dtype": _V2_FP8,
    "dequant_scale_query_dtype": _V2_FP8,
    "dequant_scale_key_dtype": _V2_FP8,
    "dequant_scale_value_dtype": _V2_FP8,
    "out_dtype": _V2_FP8,
}


@torch.no_grad()
def npu_fused_infer_attention_score_v2(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    query_rope: torch.Tensor | None = None,
    key_rope: torch.Tensor | None = None,
    pse_shift: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_qlen: list[int] | None = None,
    actual_seq_kvlen: list[int] | None = None,
    block_table: torch.Tensor | None = None,
    dequant_scale_query: torch.Tensor | None = None,
    dequant_scale_key: torch.Tensor | None = None,
    dequant_offset_key: torch.Tensor | None = None,
    dequant_scale_value: torch.Tensor | None = None,
    dequant_offset_value: torch.Tensor | None = None,
    dequant_scale_key_rope: torch.Tensor | None = None,
    quant_scale_out: torch.Tensor | None = None,
    quant_offset_out: torch.Tensor | None = None,
    quant_scale_p: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
    num_query_heads: int = 1,
    num_key_value_heads: int = 0,
    softmax_scale: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = INT_MAX,
    input_layout: str = "BSH",
    sparse_mode: int = 0,
    block_size: int = 0,
    query_quant_mode: int = 0,
    key_quant_mode: int = 0,
    value_quant_mode: int = 0,
    inner_precise: int = 0,
    return_softmax_lse: bool = False,
    query_dtype: object = None,
    key_dtype: object = None,
    value_dtype: object = None,
    query_rope_dtype: object = None,
    key_rope_dtype: object = None,
    key_shared_prefix_dtype: object = None,
    value_shared_prefix_dtype: object = None,
    dequant_scale_query_dtype: object = None,
    dequant_scale_key_dtype: object = None,
    dequant_scale_value_dtype: object = None,
    dequant_scale_key_rope_dtype: object = None,
    out_dtype: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_fused_infer_attention_score_v2`` on A2/A3, float query/key/value only.

    v2 has no per-tensor full quant (no deq_scale1/quant_scale1/deq_scale2; v2 doc l.14 sends it
    to :func:`npu_fused_infer_attention_score`). Its int8 query path is the MLA full quant with a
    per-token x per-head ``dequant_scale_query`` (v2 doc l.115, l.252-256: query D = 512 with
    rope, key/value as NZ page-attention blocks), and its FP8/MX modes (``query_quant_mode``
    6-8, fp8 dtypes) are Ascend 950's: both are refused with the reason. What remains is the
    float path of :func:`npu_fused_infer_attention_score` (same checks and arithmetic).

    Returns:
        ``(attention_out, softmax_lse)`` as :func:`npu_fused_infer_attention_score`.
    """
    op = "npu_fused_infer_attention_score_v2"
    refused = {
        "dequant_scale_query": dequant_scale_query,
        "query_quant_mode": query_quant_mode,
        "dequant_scale_key": dequant_scale_key,
        "dequant_offset_key": dequant_offset_key,
        "dequant_scale_value": dequant_scale_value,
        "dequant_offset_value": dequant_offset_value,
        "key_quant_mode": key_quant_mode,
        "value_quant_mode": value_quant_mode,
        "quant_scale_out": quant_scale_out,
        "quant_offset_out": quant_offset_out,
        "query_dtype": query_dtype,
        "key_dtype": key_dtype,
        "value_dtype": value_dtype,
        "dequant_scale_query_dtype": dequant_scale_query_dtype,
        "dequant_scale_key_dtype": dequant_scale_key_dtype,
        "dequant_scale_value_dtype": dequant_scale_value_dtype,
        "out_dtype": out_dtype,
    }
    for name, value_ in refused.items():
        if value_ is None or (isinstance(value_, int) and value_ == 0):
            continue
        fp8_mode = name.endswith("quant_mode") and value_ in _V2_FP8_QUANT_MODES
        label = f"{name}={value_}" if isinstance(value_, int) else name
        raise ShapeError(f"{op}: {label} {_V2_FP8 if fp8_mode else _V2_REFUSED[name]}")
    if sparse_mode == 9:  # v2 doc l.162: treeMask, MLA only
        raise ShapeError(
            f"{op}: sparse_mode=9 (treeMask) is MLA-only: out of scope of the reference"
        )
    check_unused(
        op,
        query_rope=query_rope,
        key_rope=key_rope,
        block_table=block_table,
        dequant_scale_key_rope=dequant_scale_key_rope,
        quant_scale_p=quant_scale_p,
        learnable_sink=learnable_sink,
        block_size=block_size,
        query_rope_dtype=query_rope_dtype,
        key_rope_dtype=key_rope_dtype,
        key_shared_prefix_dtype=key_shared_prefix_dtype,
        value_shared_prefix_dtype=value_shared_prefix_dtype,
        dequant_scale_key_rope_dtype=dequant_scale_key_rope_dtype,
    )
    require_dtype("query", query, (torch.float16, torch.bfloat16), op)  # v2 doc l.87
    return npu_fused_infer_attention_score(
        query,
        key,
        value,
        pse_shift=pse_shift,
        atten_mask=atten_mask,
        actual_seq_lengths=actual_seq_qlen,
        actual_seq_lengths_kv=actual_seq_kvlen,
        num_heads=num_query_heads,
        scale=softmax_scale,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        input_layout=input_layout,
        num_key_value_heads=num_key_value_heads,
        sparse_mode=sparse_mode,
        inner_precise=inner_precise,
        softmax_lse_flag=return_softmax_lse,
    )
