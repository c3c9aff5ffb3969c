"""npu_quantize / npu_dynamic_quant against hand-computed integers."""

import numpy as np
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


# --- Issue 13: divide mode reshapes scales along any axis; qint32; multiply-mode int4 ---------


def quantize_golden_np(x, scales, zero_points, axis, lo, hi):
    """Golden: ops-nn quant/quantize/tests/assets/golden.py quantize_golden (scales reshaped to
    1 everywhere but ``axis``, fp32 x / scale + offset, round half to even, clip), in numpy."""
    shape = [1] * x.ndim
    shape[axis] = scales.size
    y = x.astype(np.float32) / scales.astype(np.float32).reshape(shape)
    if zero_points is not None:
        y = y + zero_points.astype(np.float32).reshape(shape)
    return np.clip(np.rint(y), lo, hi)


def test_div_mode_axis_0_on_a_square_input_scales_rows():
    # Columns and rows have the same length: a last-axis reading gives [[4, 2, 1], ...].
    x = torch.tensor([[4.0, 4.0, 4.0], [6.0, 6.0, 6.0], [8.0, 8.0, 8.0]])
    q = npu_quantize(x, torch.tensor([1.0, 2.0, 4.0]), None, torch.qint8, axis=0)
    assert q.tolist() == [[4, 4, 4], [3, 3, 3], [2, 2, 2]]
    q = npu_quantize(x, torch.tensor([1.0, 2.0, 4.0]), None, torch.qint8, axis=-2)
    assert q.tolist() == [[4, 4, 4], [3, 3, 3], [2, 2, 2]]


def test_div_mode_axis_4_on_an_8d_input_quint8():
    # op-plugin test/test_custom_ops/test_npu_quantize.py test_npu_quantize_3_3_3_3_3_3_3_3_4_uint8
    g = np.random.default_rng(4)
    x = g.uniform(-1, 1, (3,) * 8).astype(np.float32)
    s = g.uniform(0.01, 1, 3).astype(np.float32)
    zp = np.array([0, 100, 200], dtype=np.int32)
    got = npu_quantize(
        torch.from_numpy(x), torch.from_numpy(s), torch.from_numpy(zp), torch.quint8, 4
    )
    assert got.dtype == torch.uint8
    assert np.array_equal(got.numpy(), quantize_golden_np(x, s, zp, 4, 0, 255))
    wrong_axis = quantize_golden_np(x, s, zp, 7, 0, 255)
    assert not np.array_equal(got.numpy(), wrong_axis)  # the case discriminates the axis


def test_div_mode_axis_2_on_a_4d_fp16_input():
    # Like op-plugin test_npu_quantize_30_30_30_30_30_2_uint8: fp16 input, fp32 scales, axis 2.
    g = np.random.default_rng(2)
    x = g.uniform(-1, 1, (2, 3, 6, 6)).astype(np.float16)
    s = g.uniform(0.005, 0.05, 6).astype(np.float32)
    zp = g.integers(0, 50, 6).astype(np.uint8)
    got = npu_quantize(
        torch.from_numpy(x), torch.from_numpy(s), torch.from_numpy(zp), torch.quint8, 2
    )
    assert np.array_equal(got.numpy(), quantize_golden_np(x, s, zp, 2, 0, 255))
    assert not np.array_equal(got.numpy(), quantize_golden_np(x, s, zp, 3, 0, 255))


def test_div_mode_default_axis_1_on_a_3d_input():
    x = torch.tensor([[[2.0, 2.0], [2.0, 2.0]]])  # (1, 2, 2): axis 1 and the last axis both 2 long
    q = npu_quantize(x, torch.tensor([1.0, 0.5]), None, torch.qint8)
    assert q.tolist() == [[[2, 2], [4, 4]]]  # scales along axis 1 (rows), not the last axis


def test_div_mode_qint32_and_its_saturation():
    x = torch.tensor([[1000.0, -3.0, 2.5], [1e10, -1e10, float("nan")], [7.0, 7.0, 7.0]])
    zp = torch.tensor([0, 5, -7], dtype=torch.int32)
    q = npu_quantize(x, torch.tensor([0.5, 1.0, 2.0]), zp, torch.qint32, axis=0)
    assert q.dtype == torch.int32
    # 2000, -6, 5 | saturated to the int32 range, NaN + 5 -> 0 (quantize_golden nan_to_num) | 3.5 - 7
    assert q.tolist() == [[2000, -6, 5], [2**31 - 1, -(2**31), 0], [-4, -4, -4]]


