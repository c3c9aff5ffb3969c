"""quantize() from the probe's pass-1 statistics (``ProbeResult.statistics``) instead of its own passes.

The expectation is independent of the seeding code: quantize()'s own calibration passes over the
same data, compared bit for bit on every frozen buffer. The model takes 2-D inputs so that
quantize()'s calibration-mode Linear (``F.linear`` on rows) computes exactly the float model's
activations (on 3-D inputs the two may differ in the last bit, and an MSE clip can follow).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from opsnn_quant.core.timesteps import at_step
from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.probe.api import ProbeConfig, ProbeResult, run_probe, start_probe
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


class Stepped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 16)
        with torch.no_grad():
            self.fc1.weight[:, 3] *= 8  # an outlier input channel: SmoothQuant has work

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _sampling_loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for step, scale in enumerate((30.0, 10.0, 3.0, 1.0)):
        with at_step(step):
            x = torch.randn(8, 32, generator=g) * scale
            x[:, 5] *= 20
            model(x)


def _kept(model: nn.Module) -> ProbeResult:
    cfg = ProbeConfig(fp16=False, attribution=False)
    return run_probe(model, _sampling_loop, cfg, modalities={"": "denoiser"})


def _counting(calls: list[int]):
    def loop(model: nn.Module) -> None:
        calls.append(1)
        _sampling_loop(model)

    return loop


SEEDABLE = [
    QuantSpec(Precision.W8A8, observer="minmax"),
    QuantSpec(Precision.W8A8, observer="mse"),
    QuantSpec(Precision.W8A8, observer="minmax", activation_symmetric=False),
    QuantSpec(Precision.W8A8, smoothquant_alpha=0.5),
    QuantSpec(Precision.W8A8_DYNAMIC, smoothquant_alpha=0.75),
    QuantSpec(Precision.W8A8, timestep_bounds=(0, 2)),
    QuantSpec(Precision.W8A8, smoothquant_alpha=0.5, timestep_bounds=(0, 1, 3)),
]


@pytest.mark.parametrize(
    "spec", SEEDABLE, ids=lambda s: s.short_name() if hasattr(s, "short_name") else None
)
def test_quantize_from_the_probe_statistics_is_its_own_calibration_bit_for_bit(spec):
    model = Stepped()
    float_model = copy.deepcopy(model)
    keep = _kept(model)
    assert all(keep.statistics[n].can_seed(spec) for n in ("fc1", "fc2"))
    calls: list[int] = []
    seeded = quantize(copy.deepcopy(float_model), {"fc*": spec}, _counting(calls),
                      statistics=keep.statistics)  # fmt: skip
    assert calls == []  # no calibration pass ran
    own = quantize(copy.deepcopy(float_model), {"fc*": spec}, _counting(calls))
    assert len(calls) == (2 if spec.smoothquant and spec.static_activations else 1)
    a, b = seeded.state_dict(), own.state_dict()
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert different == []
    assert any("inv_scale" in k or "smooth" in k for k in a)  # calibrated buffers were compared


@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(Precision.W8A8, smoothquant_alpha="auto"),  # the row reservoir is gone
        QuantSpec(Precision.W8A8, observer="percentile"),  # pass 1 keeps no percentile histogram
        QuantSpec(Precision.W8A8, smoothquant_alpha=0.5, activation_symmetric=False),
        QuantSpec(Precision.W8A8, observer="mse", timestep_bounds=(0, 2)),
    ],
)
def test_what_the_statistics_cannot_give_exactly_is_calibrated_by_the_loop(spec):
    model = Stepped()
    float_model = copy.deepcopy(model)
    keep = _kept(model)
    assert not keep.statistics["fc1"].can_seed(spec)
    calls: list[int] = []
    seeded = quantize(copy.deepcopy(float_model), {"fc*": spec}, _counting(calls),
                      statistics=keep.statistics)  # fmt: skip
    assert calls  # the loop calibrated
    own = quantize(copy.deepcopy(float_model), {"fc*": spec}, _sampling_loop)
    a, b = seeded.state_dict(), own.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_module_without_statistics_sends_every_module_through_the_loop():
    model = Stepped()
    float_model = copy.deepcopy(model)
    keep = _kept(model)
    del keep.statistics["fc2"]
    calls: list[int] = []
    spec = QuantSpec(Precision.W8A8, observer="mse")
    quantize(
        copy.deepcopy(float_model), {"fc*": spec}, _counting(calls), statistics=keep.statistics
    )
    assert calls == [1]


def test_timestep_groups_need_every_call_in_the_sampling_loop():
    model = Stepped()

    def mixed(m: nn.Module) -> None:
        _sampling_loop(m)
        m(torch.randn(8, 32))  # a call outside the loop: quantize() would refuse it

    keep = run_probe(model, mixed, ProbeConfig(fp16=False, attribution=False),
                     modalities={"": "denoiser"})  # fmt: skip
    stats = keep.statistics["fc1"]
    assert stats.can_seed(QuantSpec(Precision.W8A8))
    assert not stats.can_seed(QuantSpec(Precision.W8A8, timestep_bounds=(0, 2)))


@pytest.mark.parametrize(
    "spec", SEEDABLE, ids=lambda s: s.short_name() if hasattr(s, "short_name") else None
)
def test_pass_one_alone_seeds_the_same_checkpoint_as_the_whole_probe(spec):
    """Decide first (issue 43): a staged probe's pass-1 result (no estimator run) seeds quantize
    exactly as the whole probe's does, before and after the estimators run on the same pass 1;
    its report says why nothing was estimated and holds no estimate."""
    model = Stepped()
    float_model = copy.deepcopy(model)
    cfg = ProbeConfig(fp16=False)
    staged = start_probe(
        GenericAdapter(model, {"": "denoiser"}, _sampling_loop), _sampling_loop, cfg
    )
    first = staged.first("a test decided on pass 1")
    assert first.report.not_estimated == "a test decided on pass 1"
    assert all(not m.w8a8 and m.e2e is None for m in first.report.modules)
    assert [m.calls for m in first.report.modules if m.name.startswith("fc")] == [4, 4]
    whole = staged.finish()
    assert whole.report.not_estimated is None
    assert all(whole.report.module(n).w8a8 for n in ("fc1", "fc2"))  # the estimators ran
    reference = run_probe(
        copy.deepcopy(float_model), _sampling_loop, cfg, modalities={"": "denoiser"}
    )
    states = [
        quantize(
            copy.deepcopy(float_model), {"fc*": spec}, _counting([]), statistics=s
        ).state_dict()
        for s in (first.statistics, whole.statistics, reference.statistics)
    ]
    for other in states[1:]:
        assert [k for k in states[0] if not torch.equal(states[0][k], other[k])] == []


def test_a_released_staged_probe_runs_no_estimator():
    staged = start_probe(
        GenericAdapter(Stepped(), {"": "denoiser"}, _sampling_loop),
        _sampling_loop,
        ProbeConfig(fp16=False),
    )
    staged.first("decided")
    staged.release()  # what pass 1 kept for the estimators is dropped
    with pytest.raises(RuntimeError, match="after release"):
        staged.finish()


@pytest.mark.parametrize("spec", SEEDABLE[:3])
def test_pass_one_of_the_baselines_schemes_seeds_what_pass_one_of_all_seeds(spec):
    """A measured search's first pass 1 gathers the naive baselines' schemes only (issue 43):
    their statistics are those of a pass 1 with every scheme, bit for bit; finishing runs pass 1
    again with every scheme (full) before the estimators."""
    float_model = Stepped()
    full = ProbeConfig(fp16=False)
    first = ProbeConfig(fp16=False, schemes=("w8a8", "w8a8_dynamic"))
    said: list[str] = []
    adapter = GenericAdapter(copy.deepcopy(float_model), {"": "denoiser"}, _sampling_loop)
    staged = start_probe(adapter, _sampling_loop, first, progress=said.append, full=full)
    cheap = staged.first("decided")
    assert cheap.statistics["fc1"].moments is None  # no GPTQ moments gathered
    whole = staged.finish()
    assert "probe pass 1 again, with the statistics of every candidate scheme" in said
    assert any(s.startswith("w8a8_gptq") for s in whole.report.module("fc1").w8a8)
    states = [
        quantize(
            copy.deepcopy(float_model), {"fc*": spec}, _counting([]), statistics=s
        ).state_dict()
        for s in (cheap.statistics, whole.statistics)
    ]
    assert [k for k in states[0] if not torch.equal(states[0][k], states[1][k])] == []


def test_pass_one_of_the_baselines_collects_no_statistic_they_do_not_read():
    """The naive baselines read min/max ranges only: the MSE histogram and SmoothQuant's
    per-channel maxima are not collected in that pass 1, and a spec that needs one is then
    calibrated by quantize's own pass over the data (never from an empty observer)."""
    first = ProbeConfig(fp16=False, schemes=("w8a8", "w8a8_dynamic"))
    adapter = GenericAdapter(Stepped(), {"": "denoiser"}, _sampling_loop)
    staged = start_probe(adapter, _sampling_loop, first).first("decided").statistics
    cheap, whole = staged["fc1"], _kept(Stepped()).statistics["fc1"]
    assert cheap.mse.count == 0 and cheap.channel_absmax is None
    assert whole.mse.count == cheap.minmax.count > 0 and whole.channel_absmax is not None
    for spec, seeds in ((SEEDABLE[0], True), (SEEDABLE[1], False), (SEEDABLE[3], False)):
        assert cheap.can_seed(spec) is seeds and whole.can_seed(spec), spec
    for spec, passes in ((SEEDABLE[0], []), (SEEDABLE[1], [1])):
        calls: list[int] = []
        quantize(Stepped(), {"fc*": spec}, _counting(calls), statistics=staged)
        assert calls == passes, spec  # the MSE clip from quantize's own pass
