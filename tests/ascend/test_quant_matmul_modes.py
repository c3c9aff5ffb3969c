"""npu_quant_matmul issue-13 cases: requant with offset, int4 (a4w4), bias shapes, new arguments."""

import numpy as np
import pytest
import torch

from opsnn_quant.ascend import npu_quant_matmul, npu_trans_quant_param
from opsnn_quant.errors import ShapeError

F32 = np.float32


def fp19_np(x):
    return (np.asarray(x, F32).view(np.uint32) & np.uint32(0xFFFFE000)).view(F32)


def requant_golden_np(acc, scale, offset):
    """Golden: ops-nn matmul/quant_batch_matmul_v3/tests/assets/qbmmv3_kernel_golden.py
    compute_requant with matmul_quant_util.f32_2_s9 = clip(round(x), -256, 255), after
    QuantMatmulKernelNpuOpApi.cpp packs an fp32 scale/offset with npu_trans_quant_param (scale
    truncated to FP19, offset rint + clamp to 9 bits)."""
    s9 = np.clip(np.rint(acc.astype(F32) * fp19_np(scale)), -256, 255)
    off9 = np.clip(np.rint(np.asarray(offset, F32)), -256, 255)
    return np.clip(s9 + off9, -128, 127).astype(np.int8)


def pack_int4_np(v):
    """Eight int4 per int32, value j at bits 4j (op-plugin ConvertWeightToINT4PackKernelNpuOpApi.cpp
    convert_to_int4_pack), in numpy."""
    v = (np.asarray(v, np.int64) & 0xF).reshape(*v.shape[:-1], -1, 8)
    w = (v << (4 * np.arange(8))).sum(axis=-1)
    return torch.from_numpy(np.where(w >= 2**31, w - 2**32, w).astype(np.int32))


def test_method_1_and_method_2_give_the_same_int8_as_the_golden():
    # torch_npu npu_quant_matmul doc "Method 1" (fp32 scale + offset) vs "Method 2" (packed first).
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(-5, 5, (1, 256, 768), dtype=torch.int8, generator=g)
    x2 = torch.randint(-5, 5, (31, 768, 16), dtype=torch.int8, generator=g)
    scale = torch.randn(16, generator=g) * 0.02
    offset = torch.randn(16, generator=g) * 40
    bias = torch.randint(-5, 5, (31, 1, 16), dtype=torch.int32, generator=g)
    m1 = npu_quant_matmul(x1, x2, scale, offset=offset, bias=bias)
    m2 = npu_quant_matmul(x1, x2, npu_trans_quant_param(scale, offset), bias=bias)
    acc = x1.numpy().astype(np.int64) @ x2.numpy().astype(np.int64) + bias.numpy()
    want = requant_golden_np(acc, scale.numpy(), offset.numpy())
    assert m1.shape == (31, 256, 16)
    assert np.array_equal(m1.numpy(), want) and np.array_equal(m2.numpy(), want)
    # the pre-issue formula rint(acc * scale + offset) differs on this data
    old = np.clip(np.rint(acc.astype(F32) * fp19_np(scale.numpy()) + offset.numpy()), -128, 127)
    assert (old != want).any()


def test_requant_saturates_to_9_bits_before_the_offset():
    x1 = torch.tensor([[100]], dtype=torch.int8)
    x2 = torch.tensor([[3, -3, 1]], dtype=torch.int8)  # acc = 300, -300, 100
    off = torch.tensor([-200.0, 200.0, 0.6])
    y = npu_quant_matmul(x1, x2, torch.tensor([1.0]), offset=off)
    # 300 -> s9 255, -200 = 55; -300 -> -256, +200 = -56; 100 + rint(0.6) = 101
    assert y.tolist() == [[55, -56, 101]]
    y = npu_quant_matmul(x1, x2, torch.tensor([1.0]), offset=torch.tensor([-0.5]))
    assert y.tolist() == [[127, -128, 100]]  # rint(-0.5) = -0 (ties to even)


def test_fp16_output_ignores_a_packed_offset():
    # qbmmv3_kernel_golden.py compute_tc (dequant to fp16) has no offset term; the doc's table
    # takes offset None for fp16 output.
    x1 = torch.tensor([[2]], dtype=torch.int8)
    x2 = torch.tensor([[3]], dtype=torch.int8)
    packed = npu_trans_quant_param(torch.tensor([0.5]), torch.tensor([7.0]))
    assert npu_quant_matmul(x1, x2, packed, output_dtype=torch.float16).item() == 3.0
    assert npu_quant_matmul(x1, x2, packed).item() == 10  # int8: 3 + 7


def test_a4w4_int4_packed_inputs_fp16_output():
    # op-plugin test_npu_quant_matmul.py test_npu_quant_matmul_a4w4: x1 (m, k//8), x2 (k, n//8).
    g = np.random.default_rng(1)
    a = g.integers(-8, 8, (5, 64))
    b = g.integers(-8, 8, (64, 16))
    scale = F32(0.0371)
    y = npu_quant_matmul(
        pack_int4_np(a), pack_int4_np(b), npu_trans_quant_param(torch.tensor([scale])),
        output_dtype=torch.float16,
    )  # fmt: skip
    want = ((a @ b).astype(F32) * fp19_np(scale)).astype(np.float16)
    assert y.shape == (5, 16) and np.array_equal(y.numpy(), want)


