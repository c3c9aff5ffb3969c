"""SmoothQuant factors in the AscendV1 export: folded into the producer, or the module refused."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch
from torch import nn

from opsnn_quant.formats.ascendv1.consumer import apply_ascendv1
from opsnn_quant.formats.ascendv1.export import export_ascendv1
from opsnn_quant.formats.ascendv1.reader import read_ascendv1
from opsnn_quant.producers import trace_producers
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.recording import replay
from tests.tiny_models import TinyAttention, forward_loop_for


class Stub:
    """The two adapter attributes the exporter reads."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.model_id = model, "tiny"


def _export(model: nn.Module, tmp: Path, inputs: tuple) -> tuple[dict, Path]:
    out = tmp / "av1"
    source = tmp / "src"
    source.mkdir(exist_ok=True)
    (source / "config.json").write_text("{}")
    calls = {"": [(inputs, {})]}
    export_ascendv1(Stub(model), out, calls=calls, source_dir=source)  # type: ignore[arg-type]
    return json.loads((out / "quant_model_description.json").read_text()), out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


def test_a_norms_only_consumer_is_folded_and_shared_or_functional_inputs_are_refused(tmp_path):
    s = 0.5
    specs = {"ff1": QuantSpec("w8a8", smoothquant_alpha=s), "ff2": QuantSpec("w8a8", smoothquant_alpha=s),
             "to_q": QuantSpec("w8a8", smoothquant_alpha=s), "to_k": QuantSpec("w8a8"),
             "to_v": QuantSpec("w8a8_dynamic", smoothquant_alpha=s), "to_out": QuantSpec("w8a16")}  # fmt: skip
    model = TinyAttention()
    quantize(model, specs, forward_loop_for(model))
    x = model.example_inputs(seed=7)
    desc, out = _export(model, tmp_path, x)
    meta = desc["metadata"]["opsnn_quant"]
    assert meta["smoothquant_folded_into"] == {"ff1": "norm2"}
    floats = meta["exported_float"]
    assert set(floats) == {"ff2", "to_q", "to_v"}
    assert "not the output of one module" in floats["ff2"]  # F.gelu is no module
    assert "norm1 also feeds to_k (QuantLinear), which needs its input as is" in floats["to_q"]
    assert {desc["ff1.weight"], desc["to_k.weight"], desc["to_out.weight"]} == {"W8A8", "W8A16"}
    # norm-linear fold (msModelSlim subgraph_fusion.py): the norm's weight and bias / s_j
    ckpt = read_ascendv1(out)
    factor = model.ff1.input_quantizer.smooth.double()
    fresh = TinyAttention()
    for p in ("weight", "bias"):
        want = (getattr(fresh.norm2, p).double() / factor).float()
        assert torch.equal(ckpt.load(f"norm2.{p}"), want)
    # ff1 keeps our int8 weight and takes the per-tensor part of our multiplier
    assert torch.equal(ckpt.load("ff1.weight"), model.ff1.weight)
    assert torch.equal(ckpt.load("ff1.input_scale"), model.ff1.input_quantizer.scale.reshape(1))
    consumer = apply_ascendv1(fresh, ckpt)
    ours = replay(model, (x, {}))
    got = replay(consumer, (x, {}))
    assert _rel(got, ours) < 0.02
    # without the fold the exported ff1 would quantize x instead of x / s: far off
    unfolded = apply_ascendv1(TinyAttention(), ckpt)
    unfolded.norm2.load_state_dict(TinyAttention().norm2.state_dict())
    assert _rel(replay(unfolded, (x, {})), ours) > 5 * _rel(got, ours)


