"""quantize(): module selection, calibration flow, determinism and bad input."""

import copy
import hashlib

import pytest
import torch
from torch import nn

from opsnn_quant.errors import CalibrationError, CheckpointError, ConfigError
from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
from opsnn_quant.quant.api import quantize
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


def test_module_never_reached_by_forward_loop(caplog):
    def loop(m):  # calls only the first projection
        m.to_q(torch.randn(2, 64))

    # named exactly: an error
    with pytest.raises(CalibrationError, match="'to_k' was never called"):
        quantize(TinyAttention(), {"to_q": "w8a8", "to_k": "w8a8"}, loop)
    # matched by a wildcard: the modules the loop never reaches stay float, with one warning
    model = TinyAttention()
    with caplog.at_level("WARNING", logger="opsnn_quant.quant.api"):
        quantize(model, {"to_*": "w8a8"}, loop)
    assert isinstance(model.to_q, QuantLinear) and model.to_q.frozen
    for name in ("to_k", "to_v"):
        assert type(getattr(model, name)) is nn.Linear, name
    assert len(caplog.records) == 1
    assert "matched by a wildcard stay float: to_k (never called by the forward_loop)" in (
        caplog.records[0].getMessage()
    )


def test_a_wildcards_scheme_applies_where_it_can_and_an_exact_name_is_strict(caplog):
    # SmoothQuant is Linear-only: "*" with it quantizes the Linears and leaves the conv float.
    class ConvThenLinear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(x).mean(dim=(2, 3)))

    def loop(m):
        m(torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)))

    spec = QuantSpec("w8a8", smoothquant_alpha=0.5)
    model = ConvThenLinear()
    with caplog.at_level("WARNING", logger="opsnn_quant.quant.api"):
        quantize(model, {"*": spec}, loop)
    assert isinstance(model.fc, QuantLinear) and type(model.conv) is nn.Conv2d
    assert "conv (SmoothQuant is supported on Linear layers only)" in caplog.text
    with pytest.raises(ConfigError, match="SmoothQuant is supported on Linear layers only"):
        quantize(ConvThenLinear(), {"conv": spec, "fc": spec}, loop)


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


def test_save_writes_into_a_new_directory_and_never_over_files(tmp_path):
    # the library writes into a directory it is given (made when missing) and never replaces or
    # removes anything: replacing an output whole, atomically, is the commands' (io.atomic_dir)
    from opsnn_quant.errors import OutputError

    model = TinyMLP()
    quantize(model, {"*": "w8a8"}, forward_loop_for(model))
    save_quantized(model, tmp_path / "new" / "q")
    before = (tmp_path / "new" / "q" / "model.safetensors").read_bytes()
    with pytest.raises(OutputError, match="not empty"):
        save_quantized(model, tmp_path / "new" / "q")
    assert (tmp_path / "new" / "q" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "new" / "q").iterdir()) == [
        "description.json", "model.safetensors"
    ]  # fmt: skip
    (tmp_path / "empty").mkdir()
    save_quantized(model, tmp_path / "empty")  # an empty one is written into
    assert (tmp_path / "empty" / "model.safetensors").read_bytes() == before