def test_a4w4_x2_as_a_transposed_view_and_pertoken_bf16():
    # op-plugin test_npu_quant_matmul_continuous_x2_tensor: x2 is a contiguous (n, k//8), .t()
    g = np.random.default_rng(2)
    a = g.integers(-8, 8, (4, 32))
    bt = g.integers(-8, 8, (24, 32))  # (n, k)
    x2 = pack_int4_np(bt).t()  # (k//8, n), packed along k
    s = np.float32(0.25)
    y = npu_quant_matmul(pack_int4_np(a), x2, npu_trans_quant_param(torch.tensor([s])),
                         output_dtype=torch.float16)  # fmt: skip
    assert np.array_equal(y.numpy(), ((a @ bt.T).astype(F32) * s).astype(np.float16))
    pt = g.uniform(0.5, 2, 4).astype(F32)
    y = npu_quant_matmul(
        pack_int4_np(a), x2, torch.tensor([s]), pertoken_scale=torch.from_numpy(pt),
        output_dtype=torch.bfloat16,
    )  # fmt: skip
    want = (a @ bt.T).astype(F32) * s * pt[:, None]  # compute_pertoken order: acc*scale*pertoken
    assert np.array_equal(y.float().numpy(), torch.from_numpy(want).bfloat16().float().numpy())


def test_bias_of_shape_1_n_with_a_2d_output():
    x1 = torch.tensor([[1, 2], [3, 4]], dtype=torch.int8)
    x2 = torch.tensor([[5, 6], [7, 8]], dtype=torch.int8)  # acc [[19, 22], [43, 50]]
    y = npu_quant_matmul(
        x1, x2, torch.tensor([1.0]), bias=torch.tensor([[1, -2]], dtype=torch.int32),
        output_dtype=torch.int32,
    )  # fmt: skip
    assert y.tolist() == [[20, 20], [44, 48]]
    y = npu_quant_matmul(
        x1, x2, torch.tensor([0.5]), bias=torch.tensor([[0.5, -1.0]], dtype=torch.bfloat16),
        output_dtype=torch.bfloat16,
    )  # fmt: skip
    assert y.float().tolist() == [[10.0, 10.0], [22.0, 24.0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bias": torch.zeros(3, 1, 2, dtype=torch.int32)}, "bias must be"),  # batch 3 != 2
        (
            {"bias": torch.zeros(2, dtype=torch.bfloat16), "output_dtype": torch.int32},
            "int32 output",
        ),
        ({"bias": torch.zeros(2, dtype=torch.float32)}, "int32 bias"),  # int8 output
        (
            {"scale": torch.ones(2, dtype=torch.bfloat16), "output_dtype": torch.float16},
            "int64 or float32",
        ),
        ({"x1_dtype": torch.float8_e4m3fn}, "Ascend 950"),
        ({"scale_dtype": 290}, "Ascend 950"),
        ({"y_scale": torch.ones(1)}, "y_scale"),
        ({"group_sizes": [1, 1]}, "3 values"),
        ({"group_sizes": [1, 1, 256]}, "not supported"),
        ({"x2": torch.zeros(2, 1, dtype=torch.int32)}, "A8W4"),
        ({"output_dtype": torch.float32}, "output_dtype"),
    ],
)
def test_unsupported_combinations_raise(kwargs, message):
    args = {
        "x1": torch.ones(2, 2, 4, dtype=torch.int8),
        "x2": torch.ones(2, 4, 2, dtype=torch.int8),
        "scale": torch.ones(2),
    } | kwargs
    x1, x2, scale = args.pop("x1"), args.pop("x2"), args.pop("scale")
    with pytest.raises(ShapeError, match=message):
        npu_quant_matmul(x1, x2, scale, **args)


def test_dtype_arguments_equal_to_the_tensors_and_zero_groups_are_no_ops():
    x1 = torch.tensor([[1, 2], [3, 4]], dtype=torch.int8)
    x2 = torch.tensor([[5, 6], [7, 8]], dtype=torch.int8)
    y = npu_quant_matmul(
        x1, x2, torch.tensor([1.0]), output_dtype=torch.int32, x1_dtype=torch.int8,
        x2_dtype=torch.int8, scale_dtype=torch.float32, group_sizes=[0, 0, 0],
    )  # fmt: skip
    assert y.tolist() == [[19, 22], [43, 50]]


def test_group_sizes_g_b_pergroup_perblock():
    # aclnnQuantMatmulV5.md G-B: out[m,n] = sum_j (x1 @ x2)_j * (x1Scale[m, j] * x2Scale[j, n/128])
    # + bias; blocks of 128 along K accumulated in fp32 in order (qbmmv3 golden compute_perblock).
    g = np.random.default_rng(3)
    m, k, n = 3, 300, 200
    a = g.integers(-128, 128, (m, k)).astype(np.int8)
    b = g.integers(-128, 128, (k, n)).astype(np.int8)
    xs = g.uniform(0.001, 0.01, (m, 3)).astype(F32)
    ws = g.uniform(0.001, 0.01, (3, 2)).astype(F32)
    bias = g.uniform(-1, 1, n).astype(F32)
    want = np.zeros((m, n), F32)
    for j in range(3):
        part = (a[:, j * 128 : (j + 1) * 128].astype(np.int64) @ b[j * 128 : (j + 1) * 128]).astype(
            F32
        )
        want += part * (xs[:, j : j + 1] * ws[j, np.arange(n) // 128])
    want = want + bias
    y = npu_quant_matmul(
        torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(ws),
        pertoken_scale=torch.from_numpy(xs), bias=torch.from_numpy(bias),
        output_dtype=torch.bfloat16, group_sizes=[1, 128, 128],
    )  # fmt: skip
    assert np.array_equal(y.float().numpy(), torch.from_numpy(want).bfloat16().float().numpy())
    with pytest.raises(ShapeError, match="pertoken_scale of shape"):
        npu_quant_matmul(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(ws),
                         output_dtype=torch.bfloat16, group_sizes=[1, 128, 128])  # fmt: skip