def test_div_mode_bad_axis_and_sizes_raise():
    with pytest.raises(ShapeError, match="axis 2 is outside"):
        npu_quantize(torch.ones(2, 3), torch.ones(3), None, torch.qint8, axis=2)
    with pytest.raises(ShapeError, match="zero_points"):
        npu_quantize(torch.ones(2, 3), torch.ones(3), torch.zeros(2), torch.qint8, axis=-1)


def test_mul_mode_axis_greater_than_minus_2_is_the_last_axis_and_minus_3_raises():
    x = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    s = torch.tensor([1.0, 2.0, 3.0])
    for axis in (0, 1, -1, 5):
        assert npu_quantize(x, s, None, torch.qint8, axis, False).tolist() == [[1, 2, 3], [2, 4, 6]]
    q = npu_quantize(x, torch.tensor([1.0, 3.0]), None, torch.qint8, -2, False)
    assert q.tolist() == [[1, 1, 1], [6, 6, 6]]
    with pytest.raises(ShapeError, match="axis -2 or an axis > -2"):
        npu_quantize(x, s, None, torch.qint8, -3, False)
    with pytest.raises(ShapeError, match="scales of input's dtype"):
        npu_quantize(x.half(), s, None, torch.qint8, -1, False)
    with pytest.raises(ShapeError, match="qint8 or quint4x2"):
        npu_quantize(x, s, None, torch.qint32, -1, False)


def test_mul_mode_quint4x2_packs_eight_int4_per_int32_low_nibble_first():
    x = torch.tensor([[0.0, 1, 2, 3, 4, 5, 6, 7], [-1.0, -8, -9, 7.5, 6.5, -0.5, 100, -2.5]])
    q = npu_quantize(x, torch.tensor([1.0]), None, torch.quint4x2, -1, False)
    assert q.dtype == torch.int32 and q.shape == (2, 1)
    # row 1: -1 -> F, -8 -> 8, -9 -> clip -8 -> 8, 7.5 -> 8 -> clip 7, 6.5 -> 6, -0.5 -> 0,
    # 100 -> 7, -2.5 -> -2 -> E; nibble j at bits 4j.
    assert q[0, 0].item() == 0x76543210
    assert q[1, 0].item() == 0xE706788F - 2**32
    with pytest.raises(ShapeError, match="multiple of 8"):
        npu_quantize(torch.ones(2, 6), torch.tensor([1.0]), None, torch.quint4x2, -1, False)


def test_mul_mode_quint4x2_matches_op_plugin_int4s_to_int32():
    # op-plugin test_npu_quantize.py test_npu_quantize_ascend_quant_v2_nz_pertensor: clip(rint(x*s),
    # -8, 7), nibble j of each group of eight at bits 4j (int4s_to_int32), here in numpy.
    g = np.random.default_rng(8)
    x = g.uniform(-10, 10, (3, 16)).astype(np.float32)
    s = np.float32(0.7)
    v = np.clip(np.rint(x * s), -8, 7).astype(np.int64) & 0xF
    words = (v.reshape(3, 2, 8) << (4 * np.arange(8))).sum(axis=-1)
    want = np.where(words >= 2**31, words - 2**32, words)
    got = npu_quantize(torch.from_numpy(x), torch.tensor([s]), None, torch.quint4x2, -1, False)
    assert np.array_equal(got.numpy().astype(np.int64), want)


def test_mul_mode_printed_npu_outputs_from_the_api_doc():
    # torch_npu docs/zh/custom_APIs/torch_npu/torch_npu-npu_quantize.md: the "Atlas 推理系列产品"
    # single-op example (fp32, scale 3, axis -1) and the graph-mode example (fp16, default axis 1
    # = the last axis in multiply mode). Inputs and outputs as printed by the NPU.
    x = torch.tensor(DOC_X_FP32)
    q = npu_quantize(x, torch.tensor([3.0] * 12), None, torch.qint8, -1, False)
    assert q.tolist() == DOC_Y_FP32
    x = torch.tensor(DOC_X_FP16, dtype=torch.float16)
    q = npu_quantize(
        x, torch.tensor([3.0] * 12, dtype=torch.float16), None, torch.qint8, div_mode=False
    )
    assert q.tolist() == DOC_Y_FP16


