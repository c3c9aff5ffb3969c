"""The fold check's float twin: what a frozen module's int8 weights mean, made per call."""

from __future__ import annotations

import torch

from opsnn_quant.folding.fold_check import DequantizedTwin, effective_bias
from tests.folding.test_smooth_fold import FloatSibling, quantized_fc


def test_the_dequantized_twin_computes_what_the_int8_weights_mean():
    model, (x,) = quantized_fc(FloatSibling)
    fc = model.fc
    h = model.norm(x)
    w = fc.weight.double() * fc.weight_quantizer.scale.double().reshape(-1, 1)
    w = w / fc.input_quantizer.smooth.double().reshape(1, -1)
    want = h.double() @ w.t() + effective_bias(fc).double()
    got = DequantizedTwin(fc)(h)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)
    assert not list(DequantizedTwin(fc).named_modules())[1:]  # holds no submodule
