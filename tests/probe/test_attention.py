"""The probe's attention modules (opsnn_quant/probe/attention.py): pass-1 ranges equal to what
``quantize`` calibrates, the SDPA MACs moved into the measured share, end-to-end contributions
from the same replay checked against measuring the quantized model, and the op's refusals."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention
from torch import nn

from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.policy.rule import Rule
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


class _Net(nn.Module):
    """Two self-attentions (head dim 32) between Linears; the second's input is 4x larger."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.attn1 = Attention(query_dim=64, heads=2, dim_head=32)
        self.attn2 = Attention(query_dim=64, heads=2, dim_head=32)
        self.out = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn1(self.inp(x))
        return self.out(self.attn2(4.0 * h))


def _data(batches: int = 2, batch: int = 2) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(batch, 48, 16, generator=gen) for _ in range(batches)]


def _probe(model: nn.Module, cfg: ProbeConfig, data: list[torch.Tensor] | None = None):
    data = data if data is not None else _data()

    def loop(m: nn.Module) -> None:
        for x in data:
            m(x)

    adapter = GenericAdapter(model, {"": "denoiser"}, loop)
    return probe(adapter, adapter.forward_loop(), cfg), loop


def _cfg(target: str = "cpu-reference", **kw) -> ProbeConfig:
    return get_target(target).probe_config(fp16=False, schemes=("w8a8", "a8", "a8_kmean"), **kw)


def _model() -> _Net:
    torch.manual_seed(0)
    return _Net().eval()


def test_attention_entries_carry_their_sdpa_macs_errors_and_contributions() -> None:
    report, _ = _probe(_model(), _cfg())
    entry = report.module("attn1")
    assert entry.type == "SDPA" and entry.quantizable
    # (B=2, N=2, S=48, D=32): scores and values, 2 * 2 * 48 * 48 * (32 + 32) per call
    assert entry.macs == 2 * 2 * 48 * 48 * 64 and entry.calls == 2
    assert set(entry.w8a8) == {"a8", "a8_kmean"}
    assert all(e.sqnr_db is not None and e.sqnr_db > 20 for e in entry.w8a8.values())
    assert entry.e2e is not None and set(entry.e2e.schemes) == {"a8", "a8_kmean"}
    assert entry.e2e.contribution > 0
    # the measured SDPA MACs left the "other" MACs for the measured share
    summary = report.modalities["denoiser"]
    linear = sum(report.module(n).macs * report.module(n).calls for n in ("inp", "out"))
    qkv = sum(
        report.module(f"attn{i}.{p}").macs * 2
        for i in (1, 2)
        for p in ("to_q", "to_k", "to_v", "to_out.0")
    )
    assert summary.pass_macs == linear + qkv + 2 * entry.macs * entry.calls
    assert summary.other_macs == 0


def test_a_target_without_int8_attention_measures_none() -> None:
    report, _ = _probe(_model(), get_target("ascend910b-mindie-sd").probe_config(fp16=False))
    entry = report.module("attn1")
    assert entry.w8a8 == {} and not entry.quantizable and entry.macs == 0


def test_the_estimate_tracks_the_measured_output_noise() -> None:
    """First order: a module's contribution is the relative noise energy it adds to the output
    alone; measured by quantizing that attention alone with the probe's scheme. The estimate
    draws one random output direction per sample: 4 calls of 16 samples keep its spread
    (a chi-square mean of 64 draws) well inside the tolerance."""
    data = _data(batches=4, batch=16)
    report, loop = _probe(_model(), _cfg(max_root_calls=4, estimator_samples=16), data)
    for name in ("attn1", "attn2"):
        entry = report.module(name)
        assert entry.e2e is not None
        model = _model()
        with torch.no_grad():
            ref = [model(x) for x in data]
        k_mean = entry.e2e.scheme == "a8_kmean"
        quantize(model, {name: QuantSpec(Precision.A8, k_mean=k_mean)}, loop)
        with torch.no_grad():
            noise = sum(float((model(x) - r).pow(2).sum()) for x, r in zip(data, ref, strict=True))
        energy = sum(float(r.pow(2).sum()) for r in ref)
        measured = noise / energy
        assert entry.e2e.contribution == pytest.approx(measured, rel=0.4)