class ResidualUse(nn.Module):
    """The norm's output also joins a residual sum: no module hook sees that use."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)
        self.side = nn.Linear(16, 16)  # float, compensated when folded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.fc(h) + h + 0 * self.side(x)


class FloatSibling(ResidualUse):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.fc(h) + self.side(h)


def quantized_fc(cls: type[nn.Module]) -> tuple[nn.Module, tuple]:
    """A ``cls`` model with its ``fc`` quantized W8A8 + SmoothQuant, and one of its inputs."""
    m = cls()
    xs = [(torch.randn(4, 16) * torch.linspace(0.1, 8, 16),) for _ in range(3)]
    quantize(m, {"fc": QuantSpec("w8a8", smoothquant_alpha=0.5)}, lambda mm: [mm(*x) for x in xs])
    return m, xs[0]


def test_a_fold_that_changes_the_output_is_refused_by_the_numerical_check(tmp_path):
    model, x = quantized_fc(ResidualUse)
    desc, _ = _export(model, tmp_path, x)
    reason = desc["metadata"]["opsnn_quant"]["exported_float"]["fc"]
    assert "folding into norm changes the model's output" in reason
    assert desc["fc.weight"] == "FLOAT"


def test_a_float_linear_sharing_the_norm_absorbs_the_factor_in_its_columns(tmp_path):
    model, x = quantized_fc(FloatSibling)
    desc, out = _export(model, tmp_path, x)
    assert desc["metadata"]["opsnn_quant"]["smoothquant_folded_into"] == {"fc": "norm"}
    ckpt = read_ascendv1(out)
    factor = model.fc.input_quantizer.smooth.double()
    want = (FloatSibling().side.weight.double() * factor.reshape(1, -1)).float()
    assert torch.equal(ckpt.load("side.weight"), want)
    consumer = apply_ascendv1(FloatSibling(), ckpt)
    assert _rel(replay(consumer, (x, {})), replay(model, (x, {}))) < 0.02


def test_the_trace_and_the_fold_checks_run_one_sample_of_the_first_call(tmp_path):
    # smooth_fold.FOLD_CHECK_SAMPLES: a fold is an identity or not on any sample; the whole batch
    # of a Whisper model's call was the export's peak memory.
    for cls, folded in ((FloatSibling, {"fc": "norm"}), (ResidualUse, {})):
        model, x = quantized_fc(cls)
        assert x[0].shape[0] == 4
        seen: list[int] = []
        model.register_forward_pre_hook(lambda _m, a, seen=seen: seen.append(a[0].shape[0]))
        (tmp_path / cls.__name__).mkdir()
        desc, _ = _export(model, tmp_path / cls.__name__, x)
        assert seen and set(seen) == {1}  # the trace, the check's two replays: one sample each
        assert desc["metadata"]["opsnn_quant"]["smoothquant_folded_into"] == folded


class _Keeps(nn.Module):
    """A module that is no fold target, remembering its last output weakly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        self.ref = weakref.ref(y)
        return y


class _Passes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x  # the norm's own tensor, handed on


class TraceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale, self.norm, self.passes = _Keeps(), nn.LayerNorm(8), _Passes()
        self.fc, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.alive: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.scale(x) + 1)
        self.alive.append(self.scale.ref() is not None)
        return self.fc(h) + self.fc2(self.passes(h))


def test_the_trace_keeps_no_activation_that_cannot_take_a_fold():
    model = TraceModel()
    producers, fed = trace_producers(model, {"": [((torch.randn(2, 8),), {})]})
    # scale's output was dropped by the model during the trace (a UNet's activations, held,
    # were the AscendV1 export's peak); before, the trace kept every module's output
    assert model.alive == [False]
    assert producers["fc"] == {"norm"}
    # a live tensor a non-foldable module returned is still seen as that module's output
    assert producers["fc2"] == {"passes"} and fed["norm"] == {"fc", "passes"}


class _Groups:
    """A config with smoothing groups (as a resolved policy for a fold target)."""

    def __init__(self, specs: dict, groups: dict) -> None:
        self.specs, self.smoothing_groups = specs, groups

    def module_specs(self, model: nn.Module) -> dict:
        return self.specs


def test_a_vllm_policys_shared_factors_are_all_folded_and_the_engine_runs_each_bit_for_bit(
    tmp_path,
):
    def vllm(p: str) -> QuantSpec:
        return QuantSpec(p, smoothquant_alpha=0.5, engine="vllm-ascend", output_dtype="bfloat16")

    specs = {"to_q": vllm("w8a8_dynamic"), "to_k": vllm("w8a8_dynamic"),
             "to_v": vllm("w8a8_dynamic"), "ff1": vllm("w8a8")}  # fmt: skip
    groups = {"norm1": ["to_k", "to_q", "to_v"], "norm2": ["ff1"]}
    model = TinyAttention()
    quantize(model, _Groups(specs, groups), forward_loop_for(model))
    x = model.example_inputs(seed=7)
    desc, out = _export(model, tmp_path, x)
    meta = desc["metadata"]["opsnn_quant"]
    # one factor per norm: each divides into its norm, nothing is written FLOAT for want of it
    assert meta["smoothquant_folded_into"] == {
        "to_q": "norm1", "to_k": "norm1", "to_v": "norm1", "ff1": "norm2",
    }  # fmt: skip
    assert "exported_float" not in meta or not set(meta["exported_float"]) & set(specs)
    assert {desc[f"{n}.weight"] for n in specs} == {"W8A8", "W8A8_DYNAMIC"}
    consumer = apply_ascendv1(TinyAttention(), read_ascendv1(out))
    # each of vLLM's Linears, given what its folded norm hands it (x / s), is our module
    g = torch.Generator().manual_seed(3)
    for name in specs:
        ours, engine = getattr(model, name), getattr(consumer, name)
        rows = torch.randn(12, ours.in_k, generator=g)
        with torch.no_grad():
            got = engine(rows / ours.input_quantizer.smooth)
        assert torch.equal(got.to(torch.float32), ours(rows)), name
    # the folded norm's output is x / s up to fp32 rounding, which the engine's bf16 cast of
    # the activations mostly absorbs (here: the same bits); an int8 rounding it moves would
    # show as ~1e-3, against the 5e-3 the quantization itself costs against float
    ours, got = replay(model, (x, {})), replay(consumer, (x, {}))
    assert _rel(got, ours) < 1e-4 < 1e-3 < _rel(ours, replay(TinyAttention(), (x, {})))
