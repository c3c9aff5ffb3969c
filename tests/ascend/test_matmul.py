"""npu_quant_matmul / npu_weight_quant_batchmatmul against hand-computed and int64 results."""

import struct

import numpy as np
import pytest
import torch

from opsnn_quant.ascend import (
    npu_quant_matmul,
    npu_quantize,
    npu_trans_quant_param,
    npu_weight_quant_batchmatmul,
)
from opsnn_quant.errors import ConfigError, ShapeError
from opsnn_quant.quant.functional import fold_bias_int32

X1 = torch.tensor([[1, 2], [3, 4]], dtype=torch.int8)
X2 = torch.tensor([[5, 6], [7, 8]], dtype=torch.int8)  # (K, N); x1 @ x2 = [[19, 22], [43, 50]]


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_int32_accumulator_and_int32_bias():
    acc = npu_quant_matmul(X1, X2, torch.tensor([1.0]), output_dtype=torch.int32)
    assert acc.tolist() == [[19, 22], [43, 50]]
    acc = npu_quant_matmul(
        X1,
        X2,
        torch.tensor([1.0]),
        bias=torch.tensor([1, -2], dtype=torch.int32),
        output_dtype=torch.int32,
    )
    assert acc.tolist() == [[20, 20], [44, 48]]


def test_bf16_output_int32_bias_inside_accumulate():
    y = npu_quant_matmul(
        X1,
        X2,
        torch.tensor([0.5, 0.25]),
        bias=torch.tensor([1, -2], dtype=torch.int32),
        output_dtype=torch.bfloat16,
    )
    assert y.dtype == torch.bfloat16
    assert y.float().tolist() == [[10.0, 5.0], [22.0, 12.0]]


def test_float_bias_is_added_after_scaling():
    y = npu_quant_matmul(
        X1,
        X2,
        torch.tensor([0.5, 0.25]),
        bias=torch.tensor([0.5, -0.5], dtype=torch.bfloat16),
        output_dtype=torch.bfloat16,
    )
    assert y.float().tolist() == [[10.0, 5.0], [22.0, 12.0]]  # 9.5+0.5, 5.5-0.5, 21.5+0.5, 12.5-0.5


def test_int8_output_offset_rounding_and_saturation():
    y = npu_quant_matmul(X1, X2, torch.tensor([0.5, 0.25]), offset=torch.tensor([1.0, 0.0]))
    assert y.dtype == torch.int8
    # Issue 13: the fixpipe rounds the scaled value first, then adds the 9-bit offset (ops-nn
    # qbmmv3_kernel_golden.py compute_requant): 9.5 -> 10, +1 = 11; 5.5 -> 6; 21.5 -> 22, +1 = 23;
    # 12.5 -> 12 (ties to even). The earlier reading rounded 9.5 + 1 = 10.5 to 10.
    assert y.tolist() == [[11, 6], [23, 12]]
    y = npu_quant_matmul(X1, X2, torch.tensor([10.0]))
    assert y.tolist() == [[127, 127], [127, 127]]
    y = npu_quant_matmul(X1, X2, torch.tensor([-10.0]))
    assert y.tolist() == [[-128, -128], [-128, -128]]


def test_packed_offset_is_applied_for_int8_output():
    packed = npu_trans_quant_param(torch.tensor([0.5, 0.25]), torch.tensor([-3.0, 2.0]))
    y = npu_quant_matmul(X1, X2, packed)
    # round first, then add the 9-bit offset (compute_requant): 9.5 -> 10, -3 = 7; 5.5 -> 6, +2 = 8;
    # 21.5 -> 22, -3 = 19; 12.5 -> 12, +2 = 14 (was [[6, 8], [18, 14]] before issue 13)
    assert y.tolist() == [[7, 8], [19, 14]]


def test_fp16_output_uses_fp19_scale_but_pertoken_keeps_fp32():
    x1 = torch.tensor([[100]], dtype=torch.int8)
    x2 = torch.tensor([[10]], dtype=torch.int8)  # acc = 1000
    scale = torch.tensor([f32(0x3F801FFF)])  # 1.000976..., low 13 bits set
    y = npu_quant_matmul(x1, x2, npu_trans_quant_param(scale), output_dtype=torch.float16)
    assert y.item() == 1000.0  # FP19 truncation drops the fraction
    y = npu_quant_matmul(x1, x2, scale, output_dtype=torch.float16)
    assert y.item() == 1000.0  # an fp32 scale goes through the same packing
    y = npu_quant_matmul(
        x1, x2, scale, pertoken_scale=torch.tensor([1.0]), output_dtype=torch.float16
    )
    assert y.item() == 1001.0  # full fp32: 1000.976 -> fp16 1001


