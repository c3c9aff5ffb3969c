"""int4-in-int32 packing: npu_convert_weight_to_int4pack, pack_int4, unpack_int4."""

import numpy as np
import pytest
import torch

from opsnn_quant.ascend import npu_convert_weight_to_int4pack, pack_int4, unpack_int4
from opsnn_quant.errors import ShapeError


def op_plugin_pack_np(w: np.ndarray) -> np.ndarray:
    """Golden: op-plugin test/test_custom_ops/test_npu_convert_weight_to_int4pack.py pack_int4_3dim
    (two nibbles per byte, low first; four bytes per int32, low first), for a 2-D weight."""
    k, n = w.shape
    out = np.zeros((k, n // 8), dtype=np.int64)
    for r in range(k):
        for c in range(n // 8):
            v = [int(w[r, c * 8 + j]) for j in range(8)]
            b = [(v[2 * i] & 0x0F) + ((v[2 * i + 1] & 0x0F) << 4) for i in range(4)]
            word = b[0] + (b[1] << 8) + (b[2] << 16) + (b[3] << 24)
            out[r, c] = word - 2**32 if word >= 2**31 else word
    return out


def test_convert_weight_to_int4pack_matches_the_op_plugin_packer():
    w = np.random.default_rng(0).integers(-8, 8, (5, 24)).astype(np.int32)
    got = npu_convert_weight_to_int4pack(torch.from_numpy(w))
    assert got.dtype == torch.int32 and got.shape == (5, 3)
    assert np.array_equal(got.numpy().astype(np.int64), op_plugin_pack_np(w))
    assert torch.equal(unpack_int4(got), torch.from_numpy(w).to(torch.int8))


def test_pack_int4_hand_computed_word():
    v = torch.tensor([[1, -1, 2, -2, 3, -3, 7, -8]])
    # nibbles 1, F, 2, E, 3, D, 7, 8 from bit 0 upwards
    assert pack_int4(v).item() == 0x87D3E2F1 - 2**32
    assert unpack_int4(pack_int4(v)).tolist() == v.tolist()


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (torch.full((2, 8), 8, dtype=torch.int32), r"\[-8, 7\]"),
        (torch.zeros(2, 12, dtype=torch.int32), "multiple of 8"),
        (torch.zeros(16, 8, dtype=torch.int32).t(), "contiguous"),
        (torch.zeros(2, 8), "Ascend 950"),
        (torch.zeros(2, 2, 8, dtype=torch.int32), "2-D"),
        (torch.zeros(2, 8, dtype=torch.int8), "int32"),
    ],
)
def test_convert_weight_to_int4pack_rejects_what_torch_npu_rejects(weight, message):
    with pytest.raises(ShapeError, match=message):
        npu_convert_weight_to_int4pack(weight)


def test_unpack_int4_every_nibble_in_every_position_and_views():
    # Each of the 16 nibble values in each of the 8 positions (plus the extreme words), checked
    # against the op-plugin packer's layout read back in Python integers.
    words = [(v & 0xF) << (4 * j) for v in range(16) for j in range(8)] + [0xFFFFFFFF, 0x80000000]
    packed = torch.tensor([w - 2**32 if w >= 2**31 else w for w in words], dtype=torch.int64)
    packed = packed.to(torch.int32).reshape(-1, 1)
    got = unpack_int4(packed)
    for row, w in enumerate(words):
        want = [((w >> (4 * j)) & 0xF) - (16 if (w >> (4 * j)) & 0x8 else 0) for j in range(8)]
        assert got[row].tolist() == want
    assert got.dtype == torch.int8
    tall = packed.reshape(2, -1)  # several words per row, and a transposed (strided) view
    assert torch.equal(unpack_int4(tall), got.reshape(2, -1))
    assert torch.equal(unpack_int4(tall.t()), unpack_int4(tall.t().contiguous()))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_pack_int4_words_are_the_nibble_sums_written_out(dtype):
    # Independent expectation: word = sum_j (v_j & 0xF) << 4j over int64, as two's complement
    # int32 (op-plugin test_npu_quantize.py int4s_to_int32 order: first value lowest).
    g = torch.Generator().manual_seed(3)
    v = torch.randint(-8, 8, (5, 7, 64), generator=g).to(dtype)
    nib = (v.to(torch.int64) & 0xF).reshape(5, 7, 8, 8)
    word = sum(nib[..., j] << (4 * j) for j in range(8))
    want = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    assert torch.equal(pack_int4(v), want)
    assert torch.equal(pack_int4(v[:, ::2]), want[:, ::2])  # a non-contiguous input


def test_pack_int4_of_nothing_is_no_words():
    assert pack_int4(torch.zeros(3, 0, dtype=torch.int8)).shape == (3, 0)
    assert pack_int4(torch.zeros(0, 16, dtype=torch.int8)).shape == (0, 2)
