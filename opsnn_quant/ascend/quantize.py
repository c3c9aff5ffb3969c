"""Activation quantization: ``npu_quantize`` (AscendQuantV2) and ``npu_dynamic_quant`` (DynamicQuant).

Sources: torch_npu ``npu_quantize`` / ``npu_dynamic_quant`` API docs; ops-nn ``ascend_quant_v2`` and
``dynamic_quant`` operator docs. Both compute in fp32 whatever the input dtype and round half to
even (``rint``), then saturate to the output range.
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.errors import ShapeError

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# dtype argument -> (storage dtype, qmin, qmax); torch_npu takes the quantized dtypes as names.
_OUT_TYPES: dict[torch.dtype, tuple[torch.dtype, int, int]] = {
    torch.qint8: (torch.int8, -128, 127),
    torch.int8: (torch.int8, -128, 127),
    torch.quint8: (torch.uint8, 0, 255),
    torch.uint8: (torch.uint8, 0, 255),
    torch.int32: (torch.int32, -(2**31), 2**31 - 1),
}


def _along_axis(t: torch.Tensor, x: torch.Tensor, axis: int, name: str) -> torch.Tensor:
    """Broadcast a 1-D per-channel tensor along ``axis`` of ``x`` (or pass a full-rank one through)."""
    if t.dim() == x.dim() or t.numel() == 1:
        return t
    if t.dim() != 1:
        raise ShapeError(f"npu_quantize: {name} must be 1-D or of input rank, got {tuple(t.shape)}")
    # torch_npu: "axis只支持最后一维" / axis > -2 means the last axis; -2 the second last.
    ax = x.dim() - 2 if axis == -2 else x.dim() - 1
    if t.numel() != x.shape[ax]:
        raise ShapeError(
            f"npu_quantize: {name} has {t.numel()} elements but input axis {ax} has {x.shape[ax]}"
        )
    shape = [1] * x.dim()
    shape[ax] = t.numel()
    return t.reshape(shape)


@torch.no_grad()
def npu_quantize(
    input: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    dtype: torch.dtype,
    axis: int = 1,
    div_mode: bool = True,
) -> torch.Tensor:
    """Quantize a floating tensor, as ``torch_npu.npu_quantize`` (AscendQuantV2).

    ``div_mode=True``:  ``y = sat(rint(input / scales + zero_points))``;
    ``div_mode=False``: ``y = sat(rint(input * scales + zero_points))``, all in fp32.

    Per-tensor scales have one element; per-channel scales are 1-D along the last axis
    (``axis=-2``: the second last), as torch_npu supports.

    Args:
        input: fp32/fp16/bf16 tensor.
        scales: fp32/fp16/bf16, one element or one per channel.
        zero_points: optional, same layout as ``scales``.
        dtype: ``torch.qint8``/``torch.int8`` (int8 out), ``torch.quint8``/``torch.uint8``
            (uint8 out), or ``torch.int32`` (``div_mode=True`` only).
        axis: the per-channel axis (only the last, or -2, as on the NPU).
        div_mode: divide (True) or multiply (False) by ``scales``.

    Returns:
        Quantized tensor of ``input``'s shape in the storage dtype.
    """
    op = "npu_quantize"
    require_dtype("input", input, _FLOATS, op)
    require_dtype("scales", scales, _FLOATS, op)
    if dtype not in _OUT_TYPES:
        raise ShapeError(f"{op}: dtype must be qint8, quint8 or int32, got {dtype}")
    if not div_mode and _OUT_TYPES[dtype][0] != torch.int8:
        raise ShapeError(f"{op}: div_mode=False supports only dtype=torch.qint8")
    out_dtype, qmin, qmax = _OUT_TYPES[dtype]
    x = input.to(torch.float32)
    s = _along_axis(scales.to(torch.float32), x, axis, "scales")
    y = x / s if div_mode else x * s
    if zero_points is not None:
        y = y + _along_axis(zero_points.to(torch.float32), x, axis, "zero_points")
    return torch.round(y).clamp_(qmin, qmax).to(out_dtype)


@torch.no_grad()
def npu_dynamic_quant(
    input: torch.Tensor,
    *,
    smooth_scales: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    dst_type: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8 quantization, as ``torch_npu.npu_dynamic_quant`` (DynamicQuant).

    ``x' = input * smooth_scales`` (per channel, optional); ``scale = rowmax(|x'|) / 127``;
    ``y = rint(x' / scale)``, all in fp32. A row of zeros gets scale 0 and y = 0 (the NPU docs
    leave this case open; we pick the value that dequantizes back to the input).

    Args:
        input: fp16/bf16 (fp32 accepted by the reference), shape (..., K).
        smooth_scales: optional (K,) per-channel multipliers (SmoothQuant).
        group_index: MoE grouping; not supported by the reference (must be None).
        dst_type: ``None`` or ``torch.int8``.

    Returns:
        ``(y, scale)``: int8 of input's shape, fp32 of ``input.shape[:-1]``.
    """
    op = "npu_dynamic_quant"
    require_dtype("input", input, _FLOATS, op)
    if group_index is not None:
        raise ShapeError(f"{op}: group_index (MoE grouping) is not supported by the reference")
    if dst_type not in (None, torch.int8, torch.qint8):
        raise ShapeError(f"{op}: dst_type must be None or torch.int8, got {dst_type}")
    x = input.to(torch.float32)
    if smooth_scales is not None:
        require_dtype("smooth_scales", smooth_scales, _FLOATS, op)
        if smooth_scales.numel() != x.shape[-1]:
            raise ShapeError(
                f"{op}: smooth_scales has {smooth_scales.numel()} elements, input K is {x.shape[-1]}"
            )
        x = x * smooth_scales.to(torch.float32).reshape(-1)
    scale = x.abs().amax(dim=-1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = torch.round(x / safe.unsqueeze(-1)).clamp_(-128, 127).to(torch.int8)
    return y, scale
