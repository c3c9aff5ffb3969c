"""npu_quantize / npu_dynamic_quant against hand-computed integers."""

import pytest
import torch

from opsnn_quant.ascend import npu_dynamic_quant, npu_quantize
from opsnn_quant.errors import ShapeError


def test_rounding_ties_go_to_even():
    x = torch.tensor([0.5, 1.5, -2.5, 2.5, -0.5, 3.5])
    q = npu_quantize(x, torch.tensor([1.0]), None, torch.qint8, div_mode=False)
    assert q.dtype == torch.int8
    assert q.tolist() == [0, 2, -2, 2, 0, 4]


def test_saturation_at_int8_limits():
    x = torch.tensor([127.4, 127.5, 200.0, -128.5, -129.0, -1000.0])
    q = npu_quantize(x, torch.tensor([1.0]), None, torch.qint8, div_mode=False)
    assert q.tolist() == [127, 127, 127, -128, -128, -128]


def test_div_mode_divides_and_zero_point_is_added_before_rounding():
    q = npu_quantize(
        torch.tensor([3.0, 1.0]),
        torch.tensor([2.0]),
        torch.tensor([0], dtype=torch.int32),
        torch.qint8,
    )
    assert q.tolist() == [2, 0]  # 1.5 -> 2, 0.5 -> 0
    q = npu_quantize(
        torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([3.0]), torch.qint8, div_mode=False
    )
    assert q.tolist() == [4]  # 0.5 + 3 = 3.5 -> 4


def test_quint8_range_and_per_channel_last_axis():
    q = npu_quantize(torch.tensor([-1.0, 300.0]), torch.tensor([1.0]), None, torch.quint8)
    assert q.dtype == torch.uint8 and q.tolist() == [0, 255]
    x = torch.tensor([[4.0, 4.0, 4.0], [1.0, 1.0, 1.0]])
    q = npu_quantize(x, torch.tensor([1.0, 2.0, 4.0]), None, torch.qint8, axis=-1)
    assert q.tolist() == [[4, 2, 1], [1, 0, 0]]


def test_fp16_input_is_computed_in_fp32():
    x = torch.tensor([0.1], dtype=torch.float16)  # 0.0999755859375
    q = npu_quantize(
        x, torch.tensor([1270.0], dtype=torch.float16), None, torch.qint8, div_mode=False
    )
    assert q.tolist() == [
        127
    ]  # 126.969 -> 127 (fp16 arithmetic would give 127 too, fp32 is the spec)
    q = npu_quantize(
        torch.tensor([0.1], dtype=torch.float16),
        torch.tensor([0.0999755859375 / 10.5]),
        None,
        torch.qint8,
    )
    assert q.tolist() == [10]  # exactly 10.5 in fp32 -> ties to even


def test_bad_arguments():
    with pytest.raises(ShapeError, match="input must be"):
        npu_quantize(torch.tensor([1], dtype=torch.int32), torch.tensor([1.0]), None, torch.qint8)
    with pytest.raises(ShapeError, match="dtype must be"):
        npu_quantize(torch.tensor([1.0]), torch.tensor([1.0]), None, torch.float16)
    with pytest.raises(ShapeError, match="axis"):
        npu_quantize(torch.ones(2, 3), torch.ones(4), None, torch.qint8, axis=-1)


def test_dynamic_quant_per_token():
    x = torch.tensor([[127.0, -63.5, 0.5], [0.0, 0.0, 0.0], [-254.0, 1.0, 3.0]])
    y, scale = npu_dynamic_quant(x)
    assert y.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.tolist() == [1.0, 0.0, 2.0]
    assert y.tolist() == [[127, -64, 0], [0, 0, 0], [-127, 0, 2]]  # 0.5 -> 0, 1.5 -> 2


def test_dynamic_quant_smooth_scales_multiply_channels():
    y, scale = npu_dynamic_quant(
        torch.tensor([[1.0, 2.0]]), smooth_scales=torch.tensor([127.0, 0.5])
    )
    assert scale.tolist() == [1.0]
    assert y.tolist() == [[127, 1]]
    with pytest.raises(ShapeError, match="smooth_scales"):
        npu_dynamic_quant(torch.ones(1, 3), smooth_scales=torch.ones(2))
