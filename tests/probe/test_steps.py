"""Per-step activation ranges and the groups of steps chosen for per-step static scales."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from opsnn_quant.core.timesteps import at_step, current_step
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.probe.steps import JointSteps, StepRanges, best_grouping
from opsnn_quant.types import Precision


def _ranges(absmax: list[float], count: int = 1) -> StepRanges:
    r = StepRanges()
    for t, a in enumerate(absmax):
        r.absmax[t], r.count[t] = a, count
    return r


def test_the_groups_minimise_the_modelled_noise():
    # steps 0-1 at |x| <= 8, steps 2-3 at |x| <= 1: two groups cut at step 2. Modelled noise
    # (n * (max/127)^2 / 12 per group): one scale 4 * 64, two groups 2 * 64 + 2 * 1 (units of
    # 1/(127^2 * 12)); gain 10 log10(256 / 130) = 2.943 dB.
    r = _ranges([8.0, 8.0, 1.0, 1.0])
    assert r.best_bounds(1) == (0,)
    assert r.best_bounds(2) == (0, 2)
    assert r.gain_db((0, 2)) == pytest.approx(10 * math.log10(256 / 130), abs=1e-9)
    assert r.best_bounds(4) == (0, 1, 2, 3)
    assert r.gain_db(r.per_step_bounds()) == pytest.approx(10 * math.log10(256 / 130), abs=1e-9)
    # automatic: the fewest groups within 0.5 dB of four (two suffice here: nothing to gain after)
    assert r.choose(None) == (0, 2)
    assert _ranges([5.0, 5.0, 5.0]).choose(None) == (0,)  # flat ranges: one scale is enough
    assert r.choose(3) in ((0, 1, 2), (0, 2, 3))


class Stepped(nn.Module):
    """Input magnitude that falls 30x over the steps (as a denoiser's can)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _sampling_loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for step, scale in enumerate((30.0, 10.0, 3.0, 1.0)):
        with at_step(step):
            model(torch.randn(8, 32, generator=g) * scale)


def test_the_probe_reports_per_step_ranges_and_scores_per_step_scales():
    model = Stepped()
    # the static choices only (per-token dynamic scales would beat both on this input)
    cfg = ProbeConfig(max_root_calls=4, fp16=False, schemes=("w8a8", "w8a8_timestep"))
    report = probe(model, _sampling_loop, cfg, modalities={"": "denoiser"})
    fc1 = report.module("fc1")
    assert fc1.timesteps is not None and fc1.timesteps.steps == [0, 1, 2, 3]
    assert fc1.timesteps.max_min_ratio > 10
    assert fc1.timesteps.single_scale_loss_db > 5 and len(fc1.timesteps.bounds) >= 2
    assert fc1.w8a8["w8a8_timestep"].timestep_bounds == fc1.timesteps.bounds
    # per-step scales beat one static scale on this input, locally and end to end
    assert fc1.w8a8["w8a8_timestep"].sqnr_db > fc1.w8a8["w8a8"].sqnr_db + 3
    assert fc1.e2e.schemes["w8a8_timestep"] < fc1.e2e.schemes["w8a8"]
    policy = build_policy(report, target=get_target("cpu-reference"))
    rule = next(r for r in policy.rules if r.matches("fc1"))
    assert rule.precision == Precision.W8A8
    assert rule.quant_spec().timestep_bounds == tuple(fc1.timesteps.bounds)
    # a compiled ATC graph keeps one scale: the scheme is not even measured for that target,
    # and a report that measured it anyway gets the best scheme with one static scale
    assert "w8a8_timestep" not in get_target("ascend910b-atc").schemes()
    atc = next(
        r
        for r in build_policy(report, target=get_target("ascend910b-atc")).rules
        if r.matches("fc1")
    )
    assert atc.quant_spec().timestep_bounds is None
    assert "w8a8_timestep" in get_target("ascend910b-eager").schemes()


def test_no_sampling_loop_no_per_step_scheme():
    model = Stepped()

    def plain(m: nn.Module) -> None:
        m(torch.randn(8, 32))

    report = probe(model, plain, ProbeConfig(attribution=False, fp16=False),
                   modalities={"": "denoiser"})  # fmt: skip
    assert report.module("fc1").timesteps is None
    assert "w8a8_timestep" not in report.module("fc1").w8a8


def test_per_step_scales_on_smoothed_inputs_are_a_candidate_of_their_own():
    model = Stepped()
    cfg = ProbeConfig(max_root_calls=4, fp16=False,
                      schemes=("w8a8", "w8a8_timestep", "w8a8_timestep_smoothquant"))  # fmt: skip
    report = probe(model, _sampling_loop, cfg, modalities={"": "denoiser"})
    fc1 = report.module("fc1")
    both = fc1.w8a8["w8a8_timestep_smoothquant"]
    assert both.timestep_bounds == fc1.timesteps.bounds and both.smoothquant_alpha is not None
    assert both.sqnr_db > fc1.w8a8["w8a8"].sqnr_db
    policy = build_policy(report, target=get_target("ascend910b-eager"))
    spec = next(r for r in policy.rules if r.matches("fc1")).quant_spec()
    assert spec.timestep_bounds == tuple(fc1.timesteps.bounds)  # a per-step scheme won


def test_the_smoothed_per_step_candidate_is_what_quantize_builds():
    # The probe derives each group's scale from per-step per-channel maxima of x (max_c a_c/s_c);
    # quantize() observes x / s per group directly: the same scales, so the same SQNR.
    import copy

    from opsnn_quant.quant.api import quantize
    from opsnn_quant.quant.spec import QuantSpec

    model = Stepped()
    float_model = copy.deepcopy(model)
    cfg = ProbeConfig(max_root_calls=4, fp16=False, attribution=False,
                      schemes=("w8a8_timestep_smoothquant",))  # fmt: skip
    err = probe(model, _sampling_loop, cfg, modalities={"": "denoiser"}).module("fc1")
    err = err.w8a8["w8a8_timestep_smoothquant"]
    spec = QuantSpec(Precision.W8A8, smoothquant_alpha=err.smoothquant_alpha,
                     timestep_bounds=tuple(err.timestep_bounds))  # fmt: skip
    q = quantize(copy.deepcopy(float_model), {"fc1": spec}, _sampling_loop)
    inputs: list[tuple[int | None, torch.Tensor]] = []
    handle = float_model.fc1.register_forward_pre_hook(
        lambda m, a: inputs.append((current_step(), a[0]))
    )
    _sampling_loop(float_model)
    handle.remove()
    signal = noise = 0.0
    for step, x in inputs:
        ref = float_model.fc1(x).double()
        with at_step(step):
            got = q.fc1(x).double()
        signal += float((ref**2).sum())
        noise += float(((got - ref) ** 2).sum())
    assert err.sqnr_db == pytest.approx(10 * math.log10(signal / noise), abs=0.05)


def _ranges(absmax: list[float]) -> StepRanges:
    r = StepRanges()
    for t, a in enumerate(absmax):
        r.absmax[t], r.count[t] = a, 1
    return r


def test_joint_groups_weigh_each_tensor_by_its_own_improvement() -> None:
    # Noise of one group is count * (max / 127)^2 / 12; the constant cancels in the ratios.
    # A = [100, 100, 400, 400]: one group 4 * 400^2 = 640000; cut at 1: 100^2 + 3 * 400^2 =
    # 490000 (0.766); cut at 2: 2 * 100^2 + 2 * 400^2 = 340000 (0.531).
    # B = [8, 1, 1, 1]: one group 4 * 64 = 256; cut at 1: 64 + 3 = 67 (0.262); cut at 2:
    # 2 * 64 + 2 = 130 (0.508). Jointly, relative: cut 1 = 1.028 < cut 2 = 1.039; absolute
    # noise (A's 2500x larger) would cut at 2, as A alone does.
    a, b = _ranges([100, 100, 400, 400]), _ranges([8, 1, 1, 1])
    assert best_grouping(a, 2) == (0, 2)
    assert best_grouping(b, 2) == (0, 1)
    joint = JointSteps([a, b])
    assert best_grouping(joint, 2) == (0, 1)
    assert joint.group_cost(0, 4) == pytest.approx(2.0)  # each tensor's own one-group noise
    assert joint.group_cost(0, 1) + joint.group_cost(1, 4) == pytest.approx(
        (100**2 + 3 * 400**2) / 640000 + 67 / 256
    )