DOC_X_FP32 = [
    [
        [-7.7834e-01, -1.0473e00, -1.1155e00, 1.2233e00, -1.2271e00, -2.5612e00, -1.8274e-01, 2.8293e00, 1.9029e-01, -1.9333e00, -4.9270e-01, -1.0650e00],
        [-8.9416e-01, 3.1869e-02, -5.8144e-01, -4.9477e-01, 9.7323e-02, -3.8681e-01, 2.1969e-03, -6.3244e-01, 7.1591e-01, -1.8587e-01, -1.3381e00, -2.6253e-01],
        [1.8462e-02, 1.2397e-01, -9.0656e-01, -9.9280e-01, -4.4235e-02, 1.0623e00, -9.8437e-02, 1.2941e00, 1.0805e00, -1.7269e-01, -9.9205e-02, -6.1429e-01],
    ],
    [
        [1.3678e00, -2.7348e-01, -4.1354e-01, -9.4638e-01, 4.2792e-01, 8.0462e-01, 9.3584e-01, 6.3704e-01, 1.1269e00, -1.5329e00, 5.8572e-01, -1.3966e00],
        [3.5882e-01, 8.7029e-01, -1.3176e00, 1.1601e00, -3.6984e-01, 7.3642e-01, -1.0755e00, 6.6557e-01, 3.1149e00, -6.8776e-01, -1.0913e00, 4.4962e-01],
        [-1.2505e00, 1.5474e00, -7.4332e-02, -1.6657e00, 1.3275e00, 5.8914e-02, 8.4287e-01, -1.7109e00, 1.8256e-01, 3.2937e-01, 2.4875e00, 1.3921e00],
    ],
]  # fmt: skip
DOC_Y_FP32 = [
    [[-2, -3, -3, 4, -4, -8, -1, 8, 1, -6, -1, -3], [-3, 0, -2, -1, 0, -1, 0, -2, 2, -1, -4, -1], [0, 0, -3, -3, 0, 3, 0, 4, 3, -1, 0, -2]],
    [[4, -1, -1, -3, 1, 2, 3, 2, 3, -5, 2, -4], [1, 3, -4, 3, -1, 2, -3, 2, 9, -2, -3, 1], [-4, 5, 0, -5, 4, 0, 3, -5, 1, 1, 7, 4]],
]  # fmt: skip
DOC_X_FP16 = [
    [
        [0.2600, 0.6782, 0.5024, 0.9492, 0.6089, 0.7461, 1.5332, -0.2123, 0.6558, -0.8354, -0.5366, -0.6821],
        [-0.2522, 0.2415, -0.0269, -0.1497, 0.2256, -0.5239, 0.7363, -0.2468, 1.6064, 1.4170, -0.2213, 1.5947],
        [-0.6328, 0.8105, 0.2532, 1.0684, -1.2119, -0.6865, 0.7451, -0.8120, 0.6401, -2.1270, -0.9482, -1.1973],
    ],
    [
        [-1.7461, -1.1758, -0.5352, 1.5938, 1.8945, -2.2500, -0.5073, -0.8164, 0.8267, -0.4377, 1.2490, 0.2415],
        [0.8062, -1.0498, -0.8345, 1.1465, -0.7349, 0.1317, 0.2280, -0.8145, 0.2673, 1.4756, -1.6768, 1.1572],
        [-0.3147, -0.4446, -1.0508, 0.8325, 1.4590, 0.2096, -0.9961, 0.6089, -0.2460, 1.1543, 0.9277, 0.1079],
    ],
]  # fmt: skip
DOC_Y_FP16 = [
    [[1, 2, 2, 3, 2, 2, 5, -1, 2, -3, -2, -2], [-1, 1, 0, 0, 1, -2, 2, -1, 5, 4, -1, 5], [-2, 2, 1, 3, -4, -2, 2, -2, 2, -6, -3, -4]],
    [[-5, -4, -2, 5, 6, -7, -2, -2, 2, -1, 4, 1], [2, -3, -3, 3, -2, 0, 1, -2, 1, 4, -5, 3], [-1, -1, -3, 2, 4, 1, -3, 2, -1, 3, 3, 0]],
]  # fmt: skip
