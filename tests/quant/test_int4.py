"""w4a16: weight-only int4 per group, through quantize(), checkpoints and the target checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opsnn_quant.ascend import unpack_int4
from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
from opsnn_quant.policy.targets import get_target
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


def _model(k: int = 256, n: int = 24, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(k, n), nn.ReLU(), nn.Linear(n, 8))


def test_w4a16_is_symmetric_int4_per_group_of_input_channels():
    # Independent expectation in numpy: s[g, n] = max|W[n, g*G:(g+1)*G]| / 7,
    # q = clip(rint(W / s), -8, 7), y = x @ (q * s)^T + b (npu_weight_quant_batchmatmul's
    # antiquant step, op-plugin docs: weight * antiquant_scale per group along K).
    model = _model()
    w = model[0].weight.detach().numpy().astype(np.float64)
    b = model[0].bias.detach().numpy().astype(np.float64)
    q = quantize(model, {"0": QuantSpec(Precision.W4A16, group_size=64)}, None)
    lin = q[0]
    assert lin.weight.dtype == torch.int32 and tuple(lin.weight.shape) == (24, 256 // 8)
    assert tuple(lin.weight_quantizer.scale.shape) == (4, 24)
    s = np.abs(w.reshape(24, 4, 64)).max(axis=2) / 7.0  # (N, G)
    want_q = np.clip(np.rint(w.reshape(24, 4, 64) / s[:, :, None]), -8, 7).reshape(24, 256)
    assert np.array_equal(unpack_int4(lin.weight).numpy(), want_q.astype(np.int8))
    assert np.allclose(lin.weight_quantizer.scale.numpy().T, s, rtol=1e-6)
    x = torch.randn(5, 256)
    deq = (want_q.reshape(24, 4, 64) * s[:, :, None]).reshape(24, 256)
    want = x.numpy().astype(np.float64) @ deq.T + b
    assert np.allclose(lin(x).numpy(), want, atol=1e-4)


def test_w4a16_round_trips_through_a_checkpoint(tmp_path):
    model = _model(seed=1)
    specs = {"0": QuantSpec(Precision.W4A16), "2": QuantSpec(Precision.W8A16)}
    q = quantize(model, specs, None)
    x = torch.randn(3, 256)
    y = q(x)
    save_quantized(q, tmp_path / "ckpt")
    back = load_quantized(_model(seed=1), tmp_path / "ckpt")
    assert torch.equal(back(x), y)
    assert back[0].spec.group_size == 128


def test_w4a16_spec_checks_and_description_form():
    assert QuantSpec(Precision.W4A16).group_size == 128
    assert "group_size" not in QuantSpec(Precision.W8A8).to_dict()  # int8 descriptions unchanged
    assert QuantSpec(Precision.W4A16, group_size=64).to_dict()["group_size"] == 64
    with pytest.raises(ConfigError, match="multiple of 32"):
        QuantSpec(Precision.W4A16, group_size=48)
    with pytest.raises(ConfigError, match="group_size is for w4a16 only"):
        QuantSpec(Precision.W8A8, group_size=128)
    with pytest.raises(ConfigError, match="SmoothQuant needs quantized activations; w4a16"):
        QuantSpec(Precision.W4A16, smoothquant_alpha=0.5)
    with pytest.raises(ConfigError, match="multiple of 8"):
        quantize(nn.Sequential(nn.Linear(12, 4)), {"0": "w4a16"}, None)


def test_targets_run_w4a16_where_the_ops_exist():
    eager, atc = get_target("ascend910b-eager"), get_target("ascend910b-atc")
    assert eager.can_run("Linear", Precision.W4A16, weight_shape=(64, 256)) == (True, "")
    ok, why = eager.can_run("Linear", Precision.W4A16, weight_shape=(64, 128))
    assert not ok and "k > 128" in why  # torch_npu's group size lies in [32, k - 1]
    assert not atc.can_run("Linear", Precision.W4A16)[0]
    assert not get_target("cpu-reference").can_run("Conv2d", Precision.W4A16)[0]
