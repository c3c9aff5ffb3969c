"""Argument checks of ``npu_quant_matmul``: the dtype/shape combinations torch_npu documents.

Source: torch_npu ``npu_quant_matmul`` API doc, "表 2" (Atlas A2/A3) dtype combinations, and
op-plugin ``op_plugin/ops/opapi/QuantMatmulKernelNpuOpApi.cpp`` (batch broadcast, int4 packing,
``group_sizes`` range). Every unsupported combination raises a one-line :class:`ShapeError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from opsnn_quant.ascend._checks import require_dtype, require_vector
from opsnn_quant.errors import ShapeError

OP = "npu_quant_matmul"
MAX_K = 65535
GROUP_MAX = 65535
# G-B (pergroup-perblock) is the one group mode of int8 x int8 on Atlas A2/A3 (aclnnQuantMatmulV5
# doc: "[groupSizeM, groupSizeN, groupSizeK] ... G-B ... 仅支持 [1, 128, 128]").
GB_GROUPS = (1, 128, 128)
_OUT = (None, torch.int8, torch.float16, torch.bfloat16, torch.int32)
_FLOAT_BIAS = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Plan:
    """What the checks decided: real (unpacked) M/K/N, the batch shape, and the group mode."""

    int4: bool
    m: int
    k: int
    n: int
    batch: tuple[int, ...]
    groups: tuple[int, int, int] | None


def check_dtype_args(**pairs: tuple[torch.dtype | int | None, torch.Tensor | None]) -> None:
    """``x1_dtype`` & co. (torch_npu 2.6+): only ``None`` or the tensor's own dtype is a no-op.

    torch_npu uses them to reinterpret a tensor's bytes as float8/HiFloat8/FP4/E8M0 (Ascend 950
    modes); the reference has no such types, so any other value raises.
    """
    for name, (value, tensor) in pairs.items():
        if value is None or (tensor is not None and value == tensor.dtype):
            continue
        raise ShapeError(
            f"{OP}: {name}={value} reinterprets a tensor (fp8/HiFloat8/FP4 modes, Ascend 950); "
            "not supported by the reference"
        )


def is_transposed_view(t: torch.Tensor) -> bool:
    """op-plugin ``is_transpose_last_two_dims``: ``t`` is a transpose of a contiguous tensor."""
    if not 2 <= t.dim() <= 6 or t.stride(-2) != 1 or t.stride(-1) != t.shape[-2]:
        return False
    expected = t.shape[-1] * t.shape[-2]
    for d in range(t.dim() - 3, -1, -1):
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return not (t.shape[-1] == 1 and t.shape[-2] == 1)


def _batch(x1: torch.Tensor, x2: torch.Tensor) -> tuple[int, ...]:
    """Broadcast batch dims as ``infer_out_batch_shape`` (right-aligned, 1 broadcasts)."""
    b1, b2 = tuple(x1.shape[:-2]), tuple(x2.shape[:-2])
    width = max(len(b1), len(b2))
    b1, b2 = (1,) * (width - len(b1)) + b1, (1,) * (width - len(b2)) + b2
    out = []
    for a, b in zip(b1, b2, strict=True):
        if a > 1 and b > 1 and a != b:
            raise ShapeError(f"{OP}: batch dims {b1} and {b2} do not broadcast")
        out.append(max(a, b))
    return tuple(out)


def _groups(group_sizes: Sequence[int] | None) -> tuple[int, int, int] | None:
    if group_sizes is None:
        return None
    g = tuple(int(v) for v in group_sizes)
    if len(g) != 3 or not all(0 <= v <= GROUP_MAX for v in g):
        raise ShapeError(f"{OP}: group_sizes must be 3 values in [0, 65535], got {list(g)}")
    return None if g == (0, 0, 0) else (g[0], g[1], g[2])


def _check_bias(bias: torch.Tensor, n: int, batch: tuple[int, ...]) -> None:
    require_dtype("bias", bias, (torch.int32, *_FLOAT_BIAS), OP)
    ok = bias.shape[-1] == n and (
        bias.dim() == 1
        or (bias.dim() == 2 and bias.shape[0] == 1)  # (1, N): torch_npu 2.6 doc
        or (bias.dim() == 3 and bias.shape[1] == 1 and batch == (bias.shape[0],))
    )
    if not ok:
        raise ShapeError(
            f"{OP}: bias must be (N,), (1, N) or (batch, 1, N) with a 3-D output, "
            f"got {tuple(bias.shape)}"
        )


def _check_combination(
    plan: Plan,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    pertoken_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.dtype,
) -> None:
    """The rows of the doc's dtype table (Atlas A2/A3) for per-tensor/per-channel modes."""
    bias_t = None if bias is None else bias.dtype
    float_bias = bias_t in _FLOAT_BIAS
    if pertoken_scale is not None:
        require_dtype("pertoken_scale", pertoken_scale, (torch.float32,), OP)
        if pertoken_scale.dim() != 1 or pertoken_scale.numel() != plan.m:
            raise ShapeError(
                f"{OP}: pertoken_scale must be 1-D with M={plan.m} elements, "
                f"got {tuple(pertoken_scale.shape)}"
            )
        if out not in (torch.float16, torch.bfloat16):
            raise ShapeError(f"{OP}: pertoken_scale needs output_dtype float16 or bfloat16")
        if scale.dtype == torch.int64:
            raise ShapeError(f"{OP}: with pertoken_scale, scale must be float32 or bfloat16")
        if out == torch.float16 and scale.dtype != torch.float32:
            raise ShapeError(f"{OP}: float16 output with pertoken_scale takes a float32 scale")
    if offset is not None:
        require_dtype("offset", offset, (torch.float32,), OP)
        require_vector("offset", offset, (1, plan.n), OP)
        if out != torch.int8:
            raise ShapeError(f"{OP}: offset is only supported with int8 output")
        if float_bias:
            raise ShapeError(f"{OP}: a floating bias cannot be combined with offset")
    if out == torch.bfloat16 and scale.dtype == torch.int64:
        raise ShapeError(f"{OP}: bfloat16 output takes a float32/bfloat16 scale, not int64")
    if out in (torch.int8, torch.float16) and pertoken_scale is None:
        if scale.dtype == torch.bfloat16:
            raise ShapeError(f"{OP}: int8/float16 output takes an int64 or float32 scale")
        if float_bias:
            raise ShapeError(
                f"{OP}: int8/float16 output without pertoken_scale takes an int32 bias"
            )
    if out == torch.int32 and (scale.dtype == torch.int64 or float_bias):
        raise ShapeError(f"{OP}: int32 output takes a float32/bfloat16 scale and an int32 bias")
    if plan.int4:
        if out not in (torch.float16, torch.bfloat16) or float_bias:
            raise ShapeError(f"{OP}: int4 inputs give float16/bfloat16 output with an int32 bias")
        if out == torch.bfloat16 and pertoken_scale is None:
            raise ShapeError(f"{OP}: int4 inputs give bfloat16 output only with pertoken_scale")


