"""Local int8 errors of every candidate scheme (probe pass 2): SQNR, SmoothQuant, noise power, infeasible schemes."""

import math

import pytest
import torch
from torch import nn

from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.probe.report import SensitivityReport
from tests.tiny_models import LINEAR_CANDIDATES, TinyMLP, forward_loop_for


def test_local_errors_and_smoothquant_on_an_outlier_channel():
    model = TinyMLP()
    report = probe(
        model, forward_loop_for(model), ProbeConfig(attribution=False), modalities={"": "denoiser"}
    )
    fc1 = report.module("fc1")
    assert set(fc1.w8a8) == LINEAR_CANDIDATES
    # the outlier input channel (x20) hurts per-tensor static quantization; SmoothQuant fixes it
    assert fc1.w8a8["w8a8_smoothquant"].sqnr_db > fc1.w8a8["w8a8"].sqnr_db + 3
    assert fc1.w8a8["w8a8_smoothquant"].smoothquant_alpha is not None
    assert 0.99 < fc1.w8a8["w8a8_dynamic"].cosine <= 1.0
    assert fc1.macs == 4 * 8 * 64 * 128 and fc1.calls == 4
    assert report.modalities["denoiser"].median_sqnr_db is not None


def test_local_probe_measures_noise_power_per_output_channel(monkeypatch):
    from opsnn_quant.probe.local import LocalProbe

    model = TinyMLP()
    kept = {}
    monkeypatch.setattr(LocalProbe, "release", lambda self: kept.setdefault(self.name, self))
    probe(
        model, forward_loop_for(model), ProbeConfig(attribution=False), modalities={"": "denoiser"}
    )
    lp = kept["fc1"]
    for scheme in lp.schemes:
        power = lp.noise_power(scheme)
        energy = lp.energies[scheme]
        assert power is not None and power.shape == (model.fc1.out_features,)
        # per-channel mean powers times elements per channel add up to the total noise energy
        assert float(power.sum()) * energy.channel_count == pytest.approx(energy.noise, rel=1e-9)


def test_an_int8_output_past_fp16_is_an_infeasible_scheme_not_a_crash():
    # A Linear whose output passes 65504 (weights x1e5 on unit inputs) feeding a LayerNorm: every
    # int8 candidate's fp16 output overflows. The probe records each scheme as infeasible (with
    # bf16 as the output dtype that fits), gives the module no end-to-end estimate, and goes on.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    with torch.no_grad():
        model[0].weight.mul_(1e5)
    data = [torch.randn(64, 16) for _ in range(3)]  # GPTQ's halves: 96 rows each for K = 16

    def loop(m: nn.Module) -> None:
        for x in data:
            m(x)

    report = probe(model, loop, modalities={"": "denoiser"})
    first = report.module("0")
    assert first.fp16 is not None and first.fp16.overflow
    assert set(first.w8a8) == LINEAR_CANDIDATES
    for name, err in first.w8a8.items():
        if "gptq" in name and err.infeasible is None:
            # GPTQ's error feedback can shrink the integers until the output fits fp16: then
            # it is a finite but worthless candidate (its output is nothing like the float one)
            assert err.sqnr_db is not None and err.sqnr_db < 3.0
            continue
        assert err.infeasible is not None and "float16 output" in err.infeasible
        assert err.fits_output_dtype == "bfloat16" and err.sqnr_db is None
    assert first.e2e is None
    last = report.module("2")  # after the LayerNorm: in range, scored as usual
    assert all(e.infeasible is None and e.sqnr_db is not None for e in last.w8a8.values())
    assert last.e2e is not None and math.isfinite(last.e2e.contribution)
    # the JSON round trip keeps the verdict
    again = SensitivityReport.model_validate_json(report.model_dump_json())
    assert again.module("0").w8a8["w8a8"].infeasible == first.w8a8["w8a8"].infeasible


def test_the_alpha_grid_and_bf16_switches_are_honoured():
    # One alpha searched: SmoothQuant either keeps it or turns off (None); no bf16 re-run: no
    # bf16 figure (the policy then pins overflows to fp32 for want of a measurement).
    model = TinyMLP()
    cfg = ProbeConfig(attribution=False, smoothquant_alphas=(0.7,), bf16=False)
    report = probe(model, forward_loop_for(model), cfg, modalities={"": "denoiser"})
    alpha = report.module("fc1").w8a8["w8a8_smoothquant"].smoothquant_alpha
    assert alpha in (0.7, None)
    assert all(m.fp16 is None or m.fp16.rel_error_bf16 is None for m in report.modules)
    assert any(m.fp16 is not None and m.fp16.rel_error_fp16 is not None for m in report.modules)


