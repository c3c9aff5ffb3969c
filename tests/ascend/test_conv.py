"""The reference's exact int8 convolution: the same int32 sums as im2col + the exact matmul."""

import pytest
import torch
import torch.nn.functional as F

from opsnn_quant.ascend import int8_matmul_exact
from opsnn_quant.ascend.conv import int8_conv2d_exact


def _im2col_reference(x_q, w_q, stride, padding, dilation, pad_value):
    """Independent expectation: pad with the value, unfold, exact int matmul (matmul.py)."""
    ph, pw = padding
    xp = F.pad(x_q.to(torch.int32), (pw, pw, ph, ph), value=pad_value)
    b, n = x_q.shape[0], w_q.shape[0]
    cols = F.unfold(xp.to(torch.float32), w_q.shape[2:], dilation, 0, stride)  # exact: |v|<=128
    rows = cols.transpose(1, 2).reshape(-1, cols.shape[1]).to(torch.int8)
    acc = int8_matmul_exact(rows, w_q.reshape(n, -1).t())
    oh = (xp.shape[2] - dilation[0] * (w_q.shape[2] - 1) - 1) // stride[0] + 1
    ow = (xp.shape[3] - dilation[1] * (w_q.shape[3] - 1) - 1) // stride[1] + 1
    return acc.reshape(b, oh * ow, n).transpose(1, 2).reshape(b, n, oh, ow)


@pytest.mark.parametrize(
    ("c", "n", "k", "stride", "padding", "dilation", "pad_value"),
    [
        (300, 16, 3, (1, 1), (1, 1), (1, 1), 0),  # K = 2700: three channel blocks of <= 1024
        (130, 7, 3, (2, 2), (1, 1), (1, 1), -5),  # stride 2, an asymmetric input's zero
        (40, 9, 5, (1, 2), (2, 1), (2, 1), 3),  # mixed geometry
        (64, 8, 1, (1, 1), (0, 0), (1, 1), 0),  # 1x1
    ],
)
@pytest.mark.parametrize("path", ["this machine", "native", "fp32 chunks"])
def test_int8_conv_equals_im2col_and_the_exact_matmul(
    c, n, k, stride, padding, dilation, pad_value, path, request
):
    # Where the native int8 GEMM runs (forced, or chosen by the race), K > 1024 and 1x1 take the
    # int8 im2col; the dilated case always the fp32 channel blocks.
    if path != "this machine":
        request.getfixturevalue(
            {"native": "native_int8_gemm", "fp32 chunks": "fp32_int8_gemm"}[path]
        )
    g = torch.Generator().manual_seed(c)
    x_q = torch.randint(-128, 128, (2, c, 11, 13), generator=g, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (n, c, k, k), generator=g, dtype=torch.int8)
    got = int8_conv2d_exact(x_q, w_q, stride, padding, dilation, pad_value)
    assert got.dtype == torch.int32
    assert torch.equal(got, _im2col_reference(x_q, w_q, stride, padding, dilation, pad_value))


@pytest.mark.parametrize("path", ["this machine", "native", "fp32 chunks"])
def test_the_largest_sums_stay_exact(path, request):
    if path != "this machine":
        request.getfixturevalue(
            {"native": "native_int8_gemm", "fp32 chunks": "fp32_int8_gemm"}[path]
        )
    # Every product -128 * 127 = -16256: one output sums 9 * 1152 of them = -168 554 496, far
    # past fp32's 2**24 integer range, exact only because each block stays below it.
    x_q = torch.full((1, 1152, 3, 3), -128, dtype=torch.int8)
    w_q = torch.full((2, 1152, 3, 3), 127, dtype=torch.int8)
    got = int8_conv2d_exact(x_q, w_q, (1, 1), (0, 0), (1, 1))
    assert got.flatten().tolist() == [-128 * 127 * 9 * 1152] * 2


def test_a_block_that_is_not_a_plain_sum_falls_back_to_im2col(monkeypatch, fp32_int8_gemm):
    g = torch.Generator().manual_seed(0)
    x_q = torch.randint(-128, 128, (1, 20, 6, 6), generator=g, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (4, 20, 3, 3), generator=g, dtype=torch.int8)
    want = _im2col_reference(x_q, w_q, (1, 1), (1, 1), (1, 1), 0)
    real = F.conv2d
    # an inexact algorithm (Winograd-like rounding) shows as a non-integer block
    monkeypatch.setattr(F, "conv2d", lambda *a, **k: real(*a, **k) + 0.25)
    assert torch.equal(int8_conv2d_exact(x_q, w_q, (1, 1), (1, 1), (1, 1)), want)
