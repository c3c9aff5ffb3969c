"""npu_dynamic_quant: the A2/A3 kernels' order of operations, printed NPU outputs, MoE, int4."""

import numpy as np
import pytest
import torch

from opsnn_quant.ascend import npu_dynamic_quant, unpack_int4
from opsnn_quant.errors import ShapeError

F32 = np.float32


def kernel_golden_np(x, q=127.0, reciprocal_scale=False):
    """Golden from ops-nn quant/dynamic_quant/op_kernel/dynamic_quant_multi_row.h
    ComputeQuantization / QuantizeAndWriteOut (and dynamic_quant_moe.h Compute for
    ``reciprocal_scale``), in numpy fp32: inv = Q / rowmax (Div), y = rint(x * inv) (Mul, CAST_RINT,
    NaN -> 0), scale = rowmax * fp32(1/Q) (Mul by constInvScale) or 1 / inv (scalar)."""
    x = x.astype(F32)
    m = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (F32(q) / m).astype(F32)
        y = np.nan_to_num(np.rint(x * inv[..., None]), nan=0.0)
        scale = (F32(1) / inv).astype(F32) if reciprocal_scale else (m * F32(1.0 / q)).astype(F32)
    return np.clip(y, -q - 1, q), scale


def test_printed_npu_outputs_from_the_api_doc():
    # torch_npu docs/zh/custom_APIs/torch_npu/torch_npu-npu_dynamic_quant.md single-op examples.
    x = torch.tensor(
        [[0.7261, 0.3726, 0.9126], [0.9023, 0.9990, 0.1279], [0.8628, 0.6240, 0.9028]],
        dtype=torch.float16,
    )
    y, scale = npu_dynamic_quant(x)
    assert y.tolist() == [[101, 52, 127], [115, 127, 16], [121, 88, 127]]
    assert np.allclose(scale.numpy(), [0.0072, 0.0079, 0.0071], atol=5e-5)  # printed to 4 places
    x = torch.tensor(
        [[0.6680, 0.9492, 0.0845], [0.1924, 0.5278, 0.1484], [0.6631, 0.9497, 0.0957]],
        dtype=torch.float16,
    )
    smooth = torch.tensor([0.8042, 0.0884, 0.8901], dtype=torch.float16)
    y, scale = npu_dynamic_quant(x, smooth_scales=smooth)
    assert y.tolist() == [[127, 20, 18], [127, 38, 108], [127, 20, 20]]
    assert np.allclose(scale.numpy(), [0.0042, 0.0012, 0.0042], atol=5e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_order_bit_exact_and_differs_from_the_doc_formula(dtype):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(512, 256, generator=g) * torch.rand(512, 1, generator=g) * 8).to(dtype)
    y, scale = npu_dynamic_quant(x)
    want_y, want_scale = kernel_golden_np(x.float().numpy())
    assert np.array_equal(y.numpy(), want_y.astype(np.int8))
    assert np.array_equal(scale.numpy().view(np.uint32), want_scale.view(np.uint32))
    # The API doc's formula (rowmax / 127, x / scale) differs: the test would catch a regression.
    m = np.abs(x.float().numpy()).max(axis=-1)
    doc_scale = (m / F32(127)).astype(F32)
    doc_y = np.clip(np.rint(x.float().numpy() / doc_scale[:, None]), -128, 127)
    assert (doc_scale != want_scale).any()
    assert (doc_y != want_y).any()


def test_smooth_scales_multiply_in_fp32_before_the_row_max():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 136, generator=g).half()
    smooth = (torch.rand(136, generator=g) * 4).half()
    y, scale = npu_dynamic_quant(x, smooth_scales=smooth)
    want_y, want_scale = kernel_golden_np(x.float().numpy() * smooth.float().numpy())
    assert np.array_equal(y.numpy(), want_y.astype(np.int8))
    assert np.array_equal(scale.numpy(), want_scale)
    with pytest.raises(ShapeError, match="input's dtype"):
        npu_dynamic_quant(x, smooth_scales=smooth.bfloat16())


def test_all_zero_row_gives_zero_scale_and_zero_output():
    x = torch.tensor([[0.0, -0.0, 0.0, 0.0], [1.0, -2.0, 0.5, 0.0]], dtype=torch.float16)
    y, scale = npu_dynamic_quant(x)
    assert y[0].tolist() == [0, 0, 0, 0] and scale[0].item() == 0.0
    assert y[1].tolist() == [64, -127, 32, 0]  # inv = 63.5: 63.5 -> 64 (ties to even), 31.75