def test_pass_2_measures_a_few_spread_calls_of_a_big_module_and_many_of_a_small_one():
    from opsnn_quant.probe.local import LocalProbe

    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, padding=1)
    big = LocalProbe("conv", conv, error_rows=4096)
    for _ in range(10):  # 10 "denoising steps" of 8 samples x 32 x 32 = 8192 rows each
        big.collect(torch.randn(8, 4, 32, 32))
    assert big.error_calls() == 3  # at least three, spread: calls 0, 4 and 8 of 10
    lin = nn.Linear(16, 16)
    small = LocalProbe("lin", lin, error_rows=4096)
    for _ in range(40):  # per-token decoder calls: 4 rows each
        small.collect(torch.randn(4, 1, 16))
    assert small.error_calls() == 32  # 4096 / 4 rows wanted, capped at 32 calls
    small.decide()
    signal = noise = 0.0
    with torch.no_grad():
        for i in range(40):
            x = torch.randn(4, 1, 16)
            y = lin(x)
            small.measure((x,), y)
            if i % 2 == 0:  # the call on its own: the independent expectation
                signal += float(y.double().pow(2).sum())
                yq = small.candidate_output("w8a8_dynamic", (x,))
                noise += float((yq.double() - y.double()).pow(2).sum())
    assert "w8a8" not in small.energies  # small calls wait to be measured together...
    small.flush()  # ... at the end of pass 2
    e = small.energies["w8a8"]
    assert e.channel_count == 20 * 4  # stride ceil(40 / 32) = 2: 20 calls of 4 rows
    assert e.signal == pytest.approx(signal, rel=1e-12)  # exactly the measured calls' outputs
    assert small.energies["w8a8_dynamic"].noise == pytest.approx(noise, rel=1e-9)


def test_a_big_call_is_measured_on_strided_samples_exactly():
    from opsnn_quant.probe.local import LocalProbe

    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, padding=1)
    lp = LocalProbe("conv", conv, error_rows=3 * 2048)  # 2048 rows per measured call
    x = torch.randn(8, 4, 32, 32)  # 1024 rows per sample: 2 samples of 8, every 4th
    lp.collect(x)
    lp.decide()
    with torch.no_grad():
        y = conv(x)
        lp.measure((x,), y)
        sub = y[::4]
        yq = lp.candidate_output("w8a8", (x[::4],))
    e = lp.energies["w8a8"]
    assert e.channel_count == 2 * 32 * 32
    assert e.signal == pytest.approx(float(sub.double().pow(2).sum()), rel=1e-12)
    assert e.noise == pytest.approx(float((yq.double() - sub.double()).pow(2).sum()), rel=1e-12)


def test_small_calls_in_a_sampling_loop_wait_in_batches_of_their_group_of_steps():
    # A DiT's few tokens per denoiser call: the calls of one group of steps run as one batch at
    # that group's scales; each batch's noise equals the calls' noise measured one by one.
    from opsnn_quant.core.timesteps import at_step
    from opsnn_quant.probe.local import LocalProbe

    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    lp = LocalProbe("lin", lin, error_rows=4096, only=("w8a8_timestep", "w8a8_dynamic"))
    xs = [torch.randn(2, 3, 16) * (1 + 4 * (t >= 5)) for t in range(10)]  # range jumps at step 5
    for t, x in enumerate(xs):
        with at_step(t):
            lp.collect(x)
    lp.decide()
    assert lp.step_bounds is not None and len(lp.step_bounds) >= 2
    noise = dict.fromkeys(lp.schemes, 0.0)
    with torch.no_grad():
        for t, x in enumerate(xs):
            with at_step(t):
                y = lin(x)
                lp.measure((x,), y)
                for s in lp.schemes:  # the independent expectation: the call on its own
                    noise[s] += float((lp.candidate_output(s, (x,)).double() - y.double()).pow(2).sum())  # fmt: skip
    # 60 rows: the earlier groups' batches were measured when the loop moved on, the last
    # group's waits (one open batch per module)
    assert lp.pending_batches == 1
    first_groups = sum(6 for t in range(10) if t < lp.step_bounds[-1])
    assert lp.energies["w8a8_dynamic"].channel_count == first_groups
    lp.flush()
    for s in lp.schemes:
        assert lp.energies[s].channel_count == 60
        assert lp.energies[s].noise == pytest.approx(noise[s], rel=1e-9)