class _Fed(nn.Module):
    """One norm feeding three Linears, with an outlier channel before it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.ln = nn.LayerNorm(16)
        self.a, self.b, self.c = nn.Linear(16, 8), nn.Linear(16, 24), nn.Linear(16, 4)
        with torch.no_grad():
            self.ln.weight[3] = 25.0  # the norm's gain makes channel 3 an outlier
            self.c.weight[:, 5] = 9.0  # the float member's column maxima count too

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        return torch.cat([self.a(h), self.b(h), self.c(h)], dim=-1)


class _Grouped:
    """A config with a smoothing group (as a resolved policy): module_specs + smoothing_groups."""

    def __init__(self, specs: dict, groups: dict) -> None:
        self.specs, self.smoothing_groups = specs, groups

    def module_specs(self, model: nn.Module) -> dict:
        return self.specs


@pytest.mark.parametrize("seeded", [False, True])
def test_a_smoothing_group_shares_one_factor_over_all_its_weights(seeded):
    from opsnn_quant.probe.local import LocalProbe

    model = _Fed()
    float_model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 6, 16, generator=g) for _ in range(3)]

    def loop(m: nn.Module) -> None:
        for x in xs:
            m(x)

    alpha = 0.5
    specs = {"a": QuantSpec("w8a8", smoothquant_alpha=alpha),
             "b": QuantSpec("w8a8_dynamic", smoothquant_alpha=alpha)}  # fmt: skip
    config = _Grouped(specs, {"ln": ["a", "b", "c"]})
    stats = None
    if seeded:  # the probe's pass-1 statistics stand in for the calibration pass
        probes = {n: LocalProbe(n, getattr(model, n)) for n in ("a", "b")}
        handles = [getattr(model, n).register_forward_pre_hook(
            lambda mod, args, lp=lp: lp.collect(args[0])) for n, lp in probes.items()]  # fmt: skip
        loop(model)
        for h in handles:
            h.remove()
        stats = {n: lp.pass_one() for n, lp in probes.items()}
    quantize(model, config, loop, statistics=stats)
    sa, sb = model.a.input_quantizer.smooth, model.b.input_quantizer.smooth
    assert torch.equal(sa, sb)  # one factor: the norm can take it
    # s_j = max|h_j|^alpha / max over a, b and c of max|W_j|^(1 - alpha)
    with torch.no_grad():
        h = torch.cat([float_model.ln(x).reshape(-1, 16) for x in xs])
        w = torch.cat([float_model.a.weight, float_model.b.weight, float_model.c.weight])
    by_hand = h.abs().amax(0) ** alpha / w.abs().amax(0) ** (1 - alpha)
    torch.testing.assert_close(sa, by_hand, rtol=1e-5, atol=0)
    assert float(w.abs().amax(0)[5]) == 9.0  # c's column sets channel 5's weight maximum
    assert type(model.c) is nn.Linear  # c stays float (its weight will absorb s at export)


def test_a_group_cannot_search_its_alpha_per_member():
    model = _Fed()
    config = _Grouped({"a": QuantSpec("w8a8", smoothquant_alpha="auto")}, {"ln": ["a", "b"]})
    with pytest.raises(ConfigError, match="takes one fixed alpha"):
        quantize(model, config, lambda m: m(torch.randn(2, 16)))


@pytest.mark.slow
def test_the_readme_glob_example_quantizes_a_pipeline(tmp_path, caplog):
    # docs/python-api.md: {"unet.*.attn2.*": "fp16", "*": QuantSpec("w8a8", smoothquant_alpha="auto")} on
    # a whole text-to-image pipeline: the convs (no SmoothQuant) and the VAE encoder (never run
    # in text-to-image) stay float with one warning; every Linear that ran is int8.
    import opsnn_quant as oq
    from tests.tiny_pipelines import save_tiny_sd

    save_tiny_sd(tmp_path / "pipe")
    adapter = oq.load_adapter("diffusers-sd", str(tmp_path / "pipe"), steps=2, batch_size=2)
    config = {"unet.*.attn2.*": "fp16", "*": oq.QuantSpec("w8a8", smoothquant_alpha="auto")}
    with caplog.at_level("WARNING", logger="opsnn_quant.quant.api"):
        oq.quantize(adapter.model, config, adapter.forward_loop(["a red circle", "a blue square"]))
    mods = dict(adapter.model.named_modules())
    assert isinstance(mods["unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"],
                      QuantLinear)  # fmt: skip
    assert (
        type(mods["unet.down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_q"]) is nn.Linear
    )
    assert type(mods["unet.conv_in"]) is nn.Conv2d
    assert "matched by a wildcard stay float" in caplog.text and "unet.conv_in" in caplog.text
    images = adapter.generate(["a red circle"])
    assert images[0].shape[-1] == 3