def test_pertoken_scale_multiplies_rows():
    y = npu_quant_matmul(
        X1,
        X2,
        torch.tensor([0.5]),
        pertoken_scale=torch.tensor([2.0, 0.5]),
        output_dtype=torch.bfloat16,
    )
    assert y.float().tolist() == [[19.0, 22.0], [10.75, 12.5]]


def test_asymmetric_activation_offset_folds_into_int32_bias():
    # x = [5, 6, 7], s_x = 0.5, offset -10: q = 2x - 10 = [0, 2, 4]
    x = torch.tensor([[5.0, 6.0, 7.0]])
    q = npu_quantize(x, torch.tensor([2.0]), torch.tensor([-10.0]), torch.qint8, div_mode=False)
    assert q.tolist() == [[0, 2, 4]]
    w_q = torch.tensor([[1, 2, 3]], dtype=torch.int8)  # (N=1, K=3), s_w = 1
    bias = fold_bias_int32(None, torch.tensor([0.5]), -10.0, w_q)
    assert bias.tolist() == [60]  # -(-10) * (1 + 2 + 3)
    y = npu_quant_matmul(q, w_q.t(), torch.tensor([0.5]), bias=bias, output_dtype=torch.bfloat16)
    assert y.float().item() == 38.0  # (16 + 60) * 0.5 == 5*1 + 6*2 + 7*3


def test_large_k_accumulation_is_exact_beyond_fp32():
    k = 4096
    x1 = torch.ones(1, k, dtype=torch.int8)
    x2 = torch.ones(k, 1, dtype=torch.int8)
    x1[0, :2048] = -128
    x2[:2048, 0] = -128  # 2048 * 16384 = 2**25
    x2[2048, 0] = 3  # plus 2047 ones and one 3: 2**25 + 2050, not representable in fp32
    acc = npu_quant_matmul(x1, x2, torch.tensor([1.0]), output_dtype=torch.int32)
    assert acc.item() == 2**25 + 2050
    assert float(np.float32(2**25 + 2050)) != 2**25 + 2050
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (3, 2, 5000), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (5000, 7), dtype=torch.int8, generator=g)
    got = npu_quant_matmul(a, b, torch.tensor([1.0]), output_dtype=torch.int32)
    want = a.numpy().astype(np.int64) @ b.numpy().astype(np.int64)
    assert np.array_equal(got.numpy(), want)


def test_weight_quant_batchmatmul():
    x = torch.tensor([[1.0, 2.0]])
    w = torch.tensor([[1, -2], [3, 4]], dtype=torch.int8)  # (K, N)
    y = npu_weight_quant_batchmatmul(
        x, w, torch.tensor([0.5, 0.25]), torch.tensor([1.0, 0.0]), bias=torch.tensor([1.0, 1.0])
    )
    assert y.tolist() == [[6.0, 2.5]]  # w = [[1, -.5], [2, 1]]
    grouped = npu_weight_quant_batchmatmul(
        x, w, torch.tensor([[0.5, 0.25], [1.0, 1.0]]), antiquant_group_size=1
    )
    assert grouped.tolist() == [[0.5 + 6.0, -0.5 + 8.0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"x1": X1.float()}, "x1 must be int8"),
        ({"x2": torch.ones(3, 2, dtype=torch.int8)}, "K mismatch"),
        ({"scale": torch.ones(3)}, "scale must be 1-D with 1 or 2"),
        (
            {"scale": npu_trans_quant_param(torch.ones(2)), "output_dtype": torch.bfloat16},
            "not int64",
        ),
        ({"pertoken_scale": torch.ones(2)}, "pertoken_scale needs output_dtype"),
        ({"offset": torch.ones(2), "output_dtype": torch.float16}, "offset is only supported"),
        ({"bias": torch.ones(2, dtype=torch.int64)}, "bias must be"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"x1": X1, "x2": X2, "scale": torch.ones(2)} | kwargs
    x1, x2, scale = args.pop("x1"), args.pop("x2"), args.pop("scale")
    with pytest.raises(ShapeError, match=message):
        npu_quant_matmul(x1, x2, scale, **args)