def test_small_conv_calls_wait_with_calls_of_the_same_feature_map_shape():
    from opsnn_quant.probe.local import LocalProbe
    from opsnn_quant.probe.pending import PENDING_ROWS

    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, padding=1)
    lp = LocalProbe("conv", conv, error_rows=4096, only=("w8a8",))
    shapes = [(2, 4, 8, 8), (2, 4, 4, 4), (2, 4, 8, 8)]  # 128, 32 and 128 rows
    xs = [torch.randn(s) for s in shapes]
    for x in xs:
        lp.collect(x)
    lp.decide()
    noise = 0.0
    with torch.no_grad():
        for x in xs:
            y = conv(x)
            lp.measure((x,), y)
            noise += float((lp.candidate_output("w8a8", (x,)).double() - y.double()).pow(2).sum())
    # 128 + 32 + 128 rows: each change of map size measures the open batch (8x8, then 4x4)
    assert PENDING_ROWS > 128 and lp.pending_batches == 1
    assert lp.energies["w8a8"].channel_count == 2 * (64 + 16)
    lp.flush()
    e = lp.energies["w8a8"]
    assert e.channel_count == 2 * (64 + 16 + 64)
    assert e.noise == pytest.approx(noise, rel=1e-9)


def test_nan_activations_name_the_module_that_saw_them():
    from opsnn_quant.errors import CalibrationError

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    x[0, 0] = float("nan")
    with pytest.raises(CalibrationError, match=r"module '0': activations contain NaN or Inf"):
        probe(model, lambda m: m(x), ProbeConfig(attribution=False))


def _outlier_rows(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 16, generator=g)
    x[:, 3] *= 30.0  # one outlier channel: SmoothQuant has something to move
    return x


def test_a_group_shares_one_factor_searched_on_its_stacked_weights():
    from opsnn_quant.probe.local import LocalProbe, decide_shared
    from opsnn_quant.quant.smoothquant import ChannelStats, search_alphas
    from opsnn_quant.quant.spec import DEFAULT_ALPHA_GRID

    torch.manual_seed(0)
    a, b = nn.Linear(16, 8), nn.Linear(16, 24)
    probes = [LocalProbe("a", a), LocalProbe("b", b)]
    x = _outlier_rows(1)
    for lp in probes:
        lp.collect(x)
    assert decide_shared(probes)
    # the search of one Linear holding both weights (its output rows are each member's)
    ref = ChannelStats(16)
    ref.collect(x)
    stacked = torch.cat([a.weight, b.weight]).detach()
    want = search_alphas(ref, stacked, (False, True), DEFAULT_ALPHA_GRID)
    for key, (alpha, s, _) in zip(("static", "dynamic"), want, strict=True):
        assert alpha is not None  # the outlier makes smoothing pay
        for lp in probes:
            assert lp.alphas[key] == alpha and torch.equal(lp.smooth[key], s)
        # s_j = max|x_j|^alpha / max(max|Wa_j|, max|Wb_j|)^(1 - alpha) (SmoothQuant, eq. 4)
        w_max = torch.maximum(a.weight.abs().amax(0), b.weight.abs().amax(0)).detach()
        by_hand = x.abs().amax(0) ** alpha / w_max ** (1 - alpha)
        torch.testing.assert_close(s, by_hand, rtol=1e-5, atol=0)
    # members that saw different inputs cannot share a factor: nothing decided
    other = [LocalProbe("a", a), LocalProbe("b", b)]
    other[0].collect(x)
    other[1].collect(_outlier_rows(2))
    assert not decide_shared(other) and not other[0].alphas


def test_fold_smoothing_records_the_groups_and_one_alpha_per_group():
    from tests.tiny_models import TinyAttention

    model = TinyAttention()
    cfg = ProbeConfig(fold_smoothing=True)
    report = probe(model, forward_loop_for(model), cfg, modalities={"": "denoiser"})
    # norm1 feeds q/k/v only, norm2 feeds ff1 only; to_out / ff2 have no norm before them
    assert report.smoothing_groups == {"norm1": ["to_k", "to_q", "to_v"], "norm2": ["ff1"]}
    for scheme in ("w8a8_smoothquant", "w8a8_dynamic_smoothquant"):
        alphas = {report.module(n).w8a8[scheme].smoothquant_alpha for n in ("to_q", "to_k", "to_v")}
        assert len(alphas) == 1
    # without it (a target that smooths at run time) no groups are traced
    plain = probe(model, forward_loop_for(model), ProbeConfig(), modalities={"": "denoiser"})
    assert plain.smoothing_groups == {}
