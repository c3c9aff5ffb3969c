"""Quantized matmuls: ``npu_quant_matmul`` (QuantBatchMatmulV3) and ``npu_weight_quant_batchmatmul``.

Sources: torch_npu ``npu_quant_matmul`` / ``npu_weight_quant_batchmatmul`` API docs and the ops-nn
``quant_batch_matmul_v3`` README (formulas by bias dtype, Atlas A2/A3)::

    no bias:                 out = x1@x2 * scale + offset
    bias int32:              out = (x1@x2 + bias) * scale + offset
    bias bf16/fp16/fp32:     out = x1@x2 * scale + bias                       (no offset)
    pertoken:                out = x1@x2 * scale * pertoken_scale (+ bias as above)

``x1@x2`` is an exact int32 accumulation. The reference computes it with float32 GEMMs on chunks
of K small enough that every partial sum is an integer below 2**24 (so any summation order is
exact), and adds the chunks in int64. The float epilogue runs in fp32 in the order written above:
``float32(acc) * scale * pertoken_scale + offset_or_bias``, then one rounding to the output dtype
(int8: rint and saturate).
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._checks import require_dtype, require_vector
from opsnn_quant.ascend.params import fp19, unpack_quant_param
from opsnn_quant.errors import ShapeError

# |int8 * int8| <= 2**14, so a sum of 1024 products stays within 2**24, exact in fp32.
EXACT_FP32_CHUNK = 1024
MAX_K = 65535
# Elements of an int8 weight converted to fp32 at once when no fp32 copy is given (16 MB).
WEIGHT_CHUNK = 1 << 22


@torch.no_grad()
def int8_matmul_exact(
    x1: torch.Tensor, x2: torch.Tensor, x2_float: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact ``x1 @ x2`` of int8 tensors as int32 (no overflow is possible for K <= 65535).

    Args:
        x1: int8 (..., M, K).
        x2: int8 (..., K, N).
        x2_float: optional ``x2`` already converted to float32 (callers that reuse a weight cache it).

    Returns:
        int32 (..., M, N).
    """
    k = x1.shape[-1]
    a = x1.to(torch.float32)
    if x2_float is None and x2.dim() == 2 and x2.numel() > WEIGHT_CHUNK and k <= EXACT_FP32_CHUNK:
        # A large int8 weight (an LM head) is converted to fp32 a column block at a time: a
        # whole fp32 copy is 4x the int8 weight, per call. Each output element is the same exact
        # dot product either way.
        cols = max(1, WEIGHT_CHUNK // k)
        out = torch.empty((*a.shape[:-1], x2.shape[1]), dtype=torch.int32, device=a.device)
        for n0 in range(0, x2.shape[1], cols):
            block = x2[:, n0 : n0 + cols].to(torch.float32)
            out[..., n0 : n0 + cols] = torch.matmul(a, block).to(torch.int32)
        return out
    b = x2.to(torch.float32) if x2_float is None else x2_float
    if k <= EXACT_FP32_CHUNK:
        return torch.matmul(a, b).to(torch.int32)
    acc: torch.Tensor | None = None
    for k0 in range(0, k, EXACT_FP32_CHUNK):
        part = torch.matmul(
            a[..., k0 : k0 + EXACT_FP32_CHUNK], b[..., k0 : k0 + EXACT_FP32_CHUNK, :]
        )
        part_i = part.to(torch.int64)
        acc = part_i if acc is None else acc.add_(part_i)
    assert acc is not None
    return acc.to(torch.int32)


def _check_quant_matmul(
    x1: torch.Tensor,
    x2: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    pertoken_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    output_dtype: torch.dtype | None,
) -> None:
    op = "npu_quant_matmul"
    require_dtype("x1", x1, (torch.int8,), op)
    require_dtype("x2", x2, (torch.int8,), op)
    if not (2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6):
        raise ShapeError(f"{op}: x1 and x2 must have 2 to 6 dims, got {x1.dim()} and {x2.dim()}")
    k, n = x1.shape[-1], x2.shape[-1]
    if x2.shape[-2] != k:
        raise ShapeError(
            f"{op}: K mismatch: x1 is {tuple(x1.shape)} and x2 is {tuple(x2.shape)} (x2 is (K, N))"
        )
    if k > MAX_K:
        raise ShapeError(f"{op}: K={k} exceeds the supported maximum {MAX_K}")
    if output_dtype not in (None, torch.int8, torch.float16, torch.bfloat16, torch.int32):
        raise ShapeError(f"{op}: output_dtype must be None, int8, float16, bfloat16 or int32")
    require_dtype("scale", scale, (torch.float32, torch.int64, torch.bfloat16), op)
    require_vector("scale", scale, (1, n), op)
    if offset is not None:
        require_dtype("offset", offset, (torch.float32,), op)
        require_vector("offset", offset, (1, n), op)
        if output_dtype not in (None, torch.int8):
            raise ShapeError(f"{op}: offset is only supported with int8 output")
    if pertoken_scale is not None:
        require_dtype("pertoken_scale", pertoken_scale, (torch.float32,), op)
        m = x1.shape[-2]
        if pertoken_scale.dim() != 1 or pertoken_scale.numel() != m:
            raise ShapeError(
                f"{op}: pertoken_scale must be 1-D with M={m} elements, "
                f"got {tuple(pertoken_scale.shape)}"
            )
        if output_dtype not in (torch.float16, torch.bfloat16):
            raise ShapeError(f"{op}: pertoken_scale needs output_dtype float16 or bfloat16")
        if scale.dtype == torch.int64:
            raise ShapeError(f"{op}: with pertoken_scale, scale must be float32 or bfloat16")
    if bias is not None:
        require_dtype("bias", bias, (torch.int32, torch.bfloat16, torch.float16, torch.float32), op)
        if bias.shape[-1] != n or bias.dim() not in (1, 3):
            raise ShapeError(f"{op}: bias must be (N,) or (batch, 1, N), got {tuple(bias.shape)}")
        if bias.dtype != torch.int32 and offset is not None:
            raise ShapeError(f"{op}: a floating bias cannot be combined with offset")
        if bias.dtype == torch.float16 and pertoken_scale is None:
            raise ShapeError(f"{op}: a float16 bias needs pertoken_scale")
    if output_dtype == torch.bfloat16 and scale.dtype == torch.int64:
        raise ShapeError(f"{op}: bfloat16 output takes a float32/bfloat16 scale, not int64")


@torch.no_grad()
def npu_quant_matmul(
    x1: torch.Tensor,
    x2: torch.Tensor,
    scale: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
    x2_float: torch.Tensor | None = None,
) -> torch.Tensor:
    """int8 x int8 matmul with Ascend's dequant/requant epilogue, as ``torch_npu.npu_quant_matmul``.

    Args:
        x1: int8 (..., M, K) activations.
        x2: int8 (..., K, N) weights (a transposed (N, K) weight, as torch_npu accepts).
        scale: (1,) or (N,): fp32, bf16, or int64 packed by ``npu_trans_quant_param``. For int8 or
            fp16 output without ``pertoken_scale`` an fp32 scale is truncated to FP19 as the
            packed one is; bf16 output and per-token scaling use it in full fp32.
        offset: optional fp32 (1,) or (N,), int8 output only.
        pertoken_scale: optional fp32 (M,).
        bias: optional int32 (added to the accumulator) or bf16/fp16/fp32 (added after scaling).
        output_dtype: None/int8 (saturated), float16, bfloat16, or int32 (the accumulator plus
            int32 bias, unscaled).
        x2_float: reference-only speed-up: ``x2`` already converted to fp32 (not a torch_npu arg).

    Returns:
        Tensor (..., M, N) of ``output_dtype`` (int8 when None).
    """
    _check_quant_matmul(x1, x2, scale, offset, pertoken_scale, bias, output_dtype)
    acc = int8_matmul_exact(x1, x2, x2_float)
    if bias is not None and bias.dtype == torch.int32:
        k = x1.shape[-1]
        if int(bias.abs().max()) + k * 2**14 <= 2**31 - 1:
            acc.add_(bias)  # no int32 overflow is possible: add in place
        else:
            # int32 addition wraps on the device; int64 then truncation reproduces that.
            acc = (acc.to(torch.int64) + bias.to(torch.int64)).to(torch.int32)
    if output_dtype == torch.int32:
        return acc
    if scale.dtype == torch.int64:
        s, packed_offset = unpack_quant_param(scale.reshape(-1))
        if offset is None and bool((packed_offset != 0).any()):
            offset = packed_offset
    elif pertoken_scale is None and output_dtype in (None, torch.int8, torch.float16):
        # These outputs go through the fixpipe's FP19 scale; torch_npu packs an fp32 scale with
        # npu_trans_quant_param (truncation) before launching the kernel.
        s = fp19(scale.reshape(-1).to(torch.float32))
    else:
        s = scale.reshape(-1).to(torch.float32)
    # The epilogue in fp32, in the documented order, in place (the hot path of CPU evaluation).
    y = acc.to(torch.float32).mul_(s)
    if pertoken_scale is not None:
        y.mul_(pertoken_scale.unsqueeze(-1))
    if offset is not None:
        y.add_(offset.reshape(-1))
    if bias is not None and bias.dtype != torch.int32:
        y.add_(bias.to(torch.float32))
    if output_dtype is None or output_dtype == torch.int8:
        return torch.round_(y).clamp_(-128, 127).to(torch.int8)
    return y.to(output_dtype)


@torch.no_grad()
def npu_weight_quant_batchmatmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    antiquant_scale: torch.Tensor,
    antiquant_offset: torch.Tensor | None = None,
    quant_scale: torch.Tensor | None = None,
    quant_offset: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    antiquant_group_size: int = 0,
    inner_precise: int = 0,
) -> torch.Tensor:
    """Weight-only int8 matmul (W8A16), as ``torch_npu.npu_weight_quant_batchmatmul``.

    ``w = (weight + antiquant_offset) * antiquant_scale`` in ``x``'s dtype (the antiquant step of
    WeightQuantBatchMatmulV2), then ``y = x @ w + bias`` accumulated in fp32 and rounded once to
    ``x``'s dtype. The float GEMM's summation order differs from the cube unit's, so agreement with
    the NPU is to float rounding, not bit-exact (unlike :func:`npu_quant_matmul`).

    Args:
        x: fp16/bf16 (fp32 accepted by the reference) (..., M, K).
        weight: int8 (K, N).
        antiquant_scale: (N,) or (1, N) per channel, or (ceil(K/group), N) per group.
        antiquant_offset: optional, same shape as ``antiquant_scale``.
        quant_scale, quant_offset: int8 output requantization; not supported by the reference.
        bias: optional (N,).
        antiquant_group_size: group size along K for per-group scales (0 = per channel).
        inner_precise: accepted for API compatibility (a performance knob on the NPU).

    Returns:
        (..., M, N) in ``x``'s dtype.
    """
    op = "npu_weight_quant_batchmatmul"
    require_dtype("x", x, (torch.float16, torch.bfloat16, torch.float32), op)
    require_dtype("weight", weight, (torch.int8,), op)
    if quant_scale is not None or quant_offset is not None:
        raise ShapeError(f"{op}: quant_scale/quant_offset (int8 output) are not supported")
    if weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ShapeError(
            f"{op}: weight must be (K, N) with K={x.shape[-1]}, got {tuple(weight.shape)}"
        )
    k, n = weight.shape
    scale = antiquant_scale.reshape(-1, n).to(x.dtype)
    off = None if antiquant_offset is None else antiquant_offset.reshape(-1, n).to(x.dtype)
    if antiquant_group_size > 0:
        groups = -(-k // antiquant_group_size)
        if scale.shape[0] != groups:
            raise ShapeError(
                f"{op}: per-group antiquant_scale needs {groups} rows, got {scale.shape[0]}"
            )
        scale = scale.repeat_interleave(antiquant_group_size, dim=0)[:k]
        off = None if off is None else off.repeat_interleave(antiquant_group_size, dim=0)[:k]
    elif scale.shape[0] != 1:
        raise ShapeError(f"{op}: antiquant_scale must be (N,) without antiquant_group_size")
    w = weight.to(x.dtype)
    if off is not None:
        w = w + off
    w = w * scale
    y = torch.matmul(x.to(torch.float32), w.to(torch.float32))
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)