def test_int32_bias_overflow_wraps_like_the_device():
    x1 = torch.tensor([[127]], dtype=torch.int8)
    x2 = torch.tensor([[127]], dtype=torch.int8)  # acc = 16129
    bias = torch.tensor([2**31 - 100], dtype=torch.int32)
    acc = npu_quant_matmul(x1, x2, torch.tensor([1.0]), bias=bias, output_dtype=torch.int32)
    assert acc.item() == 16129 + 2**31 - 100 - 2**32  # two's-complement wrap-around


def test_large_weight_converted_in_column_blocks_is_exact(monkeypatch):
    import opsnn_quant.ascend.matmul as mm

    g = torch.Generator().manual_seed(3)
    x1 = torch.randint(-128, 128, (2, 5, 96), generator=g, dtype=torch.int8)
    x2 = torch.randint(-128, 128, (96, 70), generator=g, dtype=torch.int8)
    want = x1.to(torch.int64) @ x2.to(torch.int64)
    monkeypatch.setattr(mm, "WEIGHT_CHUNK", 96 * 16)  # 16 columns per block: 5 blocks, last short
    got = mm.int8_matmul_exact(x1, x2)
    assert got.dtype == torch.int32 and torch.equal(got.to(torch.int64), want)


SHAPES = [((1, 2048), (2048, 16)), ((2, 5, 96), (96, 70)), ((300, 1500), (1500, 24)),
          ((7, 3), (3, 1)), ((0, 8), (8, 4))]  # fmt: skip


@pytest.mark.parametrize("path", ["auto", "native", "fp32-chunk", "no native kernel"])
@pytest.mark.parametrize(("a_shape", "b_shape"), SHAPES)
def test_int8_matmul_exact_gives_int64_products_on_every_path(
    path, a_shape, b_shape, request, monkeypatch
):
    # K = 1500 > 1024 takes the fp32 path's K chunks; a transposed (N, K) weight view is the
    # layout QuantLinear passes; the extremes are where a saturating int8 kernel goes wrong.
    # Every path the dispatcher can choose (ascend/gemm_path.py), forced, gives the same bits.
    import opsnn_quant.ascend.matmul as mm
    from opsnn_quant.ascend.gemm_path import ENV

    if path == "no native kernel":
        request.getfixturevalue("fp32_int8_gemm")
    else:
        monkeypatch.setenv(ENV, path)
    if path == "native" and not mm.int8_gemm_is_exact():  # this CPU's kernel is not exact:
        with pytest.raises(ConfigError, match="not exact on this CPU"):  # forcing it is refused
            mm.int8_matmul_exact(
                torch.zeros(1, 2, dtype=torch.int8), torch.zeros(2, 1, dtype=torch.int8)
            )
        return
    if path in ("native", "fp32-chunk"):
        assert set(mm.gemm_choice().paths.values()) == {path}
    g = torch.Generator().manual_seed(5)
    x1 = torch.randint(-128, 128, a_shape, generator=g, dtype=torch.int8)
    x1.view(-1)[::3] = -128
    x2 = torch.randint(-128, 128, b_shape[::-1], generator=g, dtype=torch.int8)
    x2.view(-1)[::2] = 127
    x2 = x2.t()
    got = mm.int8_matmul_exact(x1, x2)
    assert got.dtype == torch.int32 and got.shape == (*a_shape[:-1], b_shape[1])
    assert torch.equal(got.to(torch.int64), x1.to(torch.int64) @ x2.to(torch.int64))


