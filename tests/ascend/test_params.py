"""npu_trans_quant_param / unpack_quant_param against hand-computed bit patterns."""

import struct

import numpy as np
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
    # Issue 13 corrected the tie case: 0x3F801000 is exactly half an FP19 ulp above 1.0 and the
    # kernel rounds ties to even (mantissa ...0 stays), where an earlier reading rounded it up.
    scale = torch.tensor([f32(0x3F801000), f32(0x3F800FFF), f32(0x3FFFF000), f32(0x3F803000)])
    out = npu_trans_quant_param(scale, round_mode=1)
    # tie to even (down); below half rounds down; a carry moves into the exponent; tie to even (up).
    assert out.tolist() == [
        0x3F800000 | FLAG,
        0x3F800000 | FLAG,
        0x40000000 | FLAG,
        0x3F804000 | FLAG,
    ]
    assert fp19(torch.tensor([f32(0x3F801000)]), 1).item() == 1.0
    assert fp19(torch.tensor([f32(0x3F801001)]), 1).item() == f32(0x3F802000)  # above half: up


def _kernel_round_mode_1(bits: int) -> int:
    """Golden, scalar: ops-nn quant/trans_quant_param_v2/op_kernel/trans_quant_param_v2.h
    CalQuantPreScaleValue (roundMode_ != 0), transcribed field by field."""
    sign = (bits >> 31) & 1
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    m19 = mantissa >> 13
    round_bit = (mantissa >> 12) & 1
    sticky = mantissa & 0xFFF
    if exponent == 0:
        fp19_bits = sign << 18
    elif exponent == 0xFF:
        fp19_bits = (sign << 18) | (exponent << 10) | m19
    else:
        if round_bit and (sticky or (m19 & 1)):
            m19 += 1
            if m19 >= 1 << 10:
                m19 = 0
                exponent += 1
        fp19_bits = (sign << 18) | (exponent << 10) | m19
    return (fp19_bits << 13) | FLAG


def test_round_mode_1_matches_the_kernel_bit_by_bit():
    g = np.random.default_rng(13)
    bits = g.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    bits = bits[(bits >> 23) & 0xFF != 0xFF]  # NaN/Inf are rejected by the reference
    # Force ties, near-ties, exponent carries, subnormals and signed zeros into the sample.
    extra = [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x007FF000, 0x7F7FF000, 0xBF801000]
    bits = np.concatenate([bits, np.array(extra, dtype=np.uint32)])
    bits = np.concatenate([bits, (bits & np.uint32(0xFFFFE000)) | np.uint32(0x1000)])
    scale = torch.from_numpy(bits.view(np.float32).copy())
    got = npu_trans_quant_param(scale, round_mode=1).tolist()
    want = [_kernel_round_mode_1(int(b)) for b in bits]
    assert got == want


def test_round_mode_1_flushes_subnormals_to_signed_zero():
    scale = torch.tensor([f32(0x00000001), f32(0x807FFFFF), -0.0, 0.0])
    out = npu_trans_quant_param(scale, round_mode=1)
    assert out.tolist() == [FLAG, 0x80000000 | FLAG, 0x80000000 | FLAG, FLAG]
    # round_mode 0 keeps the truncated subnormal bits (the kernel's V2 branch does no flushing)
    out0 = npu_trans_quant_param(torch.tensor([f32(0x807FFFFF)]))
    assert out0.tolist() == [0x807FE000 | FLAG]


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
