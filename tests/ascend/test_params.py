"""npu_trans_quant_param / unpack_quant_param against hand-computed bit patterns."""

import struct

import pytest
import torch

from opsnn_quant.ascend import fp19, npu_trans_quant_param, unpack_quant_param
from opsnn_quant.errors import ShapeError

FLAG = 1 << 46


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_scale_one_packs_to_its_bits_and_flag():
    out = npu_trans_quant_param(torch.tensor([1.0, 0.5]))
    assert out.dtype == torch.int64
    assert out.tolist() == [0x3F800000 | FLAG, 0x3F000000 | FLAG]


def test_fp19_truncates_low_13_mantissa_bits():
    scale = torch.tensor([f32(0x3F801FFF), f32(0xBF80F123)])
    out = npu_trans_quant_param(scale)
    assert out.tolist() == [0x3F800000 | FLAG, 0xBF80E000 | FLAG]
    back, _ = unpack_quant_param(out)
    assert back.tolist() == [1.0, f32(0xBF80E000)]


def test_round_mode_1_rounds_to_nearest_fp19():
    scale = torch.tensor([f32(0x3F801000), f32(0x3F800FFF), f32(0x3FFFF000)])
    out = npu_trans_quant_param(scale, round_mode=1)
    # half an FP19 ulp rounds up; just below half rounds down; a carry moves into the exponent.
    assert out.tolist() == [0x3F802000 | FLAG, 0x3F800000 | FLAG, 0x40000000 | FLAG]
    assert fp19(torch.tensor([f32(0x3F801000)]), 1).item() == f32(0x3F802000)


def test_negative_and_clamped_offsets_pack_into_bits_37_to_45():
    out = npu_trans_quant_param(
        torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([-3.0, 5.0, 300.0, -300.0])
    )
    base = 0x3F800000 | FLAG
    assert out.tolist() == [
        base | (0x1FD << 37),  # -3 in 9-bit two's complement
        base | (5 << 37),
        base | (0xFF << 37),  # clamped to 255
        base | (0x100 << 37),  # clamped to -256
    ]
    scale, offset = unpack_quant_param(out)
    assert scale.tolist() == [1.0] * 4
    assert offset.tolist() == [-3.0, 5.0, 255.0, -256.0]


def test_scalar_offset_broadcasts_over_scales():
    out = npu_trans_quant_param(torch.tensor([1.0, 2.0]), torch.tensor([-1.0]))
    assert out.tolist() == [0x3F800000 | FLAG | (0x1FF << 37), 0x40000000 | FLAG | (0x1FF << 37)]


def test_bad_inputs_raise_shape_error():
    with pytest.raises(ShapeError, match="scale must be float32"):
        npu_trans_quant_param(torch.tensor([1.0], dtype=torch.float16))
    with pytest.raises(ShapeError, match="NaN or Inf"):
        npu_trans_quant_param(torch.tensor([float("nan")]))
    with pytest.raises(ShapeError, match="round_mode"):
        npu_trans_quant_param(torch.tensor([1.0]), round_mode=2)