def _saturating_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An int8 GEMM as AVX2/AVX-512 kernels without VNNI compute it: a + 128 as u8, u8 * s8
    products summed in pairs into int16 with saturation (vpmaddubsw), then int32 sums, less
    the 128 * sum(b) compensation."""
    prod = (a.to(torch.int64) + 128).unsqueeze(-1) * b.to(torch.int64).unsqueeze(0)
    pairs = (prod[:, 0::2] + prod[:, 1::2]).clamp(-(2**15), 2**15 - 1)
    return (pairs.sum(dim=1) - 128 * b.to(torch.int64).sum(dim=0)).to(torch.int32)


@pytest.mark.parametrize(
    ("int_mm", "exact"),
    [
        (lambda a, b: (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32), True),
        (_saturating_int_mm, False),
        (lambda a, b: (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32) + 1, False),
    ],
)
def test_the_native_int8_gemm_is_used_only_where_it_proves_exact(int_mm, exact, monkeypatch):
    import opsnn_quant.ascend.matmul as mm
    from opsnn_quant.ascend.gemm_path import ENV

    mm.int8_gemm_is_exact.cache_clear()
    monkeypatch.setattr(torch, "_int_mm", int_mm)
    # auto: the race may prefer either exact path; an inexact kernel never enters it
    monkeypatch.setenv(ENV, "native" if exact else "auto")
    try:
        assert mm.int8_gemm_is_exact() is exact
        assert mm.native_int8_matmul(torch.device("cpu")) is exact
        assert mm.native_int8_matmul(torch.device("meta")) is False
    finally:
        mm.int8_gemm_is_exact.cache_clear()  # the next caller checks this machine's again


def test_a_gemm_kernel_missing_from_the_build_falls_back(monkeypatch):
    import opsnn_quant.ascend.matmul as mm

    def missing(a, b):
        raise RuntimeError("_int_mm: no CPU kernel")

    mm.int8_gemm_is_exact.cache_clear()
    monkeypatch.setattr(torch, "_int_mm", missing)
    try:
        assert mm.int8_gemm_is_exact() is False
        x1 = torch.tensor([[127, -128]], dtype=torch.int8)
        x2 = torch.tensor([[127], [-128]], dtype=torch.int8)
        assert mm.int8_matmul_exact(x1, x2).tolist() == [[127 * 127 + 128 * 128]]
    finally:
        mm.int8_gemm_is_exact.cache_clear()


@pytest.mark.parametrize("output", [torch.bfloat16, torch.float16, torch.int8, "pertoken"])
def test_fp32_chunk_accumulator_held_in_fp32_is_the_int32_route_bit_for_bit(
    output, fp32_int8_gemm, monkeypatch
):
    # On the fp32-chunk path a single-chunk product stays in fp32 with the int32 bias added
    # there (matmul._float_accumulator); the same bits as the int32 accumulator converted,
    # the route every golden above checks. Biases beside 2**24 (the sum rounds to even in
    # both), past it (not an fp32 integer: the int32 route) and near the wrap (int32 route).
    import opsnn_quant.ascend.matmul as mm

    g = torch.Generator().manual_seed(7)
    k = 1024  # the largest single chunk: sums up to 2**24
    x1 = torch.randint(-128, 128, (6, k), generator=g, dtype=torch.int8)
    x1[0] = -128  # the largest sums: 1024 * 2**14 = 2**24 with the -128 column below
    x2 = torch.randint(-128, 128, (k, 5), generator=g, dtype=torch.int8)
    x2[:, 0] = -128
    bias = torch.tensor([2**24 - 1, -(2**24) + 3, 2**24 + 1, 77, 2**31 - 2**24], dtype=torch.int32)
    scale = torch.rand(5, generator=g) * 1e-4 + 1e-6
    kwargs: dict = {"bias": bias}
    if output == "pertoken":
        kwargs.update(pertoken_scale=torch.rand(6, generator=g) + 0.5, output_dtype=torch.bfloat16)
    else:
        kwargs.update(output_dtype=output)
    for columns in ([0, 1, 3], [0, 1, 2, 3, 4]):  # held in fp32; one bias sends it the int32 way
        c = torch.tensor(columns)
        args = (x1, x2[:, c], scale[c])
        call = {**kwargs, "bias": bias[c]}
        held = npu_quant_matmul(*args, **call)
        monkeypatch.setattr(mm, "_float_accumulator", lambda *a: None)
        converted = npu_quant_matmul(*args, **call)
        monkeypatch.undo()
        fp32_int8_gemm_again(monkeypatch)
        assert held.dtype == converted.dtype and torch.equal(held, converted), columns
    # the sum rounds once, to even: acc 2**24 (column 0, row 0) + bias 2**24 - 1 -> 2**25
    acc = mm._float_accumulator(x1, x2, None, bias[:1], k, torch.bfloat16)
    assert acc is not None and acc[0, 0].item() == 2**25  # 2**25 - 1 is not an fp32 value
    assert mm._float_accumulator(x1, x2, None, bias[2:3], k, torch.bfloat16) is None


def fp32_int8_gemm_again(monkeypatch):
    """The ``fp32_int8_gemm`` fixture's settings, after ``monkeypatch.undo()``."""
    import opsnn_quant.ascend.matmul as mm
    from opsnn_quant.ascend.gemm_path import ENV

    monkeypatch.setattr(mm, "int8_gemm_is_exact", lambda: False)
    monkeypatch.setenv(ENV, "fp32-chunk")