def _check_gb(
    plan: Plan,
    scale: torch.Tensor,
    pertoken_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    offset: torch.Tensor | None,
    out: torch.dtype,
) -> None:
    """G-B (pergroup-perblock) int8 mode: scales (M, ceil(K/128)) and (ceil(K/128), ceil(N/128))."""
    if plan.int4 or plan.groups != GB_GROUPS:
        raise ShapeError(
            f"{OP}: group_sizes {list(plan.groups or ())} are not supported: the reference "
            "implements G-B [1, 128, 128] for int8 inputs only"
        )
    kb, nb = -(-plan.k // 128), -(-plan.n // 128)
    if pertoken_scale is None or pertoken_scale.shape != (plan.m, kb) or plan.batch:
        raise ShapeError(f"{OP}: G-B needs 2-D inputs and pertoken_scale of shape ({plan.m}, {kb})")
    require_dtype("pertoken_scale", pertoken_scale, (torch.float32,), OP)
    require_dtype("scale", scale, (torch.float32,), OP)
    if scale.shape != (kb, nb):
        raise ShapeError(f"{OP}: G-B needs scale of shape ({kb}, {nb}), got {tuple(scale.shape)}")
    if offset is not None or (bias is not None and bias.dtype != torch.float32):
        raise ShapeError(f"{OP}: G-B takes no offset and an optional float32 bias")
    if out not in (torch.float16, torch.bfloat16):
        raise ShapeError(f"{OP}: G-B gives float16 or bfloat16 output")


def check_quant_matmul(
    x1: torch.Tensor,
    x2: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    pertoken_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    output_dtype: torch.dtype | None,
    group_sizes: Sequence[int] | None,
) -> Plan:
    """Validate every argument; returns the shapes and mode the computation needs."""
    require_dtype("x1", x1, (torch.int8, torch.int32), OP)
    require_dtype("x2", x2, (torch.int8, torch.int32), OP)
    if x1.dtype != x2.dtype:
        raise ShapeError(
            f"{OP}: x1 and x2 must both be int8 or both int32 (int4 x8), A8W4 is not supported"
        )
    if not (2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6):
        raise ShapeError(f"{OP}: x1 and x2 must have 2 to 6 dims, got {x1.dim()} and {x2.dim()}")
    int4 = x1.dtype == torch.int32
    if int4 and not x1.is_contiguous():
        raise ShapeError(f"{OP}: an int4 x1 (int32, 8 values each) must be contiguous (m, k // 8)")
    k = x1.shape[-1] * (8 if int4 else 1)
    x2_k = x2.shape[-2] * (8 if int4 and is_transposed_view(x2) else 1)
    n = x2.shape[-1] * (8 if int4 and not is_transposed_view(x2) else 1)
    if x2_k != k:
        raise ShapeError(
            f"{OP}: K mismatch: x1 is {tuple(x1.shape)} and x2 is {tuple(x2.shape)} (x2 is (K, N))"
        )
    if k > MAX_K:
        raise ShapeError(f"{OP}: K={k} exceeds the supported maximum {MAX_K}")
    if output_dtype not in _OUT:
        raise ShapeError(f"{OP}: output_dtype must be None, int8, float16, bfloat16 or int32")
    out = torch.int8 if output_dtype is None else output_dtype
    plan = Plan(int4, x1.shape[-2], k, n, _batch(x1, x2), _groups(group_sizes))
    require_dtype("scale", scale, (torch.float32, torch.int64, torch.bfloat16), OP)
    if bias is not None:
        _check_bias(bias, n, plan.batch)
    if plan.groups is not None:
        _check_gb(plan, scale, pertoken_scale, bias, offset, out)
        return plan
    require_vector("scale", scale, (1, n), OP)
    _check_combination(plan, scale, offset, pertoken_scale, bias, out)
    return plan
