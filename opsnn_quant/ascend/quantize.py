"""Static activation quantization: ``npu_quantize`` (Quantize in divide mode, AscendQuantV2 in multiply).

Sources: torch_npu ``npu_quantize`` API doc; op-plugin ``op_plugin/ops/opapi/QuantizeKernelNpuOpApi.cpp``
(``div_mode=True`` -> ``aclnnQuantize``, ``False`` -> ``aclnnAscendQuant``/``V3``) and
``op_plugin/ops/aclops/QuantizeKernelNpu.cpp`` (``quantize_reshape_size``: scales reshaped along
``axis``); ops-nn ``quant/quantize/tests/assets/golden.py`` ``quantize_golden`` and
``quant/ascend_quant_v2/tests/assets/golden.py`` ``ascend_quant_v2_golden``. Both compute in fp32
whatever the input dtype, round half to even (``CAST_RINT``) and saturate to the output range.
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.ascend.int4 import INT4_MAX, INT4_MIN, INT4_PER_INT32, pack_int4
from opsnn_quant.errors import ShapeError

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# Divide mode (aclnnQuantize's dtype map in QuantizeKernelNpuOpApi.cpp): dtype -> (storage, lo, hi).
_DIV_TYPES: dict[torch.dtype, tuple[torch.dtype, int, int]] = {
    torch.qint8: (torch.int8, -128, 127),
    torch.int8: (torch.int8, -128, 127),
    torch.quint8: (torch.uint8, 0, 255),
    torch.uint8: (torch.uint8, 0, 255),
    torch.qint32: (torch.int32, _INT32_MIN, _INT32_MAX),
    torch.int32: (torch.int32, _INT32_MIN, _INT32_MAX),
}
# Multiply mode: qint8 (and int8, its storage type) and quint4x2 (int4 packed eight per int32).
_MUL_TYPES = (torch.qint8, torch.int8, torch.quint4x2)


def _saturate(y: torch.Tensor, lo: int, hi: int, out_dtype: torch.dtype) -> torch.Tensor:
    """rint, NaN -> 0, clamp to [lo, hi], cast; in place on ``y`` (the caller's own temporary).
    int32 limits are clamped in fp64 (2**31-1 is not an fp32 value, and an fp32 2**31 would
    overflow the cast)."""
    y = y.round_().nan_to_num_(nan=0.0)
    if out_dtype == torch.int32:
        return y.to(torch.float64).clamp_(lo, hi).to(torch.int32)
    return y.clamp_(lo, hi).to(out_dtype)


def _div_param(t: torch.Tensor, x: torch.Tensor, axis: int, name: str) -> torch.Tensor:
    """Divide mode: a 1-D ``t`` of size 1 or ``x.shape[axis]``, reshaped to broadcast along axis."""
    if t.dim() != 1 or t.numel() not in (1, x.shape[axis]):
        raise ShapeError(
            f"npu_quantize: {name} must be 1-D with 1 or {x.shape[axis]} (input axis {axis}) "
            f"elements, got shape {tuple(t.shape)}"
        )
    shape = [1] * x.dim()
    shape[axis] = t.numel()
    return t.to(torch.float32).reshape(shape)


def _mul_param(t: torch.Tensor, x: torch.Tensor, ax: int, name: str) -> torch.Tensor:
    """Multiply mode: 1-D (size 1 or axis length) or input-rank with ones except at ``ax``."""
    if t.dim() == x.dim() and x.dim() > 1:
        ok = all(n == 1 for i, n in enumerate(t.shape) if i != ax)
        if ok and t.shape[ax] in (1, x.shape[ax]):
            return t.to(torch.float32)
    elif t.dim() == 1 and t.numel() in (1, x.shape[ax]):
        shape = [1] * x.dim()
        shape[ax] = t.numel()
        return t.to(torch.float32).reshape(shape)
    raise ShapeError(
        f"npu_quantize: {name} has shape {tuple(t.shape)}; multiply mode takes 1-D with 1 or "
        f"{x.shape[ax]} elements (input axis {ax}), or input rank with ones elsewhere"
    )


@torch.no_grad()
def npu_quantize(
    input: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    dtype: torch.dtype,
    axis: int = 1,
    div_mode: bool = True,
) -> torch.Tensor:
    """Quantize a floating tensor, as ``torch_npu.npu_quantize``.

    ``div_mode=True``  (Quantize):       ``y = sat(rint(input / scales + zero_points))``;
    ``div_mode=False`` (AscendQuantV2):  ``y = sat(rint(input * scales + zero_points))``,
    all in fp32; NaN becomes 0.

    Divide mode reshapes 1-D ``scales``/``zero_points`` (size 1 or ``input.shape[axis]``) along
    any ``axis`` in ``[-rank, rank)`` (``QuantizeKernelNpu.cpp`` ``quantize_reshape_size``); with
    one-element scales and zero points ``axis`` is unused (aclnnQuantize doc) and not checked.
    Multiply mode follows AscendQuantV2: ``axis=-2`` is the second-last axis and any ``axis > -2``
    the last one (op-plugin clamps it to -1); ``axis < -2`` raises. Multiply mode takes scales of
    ``input``'s dtype and zero points of the scales' dtype, as torch_npu requires.

    Args:
        input: fp32/fp16/bf16 tensor (any rank for divide mode).
        scales: fp32/fp16/bf16.
        zero_points: optional. Divide mode: int8/uint8/int32/bf16 (fp32 accepted by the
            reference), same size as ``scales``. Multiply mode: same shape and dtype as ``scales``.
        dtype: divide mode: ``torch.qint8``/``int8`` (int8 out), ``torch.quint8``/``uint8``
            (uint8), ``torch.qint32``/``int32`` (int32). Multiply mode: ``torch.qint8``/``int8``,
            or ``torch.quint4x2``: int4 values clipped to [-8, 7], packed eight per int32 along
            the last axis (first value in the low nibble), the last dim divided by 8.
        axis: the per-channel axis (default 1, as torch_npu).
        div_mode: divide (True) or multiply (False) by ``scales``.

    Returns:
        The quantized tensor (``input``'s shape; last dim / 8 for ``quint4x2``).
    """
    op = "npu_quantize"
    require_dtype("input", input, _FLOATS, op)
    require_dtype("scales", scales, _FLOATS, op)
    x = input.to(torch.float32)
    if div_mode:
        if dtype not in _DIV_TYPES:
            raise ShapeError(
                f"{op}: dtype must be qint8, quint8 or qint32 (div_mode=True), got {dtype}"
            )
        if not 1 <= x.dim() <= 8:
            raise ShapeError(f"{op}: div_mode=True takes a 1-D to 8-D input, got {x.dim()}-D")
        per_tensor = scales.numel() == 1 and (zero_points is None or zero_points.numel() == 1)
        # aclnnQuantize: "axis is not used when scales and zeroPoints have size 1".
        if not per_tensor and not -x.dim() <= axis < x.dim():
            raise ShapeError(f"{op}: axis {axis} is outside [-{x.dim()}, {x.dim()})")
        ax = 0 if per_tensor else axis % x.dim()
        y = x / _div_param(scales, x, ax, "scales")
        if zero_points is not None:
            if zero_points.numel() != scales.numel():
                raise ShapeError(f"{op}: zero_points and scales differ in size")
            y.add_(_div_param(zero_points, x, ax, "zero_points"))  # y: this call's own
        out_dtype, lo, hi = _DIV_TYPES[dtype]
        return _saturate(y, lo, hi, out_dtype)
    if dtype not in _MUL_TYPES:
        raise ShapeError(f"{op}: dtype must be qint8 or quint4x2 (div_mode=False), got {dtype}")
    if axis < -2:
        raise ShapeError(
            f"{op}: div_mode=False takes axis -2 or an axis > -2 (the last), got {axis}"
        )
    if x.dim() == 0 or (axis == -2 and x.dim() < 2):
        raise ShapeError(f"{op}: input of shape {tuple(x.shape)} has no axis {axis}")
    if scales.dtype != input.dtype:
        raise ShapeError(f"{op}: div_mode=False needs scales of input's dtype {input.dtype}")
    if zero_points is not None and zero_points.dtype != scales.dtype:
        raise ShapeError(f"{op}: div_mode=False needs zero_points of scales' dtype")
    ax = x.dim() - 2 if axis == -2 else x.dim() - 1
    y = x * _mul_param(scales, x, ax, "scales")
    if zero_points is not None:
        y.add_(_mul_param(zero_points, x, ax, "zero_points"))
    if dtype == torch.quint4x2:
        if x.shape[-1] % INT4_PER_INT32:
            raise ShapeError(
                f"{op}: quint4x2 needs the last dim a multiple of 8, got {x.shape[-1]}"
            )
        return pack_int4(_saturate(y, INT4_MIN, INT4_MAX, torch.int8))
    return _saturate(y, -128, 127, torch.int8)
