"""npu_weight_quant_batchmatmul: per-tensor scales, int4 weights, int8 output, batched weights."""

import pytest
import torch

from opsnn_quant.ascend import (
    npu_convert_weight_to_int4pack,
    npu_trans_quant_param,
    npu_weight_quant_batchmatmul,
)
from opsnn_quant.errors import ShapeError

X = torch.tensor([[1.0, 2.0]])
W = torch.tensor([[1, -2], [3, 4]], dtype=torch.int8)  # (K, N); x @ w = [7, 6]


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_per_tensor_antiquant_scale_of_the_documented_shapes(shape):
    # torch_npu doc: "pertensor模式：输入shape为(1,)或(1, 1)" (crashed with a reshape error before)
    scale = torch.full(shape, 0.5)
    offset = torch.full(shape, 1.0)
    y = npu_weight_quant_batchmatmul(X, W, scale, offset)
    assert y.tolist() == [[5.0, 4.5]]  # w = ([[1, -2], [3, 4]] + 1) * 0.5 = [[1, -.5], [2, 2.5]]


def test_int4_weight_from_npu_convert_weight_to_int4pack():
    # op-plugin test_npu_convert_weight_to_int4pack.py: supported_op_exec
    # x.float() @ ((weight.half() + offset) * scale).float(), compared at rtol 1e-3.
    g = torch.Generator().manual_seed(0)
    x = torch.randn((16, 64), dtype=torch.float16, generator=g)
    w = torch.randint(-8, 8, (64, 32), dtype=torch.int32, generator=g)
    scale = torch.randn((1, 32), generator=g).half()
    offset = torch.randn((1, 32), generator=g).half()
    packed = npu_convert_weight_to_int4pack(w)
    got = npu_weight_quant_batchmatmul(x, packed, scale, offset)
    want = x.float() @ ((w.half() + offset) * scale).float()
    assert got.dtype == torch.float16 and got.shape == (16, 32)
    assert torch.allclose(got.float(), want.half().float(), rtol=1e-3, atol=1e-3)


def test_int4_weight_hand_computed_and_transposed_view():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0]], dtype=torch.float16)
    wt = torch.tensor([[1, -1, 2, -2, 3, -3, 7, -8], [1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.int32)
    # packed along K: a (K // 8, N) = (1, 2) transposed view of the contiguous (N, K // 8) pack
    packed = npu_convert_weight_to_int4pack(wt).t()
    y = npu_weight_quant_batchmatmul(x, packed, torch.tensor([1.0], dtype=torch.float16))
    assert y.tolist() == [[1 - 1 + 2 - 2 + 3 - 3 + 7 - 16, 9]]


def test_quant_scale_gives_int8_through_the_fixpipe_requant():
    # doc: y = (x @ ANTIQUANT(w) + bias) * quant_scale + quant_offset; requant as compute_requant
    scale = torch.tensor([0.5, 0.25])
    base = npu_weight_quant_batchmatmul(X, W, scale, bias=torch.tensor([1.0, 1.0]))
    assert base.tolist() == [[4.5, 2.5]]  # 0.5 + 3, -0.25 + 2, + 1
    qs, qo = torch.tensor([2.0, 1.0]), torch.tensor([1.0, -1.0])
    y = npu_weight_quant_batchmatmul(X, W, scale, None, qs, qo, bias=torch.tensor([1.0, 1.0]))
    assert y.dtype == torch.int8 and y.tolist() == [[10, 1]]  # rint(9) + 1; rint(2.5) = 2, - 1
    packed = npu_trans_quant_param(qs, qo)
    y2 = npu_weight_quant_batchmatmul(
        X, W, scale, quant_scale=packed, bias=torch.tensor([1.0, 1.0])
    )
    assert y2.tolist() == [[10, 1]]


def test_batched_weight_and_broadcast_2d_weight():
    # op-plugin WeightQuantBatchMatmulV2KernelNpuOpApi.cpp: equal ranks need equal batch dims.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, generator=g)
    w = torch.randint(-128, 128, (2, 4, 5), dtype=torch.int8, generator=g)
    s = torch.rand(5, generator=g)
    y = npu_weight_quant_batchmatmul(x, w, s)
    want = torch.stack([x[i] @ (w[i].float() * s) for i in range(2)])
    assert y.shape == (2, 3, 5) and torch.allclose(y, want, rtol=1e-6, atol=1e-6)
    y = npu_weight_quant_batchmatmul(x, w[0], s)
    assert torch.allclose(y, x @ (w[0].float() * s), rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError, match="same batch dims"):
        npu_weight_quant_batchmatmul(torch.randn(3, 3, 4), w, s)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weight_dtype": torch.float8_e4m3fn}, "weight_dtype"),
        ({"inner_precise": 2}, "inner_precise"),
        ({"antiquant_scale": torch.ones(2, dtype=torch.int64)}, "int64 antiquant_scale"),
        ({"quant_offset": torch.ones(2)}, "needs quant_scale"),
        ({"antiquant_scale": torch.ones(3)}, "antiquant_scale must be"),
        ({"antiquant_offset": torch.ones(1, 2)}, "antiquant_offset must have"),
    ],
)
def test_unsupported_arguments_raise(kwargs, message):
    args = {"antiquant_scale": torch.ones(2)} | kwargs
    with pytest.raises(ShapeError, match=message):
        npu_weight_quant_batchmatmul(X, W, **args)


def test_weight_dtype_equal_to_the_weight_is_accepted():
    y = npu_weight_quant_batchmatmul(X, W, torch.ones(2), weight_dtype=torch.int8)
    assert y.tolist() == [[7.0, 6.0]]
