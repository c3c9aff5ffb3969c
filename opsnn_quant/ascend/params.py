"""``npu_trans_quant_param``: packing of dequantization scales into Ascend's int64 format.

Source: torch_npu ``npu_trans_quant_param`` and ops-nn ``TransQuantParamV2`` / ``aclnnTransQuantParamV3``
docs. The hardware's fixpipe multiplies the int32 accumulator by an FP19 scale (fp32 with the low
13 mantissa bits dropped: 1 sign, 8 exponent, 10 mantissa bits) and optionally adds a 9-bit offset
before requantizing to int8::

    out  = (bits(scale) & 0xFFFFE000) | (1 << 46)          # FP19 truncation, flag bit 46
    off  = clamp(round(offset), -256, 255)
    out  = (out & 0x4000FFFFFFFF) | ((off & 0x1FF) << 37)  # offset in bits 37..45

``round_mode=1`` (``aclnnTransQuantParamV3``, torch_npu 2.6+) rounds the scale to FP19 instead of
truncating it, as ops-nn ``quant/trans_quant_param_v2/op_kernel/trans_quant_param_v2.h``
``CalQuantPreScaleValue`` does: the 10 kept mantissa bits are rounded to nearest with ties to even
(round bit 12, sticky bits 0..11), a carry moves into the exponent, and a zero or subnormal scale
(exponent field 0) becomes a signed zero. NaN/Inf scales are rejected here (the kernel would pass
them through truncated). The torch_npu 2.1 line (op-plugin 7.0.0) has no ``round_mode``.
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.errors import ShapeError

FP19_MASK = 0xFFFFE000
FLAG_BIT = 1 << 46
OFFSET_SHIFT = 37
OFFSET_BITS = 0x1FF
_KEEP_SCALE_AND_FLAG = 0x4000FFFFFFFF


def _float_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 tensor -> its IEEE bit pattern as int64 in [0, 2**32)."""
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bits_float(bits: torch.Tensor) -> torch.Tensor:
    """int64 bit patterns in [0, 2**32) -> fp32 tensor."""
    signed = torch.where(bits >= 2**31, bits - 2**32, bits)
    return signed.to(torch.int32).view(torch.float32)


@torch.no_grad()
def fp19(scale: torch.Tensor, round_mode: int = 0) -> torch.Tensor:
    """Round an fp32 tensor to the FP19 grid the way ``npu_trans_quant_param`` does.

    Args:
        scale: fp32 tensor.
        round_mode: 0 truncates the low 13 mantissa bits; 1 rounds to nearest, ties to even, and
            flushes subnormals to signed zero (see module docstring).

    Returns:
        fp32 tensor whose values are representable in FP19.
    """
    bits = _float_bits(scale.to(torch.float32))
    if round_mode == 1:
        sign = bits & 0x80000000
        exponent = (bits >> 23) & 0xFF
        magnitude = bits & 0x7FFFFFFF
        kept_lsb = (magnitude >> 13) & 1
        round_bit = (magnitude >> 12) & 1
        sticky = magnitude & 0xFFF
        round_up = (round_bit == 1) & ((sticky != 0) | (kept_lsb == 1))
        # Adding one FP19 ulp to exponent|mantissa carries into the exponent exactly as the
        # kernel's "mantissa overflow -> exponent + 1" branch does.
        rounded = (magnitude & 0x7FFFE000) + torch.where(round_up, 0x2000, 0)
        finite = (exponent != 0) & (exponent != 0xFF)
        bits = sign | torch.where(finite, rounded, torch.where(exponent == 0, 0, magnitude))
    return _bits_float(bits & FP19_MASK)


@torch.no_grad()
def npu_trans_quant_param(
    scale: torch.Tensor, offset: torch.Tensor | None = None, round_mode: int = 0
) -> torch.Tensor:
    """Pack fp32 dequantization scales (and offsets) into Ascend's int64 quant parameter.

    Same name, arguments and defaults as ``torch_npu.npu_trans_quant_param``.

    Args:
        scale: fp32, shape (t,) or (1, t), t = 1 or n.
        offset: optional fp32, shape (t,) or (1, t); rounded, clamped to [-256, 255], 9 bits kept.
        round_mode: 0 (truncate to FP19, the V2 behaviour) or 1 (round to nearest FP19, ties to
            even, subnormals to signed zero; torch_npu 2.6+).

    Returns:
        int64 tensor: for 1-D inputs of size max(len(scale), len(offset)); for 2-D the shape of scale.
    """
    op = "npu_trans_quant_param"
    require_dtype("scale", scale, (torch.float32,), op)
    if round_mode not in (0, 1):
        raise ShapeError(f"{op}: round_mode must be 0 or 1, got {round_mode}")
    if scale.dim() not in (1, 2):
        raise ShapeError(f"{op}: scale must be 1-D or 2-D, got shape {tuple(scale.shape)}")
    if not torch.isfinite(scale).all():
        raise ShapeError(f"{op}: scale contains NaN or Inf")
    scale_bits = _float_bits(fp19(scale, round_mode)) if round_mode else _float_bits(scale)
    out = (scale_bits & FP19_MASK) | FLAG_BIT
    if offset is None:
        return out
    require_dtype("offset", offset, (torch.float32,), op)
    if not torch.isfinite(offset).all():
        raise ShapeError(f"{op}: offset contains NaN or Inf")
    if scale.dim() == 1:
        n = max(scale.numel(), offset.reshape(-1).numel())
        out = out.expand(n) if out.numel() == 1 else out
        offset = offset.reshape(-1)
        offset = offset.expand(n) if offset.numel() == 1 else offset
        if out.numel() != offset.numel():
            raise ShapeError(
                f"{op}: scale and offset sizes differ ({scale.numel()} vs {offset.numel()})"
            )
    off = torch.round(offset).clamp(-256, 255).to(torch.int64)
    return (out & _KEEP_SCALE_AND_FLAG) | ((off & OFFSET_BITS) << OFFSET_SHIFT)


@torch.no_grad()
def unpack_quant_param(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`npu_trans_quant_param`: int64 -> (fp32 FP19 scale, fp32 integer offset).

    The offset is the 9-bit two's-complement field of bits 37..45 (0 when none was packed).
    """
    require_dtype("packed", packed, (torch.int64,), "unpack_quant_param")
    scale = _bits_float(packed & FP19_MASK)
    field = (packed >> OFFSET_SHIFT) & OFFSET_BITS
    offset = torch.where(field >= 256, field - 512, field).to(torch.float32)
    return scale, offset


@torch.no_grad()
def requant_int8(value: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The fixpipe's int8 requantization with a packed quant parameter.

    ``clip(clip(rint(value * fp19_scale), -256, 255) + offset9, -128, 127)``: the scaled value is
    rounded and saturated to 9 bits before the 9-bit offset is added (ops-nn
    ``matmul/quant_batch_matmul_v3/tests/assets/qbmmv3_kernel_golden.py`` ``compute_requant`` with
    ``matmul_quant_util.f32_2_s9``).

    Args:
        value: fp32 (..., N) (the int32 accumulator converted to fp32, or a float matmul result).
        packed: int64 (1,), (N,) or (1, N) from :func:`npu_trans_quant_param`.

    Returns:
        int8 tensor of ``value``'s shape.
    """
    scale, offset = unpack_quant_param(packed.reshape(-1))
    s9 = torch.round_(value.to(torch.float32) * scale).clamp_(-256, 255)
    return s9.add_(offset).clamp_(-128, 127).to(torch.int8)
