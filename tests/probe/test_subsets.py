"""Strided subsets of a call's rows (probe/subsets.py)."""

import torch

from opsnn_quant.probe.subsets import strided_rows, strided_samples


def test_strided_rows_of_a_linear_output_keep_every_kth_token():
    y = torch.arange(2 * 6 * 3).reshape(2, 6, 3)  # 12 rows of 3 channels
    got = strided_rows(y, -1, 4.0)  # stride ceil(12 / 4) = 3: rows 0, 3, 6, 9
    assert torch.equal(got, y.reshape(12, 3)[[0, 3, 6, 9]])
    got = strided_rows(y, -1, 5.0)  # stride ceil(12 / 5) = 3: at most 5 rows
    assert torch.equal(got, y.reshape(12, 3)[[0, 3, 6, 9]])
    assert strided_rows(y, -1, 12.0) is y  # nothing would be left out
    assert strided_rows(y, -1, 100.0) is y


def test_strided_rows_of_a_conv_output_keep_every_kth_pixel_of_each_sample():
    y = torch.arange(2 * 3 * 2 * 4).reshape(2, 3, 2, 4).float()  # 2 samples x 8 pixels
    got = strided_rows(y, 1, 4.0)  # stride ceil(16 / 4) = 4: pixels 0 and 4 of each sample
    assert got.shape == (2, 3, 2)
    assert torch.equal(got, y.flatten(2)[:, :, [0, 4]])


def test_strided_samples_keep_whole_samples():
    x, y = torch.randn(8, 5, 4), torch.randn(8, 5, 2)
    (xs,), ys = strided_samples((x,), y, rows=10, channels=4)  # 5 rows each: 2 samples, step 4
    assert torch.equal(xs, x[::4]) and torch.equal(ys, y[::4])
    args, same = strided_samples((x,), y, rows=40, channels=4)
    assert args[0] is x and same is y
