"""int4 values carried in int32: the layout torch_npu uses for ``quint4x2`` / int4 tensors.

Eight signed 4-bit values share one int32, the first in the lowest nibble (bits 0..3), the eighth
in bits 28..31, along the last axis: an int4 tensor of shape (..., n) is stored as int32
(..., n // 8). Sources: op-plugin ``op_plugin/ops/opapi/ConvertWeightToINT4PackKernelNpuOpApi.cpp``
``convert_to_int4_pack`` and the ``int4s_to_int32`` / ``unpack_int4_lsb_first_signed`` helpers of
op-plugin ``test/test_custom_ops/test_npu_quantize.py`` and ``test_npu_quant_matmul.py``.
"""

from __future__ import annotations

import sys

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.errors import ShapeError

INT4_PER_INT32 = 8
INT4_MIN, INT4_MAX = -8, 7
_SHIFTS = tuple(4 * j for j in range(INT4_PER_INT32))


@torch.no_grad()
def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Pack integers in [-8, 7] along the last axis, eight per int32 (first in the low nibble).

    Args:
        values: integer tensor (..., n), n a multiple of 8, every value in [-8, 7].

    Returns:
        int32 tensor (..., n // 8).
    """
    if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
        raise ShapeError(f"pack_int4: values must be an integer tensor, got {values.dtype}")
    if values.dim() == 0 or values.shape[-1] % INT4_PER_INT32:
        raise ShapeError(
            f"pack_int4: the last dim must be a multiple of 8, got shape {tuple(values.shape)}"
        )
    if values.numel():
        lo, hi = torch.aminmax(values)
        if int(lo) < INT4_MIN or int(hi) > INT4_MAX:
            raise ShapeError("pack_int4: values must lie in the int4 range [-8, 7]")
    if not values.numel():
        words = (*values.shape[:-1], values.shape[-1] // INT4_PER_INT32)
        return torch.zeros(words, dtype=torch.int32, device=values.device)
    if sys.byteorder == "little":
        # Byte j of a little-endian word holds values 2j (low nibble) and 2j + 1 (high): pack
        # bytes and view them as int32. The int64 words below took 4 copies of 8 bytes per
        # value at once (850 MB for Whisper's 512 x 51864 LM head, the probe's peak).
        v8 = values.to(torch.int8)
        pairs = v8.reshape(*v8.shape[:-1], v8.shape[-1] // 2, 2).view(torch.uint8) & 0xF
        packed = pairs[..., 0] | (pairs[..., 1] << 4)
        return packed.contiguous().view(torch.int32)
    v = values.to(torch.int64)
    nibbles = (v & 0xF).reshape(*v.shape[:-1], -1, INT4_PER_INT32)
    word = torch.zeros(nibbles.shape[:-1], dtype=torch.int64, device=v.device)
    for j, shift in enumerate(_SHIFTS):
        word |= nibbles[..., j] << shift
    # Bits 28..31 hold the eighth value; reinterpret the 32-bit word as two's complement.
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


@torch.no_grad()
def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int32 (..., m) -> int8 (..., 8 * m) with values in [-8, 7]."""
    require_dtype("packed", packed, (torch.int32,), "unpack_int4")
    if sys.byteorder != "little" or packed.dim() == 0:
        word = packed.to(torch.int64) & 0xFFFFFFFF
        parts = [(word >> shift) & 0xF for shift in _SHIFTS]
        nibbles = torch.stack(parts, dim=-1)
        signed = torch.where(nibbles >= 8, nibbles - 16, nibbles)
        return signed.reshape(*packed.shape[:-1], -1).to(torch.int8)
    # Little-endian bytes of each word: byte j holds values 2j (low nibble) and 2j + 1. Each
    # nibble moved to the top of an int8 and shifted back arithmetically is its signed value.
    raw = packed.contiguous().view(torch.uint8)
    nibbles = torch.stack([raw << 4, raw & 0xF0], dim=-1).view(torch.int8) >> 4
    return nibbles.reshape(*packed.shape[:-1], -1)


@torch.no_grad()
def npu_convert_weight_to_int4pack(weight: torch.Tensor, inner_k_tiles: int = 0) -> torch.Tensor:
    """Pack an int32 int4-valued weight eight per int32, as ``torch_npu.npu_convert_weight_to_int4pack``.

    Follows Atlas A2/A3 (the API doc's products): a contiguous 2-D ``int32`` weight (k, n) or
    (n, k) whose last dim is a multiple of 8 and whose values lie in [-8, 7] becomes int32
    (k, n // 8) / (n, k // 8). The float32 -> FP4 (e2m1) packing and 3-D weights exist only on
    Ascend 950 and raise :class:`ShapeError` here; the NPU's FRACTAL_NZ output format has no CPU
    counterpart (the reference always returns ND).

    Args:
        weight: int32 (k, n) or (n, k), contiguous.
        inner_k_tiles: reserved by torch_npu ("预留参数，暂未使用"); accepted and ignored.

    Returns:
        int32 tensor with the last dim divided by 8.
    """
    op = "npu_convert_weight_to_int4pack"
    del inner_k_tiles  # reserved, unused on the NPU too
    if weight.dtype == torch.float32:
        raise ShapeError(f"{op}: float32 (FP4 e2m1) packing is Ascend 950 only; not supported")
    require_dtype("weight", weight, (torch.int32,), op)
    if weight.dim() != 2:
        raise ShapeError(f"{op}: weight must be 2-D on Atlas A2/A3, got {weight.dim()}-D")
    if not weight.is_contiguous():
        raise ShapeError(f"{op}: weight must be contiguous (torch_npu rejects a strided weight)")
    if weight.numel() == 0 or weight.shape[-1] % INT4_PER_INT32:
        raise ShapeError(
            f"{op}: weight's last dim must be a positive multiple of 8, got {tuple(weight.shape)}"
        )
    return pack_int4(weight)