def test_decode_calls_leave_the_module_float_with_the_reason() -> None:
    class _Decode(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(16, 64)
            self.attn = Attention(query_dim=64, heads=2, dim_head=32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            return self.attn(h[:, :1], encoder_hidden_states=h)  # one query: decode

    torch.manual_seed(0)
    report, _ = _probe(_Decode().eval(), _cfg())
    entry = report.module("attn")
    assert {e.infeasible for e in entry.w8a8.values()} == {
        "the fused int8 attention cannot run a single query (decode: the op refuses int8 "
        "query/key/value, FIA doc l.429)"
    }
    assert entry.e2e is None


def _counted_probe(cfg: ProbeConfig):
    """The probe's whole result on the model, the loop over its data, and that loop's passes."""
    from opsnn_quant.probe.api import run_probe

    data = _data()
    passes: list[int] = []

    def loop(m: nn.Module) -> None:
        passes.append(1)
        for x in data:
            m(x)

    adapter = GenericAdapter(_model(), {"": "denoiser"}, loop)
    return run_probe(adapter, adapter.forward_loop(), cfg), loop, passes, data


def test_quantize_seeded_by_the_probe_runs_no_pass_and_gets_the_same_scales() -> None:
    result, loop, passes, data = _counted_probe(_cfg())
    specs = {"attn1": QuantSpec(Precision.A8, k_mean=True), "attn2": "a8", "inp": "w8a8"}
    seeded, calibrated = _model(), _model()
    before = len(passes)
    quantize(seeded, specs, loop, statistics=result.statistics)
    assert len(passes) == before  # no calibration pass
    quantize(calibrated, specs, loop)
    assert len(passes) == before + 1
    for name in ("attn1", "attn2"):
        assert torch.equal(
            seeded.get_submodule(name).attn_scales, calibrated.get_submodule(name).attn_scales
        )
    x = data[0]
    assert torch.equal(seeded(x), calibrated(x))


def test_the_summary_counts_the_attention_share_and_the_report_shows_it() -> None:
    from opsnn_quant.policy.search import build_policy
    from opsnn_quant.policy.summary import policy_summary, report_rows

    report, _ = _probe(_model(), _cfg())
    policy = build_policy(report, target=get_target("cpu-reference"))
    (row,) = report_rows(policy, report)
    assert row.attention_int8_share == 1.0  # both attentions chosen a8 (no budget)
    figures = policy_summary(policy, [row])["modalities"]["denoiser"]
    assert figures["attention_int8_share"] == 1.0
    assert figures["int8_share_of_all_macs"] == pytest.approx(1.0)
    # keep one attention float: its SDPA MACs leave the share (the two have equal MACs)
    float_one = policy.model_copy(
        update={"rules": [Rule(match="attn2", precision=Precision.FP16), *policy.rules]}
    )
    (row,) = report_rows(float_one, report)
    assert row.attention_int8_share == 0.5
    # a target without int8 attention: no attention share at all
    mindie, _ = _probe(_model(), get_target("ascend910b-mindie-sd").probe_config(fp16=False))
    plain = build_policy(mindie, target=get_target("ascend910b-mindie-sd"))
    (row,) = report_rows(plain, mindie)
    assert row.attention_int8_share is None
    assert "attention_int8_share" not in policy_summary(plain, [row])["modalities"]["denoiser"]
    # a baseline strategy's policy (no figures): the acceptance report still shows its coverage
    from opsnn_quant.policy.baselines import naive_policy

    naive = naive_policy(report, get_target("cpu-reference"), "all-w8a8-dynamic-a8")
    assert not naive.figures
    (row,) = report_rows(naive, report)
    shown = policy_summary(naive, [row])["modalities"]["denoiser"]
    assert shown["chosen"] == "int8" and shown["attention_int8_share"] == 1.0
    assert shown["int8_share_of_all_macs"] == pytest.approx(1.0)


def test_the_shares_say_they_count_attention_where_it_was_measured() -> None:
    from opsnn_quant.policy.front import Candidate
    from opsnn_quant.policy.search import build_policy
    from opsnn_quant.policy.summary import deployed_note, measured_kinds

    report, _ = _probe(_model(), _cfg())
    assert measured_kinds(report) == "Linear/Conv2d/SDPA"
    policy = build_policy(report, target=get_target("cpu-reference"))
    cand = Candidate.of("no floor", policy, report)
    assert cand.kinds == "Linear/Conv2d/SDPA" and cand.share == 1.0
    assert deployed_note("quant", {"overall": 1.0, "denoiser": 1.0}, cand.kinds) == (
        "deployed by quant: 100.0% of the Linear/Conv2d/SDPA MACs in int8 (denoiser 100%)"
    )
    mindie, _ = _probe(_model(), get_target("ascend910b-mindie-sd").probe_config(fp16=False))
    assert measured_kinds(mindie) == "Linear/Conv2d"


def _stepped_loop(data: list[torch.Tensor]):
    """A sampling loop of six steps: the inputs 8x larger from step 3 on."""
    from opsnn_quant.core.timesteps import at_step

    def loop(m: nn.Module) -> None:
        for x in data:
            for t in range(6):
                with at_step(t):
                    m(x * (8.0 if t >= 3 else 1.0))

    return loop


def test_per_step_scales_follow_the_steps_and_seed_quantize_exactly() -> None:
    from opsnn_quant.probe.api import run_probe

    data = _data()
    loop = _stepped_loop(data)
    adapter = GenericAdapter(_model(), {"": "denoiser"}, loop)
    cfg = get_target("cpu-reference").probe_config(
        fp16=False, schemes=("w8a8", "a8", "a8_kmean", "a8_step")
    )
    result = run_probe(adapter, adapter.forward_loop(), cfg)
    entry = result.report.module("attn1")
    assert set(entry.w8a8) == {"a8", "a8_kmean", "a8_step"}
    # the two ranges (x1 and x8, the query/key/value with them up to the biases) as groups
    assert entry.w8a8["a8_step"].timestep_bounds == [0, 3]
    assert entry.w8a8["a8"].timestep_bounds is None
    # steps 0-2 no longer share the scales of an 8x larger range: their candidate outputs have
    # less noise (the SQNR over all calls moves little: the x8 steps hold 64x the energy)
    watch = result.statistics["attn1"]
    early, late = watch.scales("a8_step", 1), watch.scales("a8_step", 4)
    assert torch.equal(late, watch.scales("a8", 1))
    assert bool((early < late / 4).all())
    # in the group holding the maxima the per-step candidate is the per-tensor one: computed once
    import opsnn_quant.probe.attention as probe_attention
    from opsnn_quant.quant.attention import read_call

    ran = []

    def counted(call, scales, k_mean):
        ran.append(scales)
        return real(call, scales, k_mean)

    real = probe_attention.int8_sdpa
    call = read_call(tuple(torch.randn(2, 2, 48, 32) for _ in range(3)), {})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(probe_attention, "int8_sdpa", counted)
        late_out = watch.candidates(call, 4)
        assert len(ran) == 2 and late_out["a8_step"] is late_out["a8"]
        early_out = watch.candidates(call, 1)
        assert len(ran) == 5 and not torch.equal(early_out["a8_step"], early_out["a8"])
    assert entry.w8a8["a8_step"].sqnr_db > entry.w8a8["a8"].sqnr_db
    spec = QuantSpec(Precision.A8, timestep_bounds=(0, 3))
    seeded, calibrated = _model(), _model()
    passes = []

    def counted(m: nn.Module) -> None:
        passes.append(1)
        loop(m)

    quantize(seeded, {"attn1": spec}, counted, statistics=result.statistics)
    assert passes == []  # seeded per group of steps: no calibration pass
    quantize(calibrated, {"attn1": spec}, counted)
    assert passes == [1]
    s = seeded.get_submodule("attn1").attn_scales
    assert s.shape == (2, 3) and torch.equal(s, calibrated.get_submodule("attn1").attn_scales)
    assert bool((s[1] > 4 * s[0]).all())  # the later group's ranges are the larger ones


def test_calls_outside_a_sampling_loop_offer_no_per_step_scheme() -> None:
    cfg = get_target("cpu-reference").probe_config(fp16=False, schemes=("a8", "a8_step"))
    report, _ = _probe(_model(), cfg)
    assert set(report.module("attn1").w8a8) == {"a8"}


def test_per_head_scales_are_measured_and_seed_quantize_exactly() -> None:
    cfg = get_target("cpu-reference").probe_config(fp16=False, schemes=("a8", "a8_head"))
    result, loop, passes, data = _counted_probe(cfg)
    entry = result.report.module("attn2")
    assert set(entry.w8a8) == {"a8", "a8_head"}
    assert entry.e2e is not None and set(entry.e2e.schemes) == {"a8", "a8_head"}
    # per head, no scale is coarser than the per-tensor one: the output no noisier
    assert entry.w8a8["a8_head"].sqnr_db >= entry.w8a8["a8"].sqnr_db - 0.1
    spec = QuantSpec(Precision.A8, per_head=True)
    seeded, calibrated = _model(), _model()
    before = len(passes)
    quantize(seeded, {"attn2": spec}, loop, statistics=result.statistics)
    assert len(passes) == before
    quantize(calibrated, {"attn2": spec}, loop)
    s = seeded.get_submodule("attn2").attn_scales
    assert s.shape == (1, 3, 2)
    assert torch.equal(s, calibrated.get_submodule("attn2").attn_scales)
    assert torch.equal(seeded(data[0]), calibrated(data[0]))
