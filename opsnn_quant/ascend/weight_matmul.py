"""Weight-only quantized matmul: ``npu_weight_quant_batchmatmul`` (WeightQuantBatchMatmulV2).

Sources: torch_npu ``npu_weight_quant_batchmatmul`` API doc; op-plugin
``op_plugin/ops/opapi/WeightQuantBatchMatmulV2KernelNpuOpApi.cpp`` (shape inference, int4 weights in
int32, an fp32 ``quant_scale`` packed by ``aclnnTransQuantParamV2``); ops-nn
``matmul/weight_quant_batch_matmul_v2/tests/assets/wqbmmv2_kernel_golden.py`` (``_compute_tc``,
``_compute_pergroup``, ``finalize``)::

    w = (weight + antiquant_offset) * antiquant_scale      # in x's dtype, rounded at each step
    y = fp32(x) @ fp32(w) + bias                           # fp32 accumulation
    y = y.to(x.dtype), or with quant_scale: requant to int8 (fixpipe, as npu_quant_matmul)

The float GEMM's summation order differs from the cube unit's, so agreement with the NPU is to
float rounding, not bit-exact (unlike :func:`npu_quant_matmul`).
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.ascend._qmm_checks import is_transposed_view
from opsnn_quant.ascend.int4 import unpack_int4
from opsnn_quant.ascend.params import npu_trans_quant_param, requant_int8
from opsnn_quant.errors import ShapeError

OP = "npu_weight_quant_batchmatmul"
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _weight_values(weight: torch.Tensor) -> torch.Tensor:
    """int8 (..., K, N); an int32 weight holds eight int4 values per element (along N, or along
    K for a transposed view of a contiguous (N, K // 8), as op-plugin infers from the strides)."""
    if weight.dtype == torch.int8:
        return weight
    if is_transposed_view(weight):
        return unpack_int4(weight.transpose(-1, -2)).transpose(-1, -2)
    if not weight.is_contiguous():
        raise ShapeError(f"{OP}: an int4 weight (int32) must be contiguous or a transposed view")
    return unpack_int4(weight)


def _per_channel(t: torch.Tensor, k: int, n: int, group: int, name: str) -> torch.Tensor:
    """Broadcastable (rows, N): per-tensor (1,)/(1, 1), per-channel (N,)/(1, N), or per-group
    (ceil(K / group), N) repeated along K."""
    if t.numel() == 1 and t.dim() <= 2:
        return t.reshape(1, 1)
    if group > 0:
        groups = -(-k // group)
        if t.dim() != 2 or tuple(t.shape) != (groups, n):
            raise ShapeError(
                f"{OP}: per-group {name} must be ({groups}, {n}), got {tuple(t.shape)}"
            )
        return t.repeat_interleave(group, dim=0)[:k]
    if t.dim() > 2 or t.numel() != n or (t.dim() == 2 and t.shape[0] != 1):
        raise ShapeError(
            f"{OP}: {name} must be (1,), (1, 1), ({n},) or (1, {n}) without antiquant_group_size, "
            f"got {tuple(t.shape)}"
        )
    return t.reshape(1, n)


def _check_batch(x: torch.Tensor, w: torch.Tensor) -> None:
    """op-plugin: equal ranks need equal batch dims (no broadcast); a 2-D side broadcasts."""
    if min(x.dim(), w.dim()) > 2 and (x.dim() != w.dim() or x.shape[:-2] != w.shape[:-2]):
        raise ShapeError(
            f"{OP}: batched x {tuple(x.shape)} and weight {tuple(w.shape)} must have the same "
            "batch dims (torch_npu does not broadcast them)"
        )


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
    weight_dtype: torch.dtype | int | None = None,
) -> torch.Tensor:
    """Weight-only int8/int4 matmul (W8A16/W4A16), as ``torch_npu.npu_weight_quant_batchmatmul``.

    Release lines: the 2.1 and 2.6 signatures end at ``inner_precise``; ``weight_dtype`` exists in
    the latest (master) only. Behaviour follows Atlas A2/A3; the int64 ``antiquant_scale`` mode
    (fp16 x, M <= 96) and FRACTAL_NZ weights are not supported and raise :class:`ShapeError`.

    Args:
        x: fp16/bf16 (fp32 accepted by the reference) (..., M, K).
        weight: int8 (..., K, N) (a transposed view of (N, K) too), or int32 holding eight int4
            values each: contiguous (K, N // 8), or a (K // 8, N) transposed view of a contiguous
            (N, K // 8) as ``npu_convert_weight_to_int4pack`` makes. Batched weights need x of the
            same rank and batch dims (a 2-D weight broadcasts over x's batch).
        antiquant_scale: float, converted to x's dtype: (1,)/(1, 1) per tensor, (N,)/(1, N) per
            channel, or (ceil(K / antiquant_group_size), N) per group.
        antiquant_offset: optional, same shape as ``antiquant_scale``.
        quant_scale: optional fp32 or int64 (from ``npu_trans_quant_param``) (1,), (N,) or
            (1, N): int8 output, requantized by the fixpipe as ``npu_quant_matmul`` does.
        quant_offset: optional fp32, same shape as ``quant_scale`` (packed with an fp32 scale;
            an int64 ``quant_scale`` carries its own).
        bias: optional (N,) or (1, N), added in fp32 before the output rounding.
        antiquant_group_size: 0 (per tensor/channel) or the group size along K. torch_npu takes a
            multiple of 32 in [32, K - 1]; the reference accepts any positive size.
        inner_precise: 0 or 1 (a performance mode on the NPU; no effect here).
        weight_dtype: None or ``weight``'s own dtype (other values reinterpret the weight as
            HiFloat8/FP8/FP4, Ascend 950, and raise).

    Returns:
        (..., M, N) in ``x``'s dtype, or int8 with ``quant_scale``.
    """
    _check_modes(x, weight, antiquant_scale, quant_scale, quant_offset, antiquant_group_size,
                 inner_precise, weight_dtype)  # fmt: skip
    w_int = _weight_values(weight)
    _check_batch(x, w_int)
    k, n = w_int.shape[-2], w_int.shape[-1]
    if x.shape[-1] != k:
        raise ShapeError(f"{OP}: the K of x ({x.shape[-1]}) and of weight ({k}) differ")
    w = _antiquant(w_int, antiquant_scale, antiquant_offset, antiquant_group_size, x.dtype)
    y = torch.matmul(x.to(torch.float32), w.to(torch.float32))
    if bias is not None:
        require_dtype("bias", bias, _FLOATS, OP)
        if bias.numel() != n or bias.dim() > 2:
            raise ShapeError(f"{OP}: bias must be ({n},) or (1, {n}), got {tuple(bias.shape)}")
        y = y + bias.to(torch.float32).reshape(-1)
    if quant_scale is None:
        return y.to(x.dtype)
    return _requant(y, quant_scale, quant_offset, n)


def _check_modes(
    x: torch.Tensor,
    weight: torch.Tensor,
    antiquant_scale: torch.Tensor,
    quant_scale: torch.Tensor | None,
    quant_offset: torch.Tensor | None,
    antiquant_group_size: int,
    inner_precise: int,
    weight_dtype: torch.dtype | int | None,
) -> None:
    """The dtypes and modes :func:`npu_weight_quant_batchmatmul` takes (shapes checked after)."""
    require_dtype("x", x, _FLOATS, OP)
    require_dtype("weight", weight, (torch.int8, torch.int32), OP)
    if weight_dtype is not None and weight_dtype != weight.dtype:
        raise ShapeError(f"{OP}: weight_dtype={weight_dtype} (Ascend 950 types) is not supported")
    if inner_precise not in (0, 1):
        raise ShapeError(f"{OP}: inner_precise must be 0 or 1, got {inner_precise}")
    if antiquant_group_size < 0:
        raise ShapeError(f"{OP}: antiquant_group_size must be >= 0, got {antiquant_group_size}")
    if quant_offset is not None and quant_scale is None:
        raise ShapeError(f"{OP}: quant_offset needs quant_scale")
    if antiquant_scale.dtype == torch.int64:
        raise ShapeError(
            f"{OP}: an int64 antiquant_scale (packed per-channel mode) is not supported"
        )
    require_dtype("antiquant_scale", antiquant_scale, _FLOATS, OP)
    if x.dim() < 2 or weight.dim() < 2:
        raise ShapeError(f"{OP}: x and weight need at least 2 dims")


def _antiquant(
    w_int: torch.Tensor,
    antiquant_scale: torch.Tensor,
    antiquant_offset: torch.Tensor | None,
    group_size: int,
    dt: torch.dtype,
) -> torch.Tensor:
    """``(w + offset) * scale`` in x's dtype ``dt``, rounded as the kernel's vector unit does."""
    k, n = w_int.shape[-2], w_int.shape[-1]
    scale = _per_channel(antiquant_scale, k, n, group_size, "antiquant_scale").to(dt)
    w = w_int.to(dt)
    if antiquant_offset is not None:
        require_dtype("antiquant_offset", antiquant_offset, _FLOATS, OP)
        if antiquant_offset.shape != antiquant_scale.shape:
            raise ShapeError(f"{OP}: antiquant_offset must have antiquant_scale's shape")
        w = w + _per_channel(antiquant_offset, k, n, group_size, "antiquant_offset").to(dt)
    return w * scale


def _requant(
    y: torch.Tensor, quant_scale: torch.Tensor, quant_offset: torch.Tensor | None, n: int
) -> torch.Tensor:
    """The int8 output: ``y`` requantized by the fixpipe as ``npu_quant_matmul`` does."""
    require_dtype("quant_scale", quant_scale, (torch.float32, torch.int64), OP)
    if quant_scale.numel() not in (1, n) or quant_scale.dim() > 2:
        raise ShapeError(f"{OP}: quant_scale must be (1,), ({n},) or (1, {n})")
    if quant_scale.dtype == torch.float32:
        if quant_offset is not None:
            require_dtype("quant_offset", quant_offset, (torch.float32,), OP)
            if quant_offset.shape != quant_scale.shape:
                raise ShapeError(f"{OP}: quant_offset must have quant_scale's shape")
        packed = npu_trans_quant_param(quant_scale, quant_offset)  # aclnnTransQuantParamV2
    else:
        packed = quant_scale
    return requant_int8(y, packed)
