"""The serving engines' int8 Linears (opsnn_quant/ascend/engines.py), against values worked out
by hand from the engines' sources:

* MindIE-SD ``mindiesd/quantization/layer.py`` (W8A8QuantLinear.forward: x cast to the engine
  dtype, ``x * mul_scale`` in it, ``npu_quantize`` divide mode, ``npu_quant_matmul`` with the
  float32 ``deq_scale`` and int32 ``quant_bias``; dynamic: ``npu_dynamic_quant`` then the
  per-token matmul with the engine-dtype ``weight_scale`` and ``bias``);
* vLLM-Ascend ``vllm_ascend/quantization/methods/w8a8_static.py`` (reciprocal of the params-dtype
  ``input_scale`` in that dtype, ``npu_quantize`` multiply mode, int64 ``deq_scale`` holding the
  fp32 bits in a float16 model, which the kernel truncates to 19 bits).
"""

import torch

from opsnn_quant.ascend import engines

W = torch.tensor([[1, 2, 3], [-1, 0, 1]], dtype=torch.int8)  # (N=2, K=3)
QB = torch.tensor([4, -4], dtype=torch.int32)
BF16, FP16 = torch.bfloat16, torch.float16


def test_mindie_sd_static_casts_to_bf16_then_divides():
    # 1.0327 rounds to bf16 1.03125 (spacing 2^-7), so q0 = rint(16.5) = 16 (17 in fp32)
    x = torch.tensor([[1.0327, -2.5, 3.75]])
    s = torch.tensor([0.0625], dtype=BF16)
    zp = torch.tensor([0], dtype=torch.int8)
    deq = torch.tensor([0.01, 0.5])
    y = engines.mindie_sd_static(x, W.t(), deq, QB, s, zp, None, BF16)
    # q = [16, -40, 60]; acc + quant_bias = [116 + 4, 44 - 4] = [120, 40]
    # 120 * 0.01 = 1.2 -> bf16 1.203125 (154 / 128); 40 * 0.5 = 20
    assert y.dtype == BF16
    assert y.float().tolist() == [[1.203125, 20.0]]


def test_mindie_sd_static_applies_mul_scale_in_bf16():
    x = torch.tensor([[1.0327, -2.5, 3.75]])
    mul = torch.tensor([2.0, 0.5, 1.0], dtype=BF16)
    s = torch.tensor([0.0625], dtype=BF16)
    zp = torch.tensor([0], dtype=torch.int8)
    y = engines.mindie_sd_static(x, W.t(), torch.tensor([0.01, 0.5]), QB, s, zp, mul, BF16)
    # x * mul = [2.0625, -1.25, 3.75] -> q = [33, -20, 60]; acc + qb = [173 + 4, 27 - 4]
    # 177 * 0.01 = 1.77 -> bf16 1.7734375 (227 / 128); 23 * 0.5 = 11.5
    assert y.float().tolist() == [[1.7734375, 11.5]]


def test_mindie_sd_dynamic_per_token():
    x = torch.tensor([[1.0327, -2.5, 3.75]])
    ws = torch.tensor([0.25, 0.125], dtype=BF16)
    bias = torch.tensor([1.0, -1.0], dtype=BF16)
    y = engines.mindie_sd_dynamic(x, W.t(), ws, bias, None, BF16)
    # bf16 x = [1.03125, -2.5, 3.75]; row max 3.75: q = rint(x * 127 / 3.75) = [35, -85, 127]
    # acc = [246, 92]; s_t = 3.75 / 127 = 0.0295276
    # y0 = 246 * 0.25 * s_t + 1 = 2.815945 -> bf16 2.8125; y1 = 92 * 0.125 * s_t - 1 = -0.660433
    # -> bf16 -0.66015625
    assert y.float().tolist() == [[2.8125, -0.66015625]]


def test_vllm_ascend_static_reciprocal_in_fp16_and_truncated_deq_scale():
    # input_scale 0.1 -> fp16 0.0999755859375; 1 / it = 10.0024 -> fp16 10.0
    x = torch.tensor([[1.0327, -2.5, 3.75]])
    s = torch.tensor([0.1], dtype=FP16)
    zp = torch.tensor([0], dtype=torch.int8)
    deq = torch.tensor([0.01, 0.5]).view(torch.int32).to(torch.int64)  # deqscale2int64
    y = engines.vllm_ascend_static(x, W.t(), deq, QB, s, zp, FP16)
    # fp16 x = [1.0322265625, -2.5, 3.75]; q = rint(x * 10) = [10, -25, 38] (37.5 to even)
    # acc + qb = [74 + 4, 28 - 4] = [78, 24]; 0.01's bits & 0xFFFFE000 = 0.00999450683...
    # 78 * 0.0099945068 = 0.7795715 -> fp16 0.77978515625; 24 * 0.5 = 12
    assert y.dtype == FP16
    assert y.float().tolist() == [[0.77978515625, 12.0]]


def test_vllm_ascend_dynamic_bf16():
    x = torch.tensor([[1.0327, -2.5, 3.75]])
    ws = torch.tensor([0.25, 0.125], dtype=BF16)
    bias = torch.tensor([1.0, -1.0], dtype=BF16)
    # no mul_scale: the same per-token arithmetic as MindIE-SD's dynamic Linear
    y = engines.vllm_ascend_dynamic(x, W.t(), ws, bias, BF16)
    assert y.float().tolist() == [[2.8125, -0.66015625]]


def test_weight_only_in_the_engine_dtype():
    x = torch.tensor([[1.0327, -2.5, 3.75]])
    y = engines.weight_only(x, W.t(), torch.tensor([0.25, 0.5]), None, BF16)
    # bf16 x times the dequantized weight: [1.03125 - 5 + 11.25, -1.03125 + 3.75] * scale
    assert y.dtype == BF16
    assert y.float().tolist() == [[7.28125 * 0.25, 2.71875 * 0.5]]