def test_rows_longer_than_the_buffer_use_the_reciprocal_scale():
    # dynamic_quant_tiling.cpp: K = 16400 > maxUbLen 16320 and 13 * 16400 bytes > the A2 UB, so the
    # tiling falls back to dynamic_quant.h / large-shape kernels, which write scale = 1 / inv.
    g = torch.Generator().manual_seed(11)
    x = torch.randn(48, 16400, generator=g).half()
    y, scale = npu_dynamic_quant(x)
    want_y, want_scale = kernel_golden_np(x.float().numpy(), reciprocal_scale=True)
    assert np.array_equal(y.numpy(), want_y.astype(np.int8))
    assert np.array_equal(scale.numpy(), want_scale)
    _, mul_scale = kernel_golden_np(x.float().numpy(), reciprocal_scale=False)
    assert (mul_scale != want_scale).any()  # the two kernel families do differ on this data
    short = x[:, :16320]  # multi-row kernel
    _, scale = npu_dynamic_quant(short)
    assert np.array_equal(scale.numpy(), kernel_golden_np(short.float().numpy())[1])


def test_group_index_selects_smooth_rows_per_expert():
    # torch_npu doc: smooth_scales[0] scales x[0:g[0]], smooth_scales[i] scales x[g[i-1]:g[i]].
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 64, generator=g).half()  # 6 rows
    smooth = (torch.rand(3, 64, generator=g) + 0.5).half()
    group_index = torch.tensor([2, 2, 6], dtype=torch.int32)  # expert 1 gets no rows
    y, scale = npu_dynamic_quant(x, smooth_scales=smooth, group_index=group_index)
    rows = x.reshape(6, 64).float().numpy()
    s = smooth.float().numpy()
    expert = [0, 0, 2, 2, 2, 2]  # hand-assigned from group_index
    want_y, want_scale = kernel_golden_np(rows * s[expert], reciprocal_scale=True)  # MoE kernel
    assert y.shape == (2, 3, 64) and scale.shape == (2, 3)
    assert np.array_equal(y.reshape(6, 64).numpy(), want_y.astype(np.int8))
    assert np.array_equal(scale.reshape(6).numpy(), want_scale)


@pytest.mark.parametrize(
    ("group_index", "message"),
    [
        (torch.tensor([3, 2, 6], dtype=torch.int32), "non-decreasing"),
        (torch.tensor([2, 4, 5], dtype=torch.int32), "end at the row count 6"),
        (torch.tensor([2, 6], dtype=torch.int32), "3 elements"),
        (torch.tensor([2, 4, 6], dtype=torch.int64), "int32"),
    ],
)
def test_bad_group_index_raises(group_index, message):
    x = torch.ones(6, 8, dtype=torch.float16)
    smooth = torch.ones(3, 8, dtype=torch.float16)
    with pytest.raises(ShapeError, match=message):
        npu_dynamic_quant(x, smooth_scales=smooth, group_index=group_index)


def test_quint4x2_uses_7_and_packs_eight_per_int32():
    x = torch.tensor([[7.0, -7.0, 3.5, 0.0, 1.0, 2.0, -1.0, 0.49]], dtype=torch.float16)
    y, scale = npu_dynamic_quant(x, dst_type=torch.quint4x2)
    assert y.dtype == torch.int32 and y.shape == (1, 1)
    # inv = 7 / 7 = 1: [7, -7, 4, 0, 1, 2, -1, 0] -> nibbles 7, 9, 4, 0, 1, 2, F, 0 from bit 0
    assert y.item() == 0x0F210497
    assert scale.item() == float(F32(7) * F32(1.0 / 7))
    g = torch.Generator().manual_seed(9)
    x = torch.randn(16, 128, generator=g).bfloat16()
    y, scale = npu_dynamic_quant(x, dst_type=torch.quint4x2)
    want_y, want_scale = kernel_golden_np(x.float().numpy(), q=7.0)
    assert np.array_equal(unpack_int4(y).numpy(), want_y.astype(np.int8))
    assert np.array_equal(scale.numpy(), want_scale)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quant_mode": "pertensor"}, "Ascend 950"),
        ({"quant_mode": "perchannel"}, "Ascend 950"),
        ({"dst_type_max": 448.0}, "dst_type_max"),
        ({"dst_type": torch.float8_e4m3fn}, "dst_type must be"),
        (
            {"dst_type": torch.quint4x2, "input": torch.ones(2, 12, dtype=torch.float16)},
            "multiple of 8",
        ),
        ({"input": torch.ones(8, dtype=torch.float16)}, "at least 2 dims"),
        ({"group_index": torch.tensor([2], dtype=torch.int32)}, "needs smooth_scales"),
    ],
)
def test_unsupported_arguments_raise(kwargs, message):
    x = kwargs.pop("input", torch.ones(2, 8, dtype=torch.float16))
    with pytest.raises(ShapeError, match=message):
        npu_dynamic_quant(x, **kwargs)


def test_pertoken_and_zero_dst_type_max_are_accepted_defaults():
    x = torch.tensor([[1.0, -2.0]], dtype=torch.float16)
    y, _ = npu_dynamic_quant(x, quant_mode="pertoken", dst_type_max=0.0, dst_type=torch.int8)
    assert y.tolist() == [[64, -127]]
