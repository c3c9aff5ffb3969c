"""quantize(): module selection, calibration flow, determinism and bad input."""

import hashlib

import pytest
import torch

from opsnn_quant.errors import CalibrationError, CheckpointError, ConfigError
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.checkpoint import load_quantized, save_quantized
from opsnn_quant.quant.modules import QuantLinear
from opsnn_quant.quant.spec import QuantSpec
from tests.tiny_models import TinyAttention, TinyMLP, forward_loop_for


def test_first_matching_glob_wins_and_float_rules_leave_modules():
    model = TinyAttention()
    quantize(
        model, {"to_q": "fp16", "to_*": "w8a8", "ff*": "w8a8_dynamic"}, forward_loop_for(model)
    )
    assert isinstance(model.to_q, torch.nn.Linear) and not isinstance(model.to_q, QuantLinear)
    assert isinstance(model.to_k, QuantLinear) and model.to_k.spec.precision == "w8a8"
    assert isinstance(model.ff1, QuantLinear) and model.ff1.spec.precision == "w8a8_dynamic"


def test_a_glob_matching_nothing_is_an_error():
    model = TinyMLP()
    with pytest.raises(ConfigError, match=r"'decoder\.\*' matches no module"):
        quantize(model, {"decoder.*": "w8a8"}, forward_loop_for(model))


def test_an_int8_glob_that_only_matches_non_linear_layers_is_an_error():
    model = TinyAttention()
    with pytest.raises(ConfigError, match=r"'norm1'.*no Linear/Conv2d"):
        quantize(model, {"norm1": "w8a8"}, forward_loop_for(model))


def test_unknown_precision_is_an_error():
    with pytest.raises(ConfigError, match="unknown precision 'int4'"):
        quantize(TinyMLP(), {"fc1": "int4"}, None)


def test_nan_calibration_data_names_the_module():
    model = TinyMLP()

    def loop(m):
        x = model.example_inputs()[0]
        x[0, 0, 0] = float("nan")
        m(x)

    with pytest.raises(CalibrationError, match="module 'fc1' contain NaN or Inf"):
        quantize(model, {"*": "w8a8"}, loop)


def test_module_never_reached_by_forward_loop():
    model = TinyAttention()

    def loop(m):  # calls only the first projection
        m.to_q(torch.randn(2, 64))

    with pytest.raises(CalibrationError, match="'to_k' was never called"):
        quantize(model, {"to_*": "w8a8"}, loop)


def test_static_quantization_needs_a_forward_loop_but_weight_only_does_not():
    with pytest.raises(ConfigError, match="need a forward_loop"):
        quantize(TinyMLP(), {"*": "w8a8"}, None)
    model = quantize(TinyMLP(), {"*": "w8a16"}, None)
    assert isinstance(model.fc1, QuantLinear) and model.fc1.frozen


def test_two_pass_calibration_with_smoothquant():
    model = TinyMLP()
    calls = []
    loop = forward_loop_for(model)

    def counting(m):
        calls.append(1)
        loop(m)

    quantize(model, {"fc1": QuantSpec("w8a8", smoothquant_alpha="auto")}, counting)
    assert len(calls) == 2
    assert model.fc1.input_quantizer.chosen_alpha in (None, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def _digest(tmp_path, name):
    model = TinyAttention(seed=3)
    quantize(
        model,
        {
            "to_*": QuantSpec("w8a8", observer="mse"),
            "ff1": QuantSpec("w8a8", smoothquant_alpha="auto"),
            "ff2": "w8a8_dynamic",
        },
        forward_loop_for(model),
    )
    out = save_quantized(model, tmp_path / name, source_model="tiny-attention")
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(), (
        out / "description.json"
    ).read_bytes()


def test_calibration_is_deterministic_byte_for_byte(tmp_path):
    a = _digest(tmp_path, "a")
    b = _digest(tmp_path, "b")
    assert a == b


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path):
    model = TinyAttention(seed=4)
    quantize(
        model,
        {
            "to_*": QuantSpec("w8a8", activation_symmetric=False),
            "ff1": QuantSpec("w8a8_dynamic", smoothquant_alpha=0.5),
            "ff2": "w8a16",
        },
        forward_loop_for(model),
    )
    save_quantized(model, tmp_path / "q")
    restored = load_quantized(TinyAttention(seed=4), tmp_path / "q")
    (x,) = model.example_inputs(seed=42)
    assert torch.equal(restored(x), model(x))


def test_checkpoint_into_a_model_of_different_shapes(tmp_path):
    model = TinyMLP()
    quantize(model, {"*": "w8a8"}, forward_loop_for(model))
    save_quantized(model, tmp_path / "q")
    with pytest.raises(CheckpointError, match="module 'fc1': weight shape"):
        load_quantized(TinyMLP(d_hidden=96), tmp_path / "q")
    with pytest.raises(CheckpointError, match="not found"):
        load_quantized(TinyMLP(), tmp_path / "missing")


def test_save_is_atomic_and_keeps_previous_output_on_failure(tmp_path, monkeypatch):
    model = TinyMLP()
    quantize(model, {"*": "w8a8"}, forward_loop_for(model))
    save_quantized(model, tmp_path / "q")
    before = (tmp_path / "q" / "model.safetensors").read_bytes()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr("opsnn_quant.quant.checkpoint.save", boom)
    with pytest.raises(RuntimeError):
        save_quantized(model, tmp_path / "q")
    assert (tmp_path / "q" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]
