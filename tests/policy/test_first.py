"""Decide first on floors (opsnn_quant/policy/first.py): which baselines are measured, which
modalities their measurements decide, and the policy written for them (pins, min share,
reasons), on hand-built reports whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from opsnn_quant.policy.budget import Budget, ModalityLimit
from opsnn_quant.policy.first import (
    FirstCandidate,
    Measured,
    decide_modalities,
    first_candidates,
    meets,
)
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import Fp16Stats, ModuleSensitivity, SensitivityReport
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision
from tests.policy._factory import overflow_stats

TE, DEN, DEC = Modality.TEXT_ENCODER, Modality.DENOISER, Modality.IMAGE_DECODER


def _module(name: str, type_: str, modality: str, macs: int, **fp16: object) -> ModuleSensitivity:
    return ModuleSensitivity(
        name=name, type=type_, modality=modality, macs=macs, calls=2,  # type: ignore[arg-type]
        fp16=Fp16Stats(**fp16) if fp16 else None,  # type: ignore[arg-type]
    )  # fmt: skip


def _report(*, attention: bool = False) -> SensitivityReport:
    """Pass 1's report (no estimate): a text encoder of two Linears, one overflowing fp16; a
    denoiser of a conv (300 MACs) and a Linear (100); an image decoder whose Linear is 1 % of
    its MACs (its conv 99 %); a module of 'other'; with ``attention``, the denoiser's SDPA."""
    mods = [
        _module("te.fc1", "Linear", "text_encoder", 100),
        _module("te.fc2", "Linear", "text_encoder", 100, **overflow_stats()),
        _module("unet.conv", "Conv2d", "denoiser", 300),
        _module("unet.proj", "Linear", "denoiser", 100),
        _module("vae.decoder.fc", "Linear", "image_decoder", 1),
        _module("vae.decoder.conv", "Conv2d", "image_decoder", 99),
        _module("vae.encoder.conv", "Conv2d", "other", 50),
    ]
    if attention:
        mods.insert(4, _module("unet.attn", "SDPA", "denoiser", 200))
    return SensitivityReport(model="m", modules=mods)


LIMITS = Budget(
    limits={
        TE: ModalityLimit(min_sqnr_db=30),
        DEN: ModalityLimit(min_sqnr_db=25),
        DEC: ModalityLimit(min_sqnr_db=25),
    }
)


def _measured(cand: FirstCandidate, **sqnr: float) -> Measured:
    return Measured(cand, {Modality(m): {"sqnr_db": v, "cosine": 0.99} for m, v in sqnr.items()})


def _static_then_dynamic(rep: SensitivityReport) -> list[Measured]:
    """cpu-reference's static and dynamic baselines measured: static text 35 >= 30, denoiser
    24 < 25, decoder 40; dynamic 36, denoiser 26 >= 25, 41."""
    static, dynamic = first_candidates(rep, LIMITS, get_target("cpu-reference"))[:2]
    return [
        _measured(static, text_encoder=35, denoiser=24, image_decoder=40),
        _measured(dynamic, text_encoder=36, denoiser=26, image_decoder=41),
    ]


def _specs(report: SensitivityReport, policy: PrecisionPolicy) -> dict[str, object]:
    return dict(policy.resolved(report.inventory(), report.weight_shapes()).specs)


def test_the_baselines_measured_are_the_targets_full_coverage_ones_in_runtime_cost_order():
    eager = first_candidates(_report(), LIMITS, get_target("ascend910b-eager"))
    assert [c.strategy for c in eager] == ["all-w8a8-minmax", "all-w8a8-dynamic"]
    # eager runs no int8 conv: the denoiser's Linear alone is its full coverage (100 of 400
    # MACs = 25 % < min_int8_mac_share 50 %: fp16 whole), the decoder's 1 %: fp16 whole
    specs = _specs(_report(), eager[0].policy)
    assert specs["te.fc1"].precision == Precision.W8A8  # type: ignore[union-attr]
    assert specs["te.fc2"] in (Precision.BF16, Precision.FP32)  # pinned: it overflows fp16
    assert specs["unet.proj"] == Precision.FP16 and specs["vae.decoder.fc"] == Precision.FP16
    assert eager[0].full == {TE, DEN, DEC}  # fp16 by the min share under every policy
    # ATC runs static int8 only (no dynamic baseline), and convs: every modality int8
    atc = first_candidates(_report(), LIMITS, get_target("ascend910b-atc"))
    assert [c.strategy for c in atc] == ["all-w8a8-minmax"]
    specs = _specs(_report(), atc[0].policy)
    assert isinstance(specs["unet.conv"], QuantSpec) and isinstance(
        specs["vae.decoder.conv"], QuantSpec
    )
    assert specs["vae.encoder.conv"] == Precision.FP16  # 'other': never int8
    # a recipe whose probe.schemes leave the static scheme out measures the dynamic one only
    only = first_candidates(_report(), LIMITS, get_target("ascend910b-eager"), ["w8a8_dynamic"])
    assert [c.strategy for c in only] == ["all-w8a8-dynamic"]


def test_a_linear_only_baseline_cannot_decide_a_modality_whose_attention_the_target_runs():
    cands = first_candidates(_report(attention=True), LIMITS, get_target("ascend910b-eager"))
    by = {c.strategy: c for c in cands}
    assert list(by) == [
        "all-w8a8-minmax", "all-w8a8-dynamic", "all-w8a8-minmax-a8", "all-w8a8-dynamic-a8",
    ]  # fmt: skip
    assert DEN not in by["all-w8a8-minmax"].full and DEN in by["all-w8a8-minmax-a8"].full
    measured = [_measured(c, text_encoder=40, denoiser=35, image_decoder=99) for c in cands]
    decision = decide_modalities(_report(attention=True), LIMITS, measured, "test calls")
    assert decision.fixed[TE].strategy == "all-w8a8-minmax"
    assert decision.fixed[DEN].strategy == "all-w8a8-minmax-a8" and decision.fixed[DEN].attention
    # a target without int8 attention: the -a8 baselines are the Linear-only ones, measured once
    mindie = first_candidates(_report(attention=True), LIMITS, get_target("ascend910b-mindie-sd"))
    assert [c.strategy for c in mindie] == ["all-w8a8-minmax", "all-w8a8-dynamic"]


def test_each_modality_takes_the_first_baseline_that_meets_its_floor_else_stays_open():
    rep = _report()
    measured = _static_then_dynamic(rep)
    dynamic = measured[1].candidate
    decision = decide_modalities(rep, LIMITS, measured, "12 held-out root calls")
    assert {m: f.strategy for m, f in decision.fixed.items()} == {
        TE: "all-w8a8-minmax", DEN: "all-w8a8-dynamic", DEC: "all-w8a8-minmax",
    }  # fmt: skip
    assert decision.open == [] and Modality.OTHER not in decision.fixed
    assert decision.fixed[DEN].measured_sqnr_db == 26
    assert (
        "measured 26.0 dB on 12 held-out root calls (floor >= 25 dB)" in decision.fixed[DEN].reason
    )
    # static alone measured: the denoiser is open until the dynamic one is
    first = decide_modalities(rep, LIMITS, measured[:1], "x")
    assert first.open == [DEN] and set(first.fixed) == {TE, DEC}
    # nothing meets 24.9 -> 25: open; the note says what decided what
    short = [measured[0], _measured(dynamic, text_encoder=36, denoiser=24.9, image_decoder=41)]
    decision = decide_modalities(rep, LIMITS, short, "x")
    assert decision.open == [DEN]
    assert "the estimators ran for denoiser only" in decision.note()


def test_without_a_floor_the_most_accurate_baseline_decides_once_every_one_is_measured():
    rep = _report()
    static, dynamic = first_candidates(rep, Budget(), get_target("cpu-reference"))[:2]
    first = [_measured(static, text_encoder=5, denoiser=3, image_decoder=4)]
    # one of two measured: nothing is decided yet (the other may be more accurate)
    pending = decide_modalities(rep, Budget(), first, "x", complete=False)
    assert pending.open == [TE, DEN, DEC] and not pending.fixed
    both = [*first, _measured(dynamic, text_encoder=6, denoiser=2, image_decoder=4)]
    decision = decide_modalities(rep, Budget(), both, "x")
    assert decision.open == []
    assert {m: f.strategy for m, f in decision.fixed.items()} == {
        TE: "all-w8a8-dynamic", DEN: "all-w8a8-minmax", DEC: "all-w8a8-minmax",  # a tie: the first
    }  # fmt: skip
    assert "no floor in the budget: the most accurate (beside all-w8a8-minmax 5.0 dB)" in (
        decision.fixed[TE].reason
    )
    assert "not run: the probe's estimators" in decision.note()


@pytest.mark.parametrize(
    ("limit", "figures", "ok"),
    [
        (ModalityLimit(min_sqnr_db=25), {"sqnr_db": 25.0, "cosine": 0.9}, True),
        (ModalityLimit(min_sqnr_db=25), {"sqnr_db": 24.99, "cosine": 1.0}, False),
        (ModalityLimit(min_sqnr_db=25), {"sqnr_db": float("nan"), "cosine": 1.0}, False),
        (ModalityLimit(min_cosine=0.999), {"sqnr_db": 10.0, "cosine": 0.9991}, True),
        (ModalityLimit(min_sqnr_db=20, min_cosine=0.999), {"sqnr_db": 30.0, "cosine": 0.99}, False),
        (ModalityLimit(), {"sqnr_db": -5.0, "cosine": 0.0}, True),
    ],
)
def test_a_measurement_meets_a_floor_only_when_every_limit_holds(limit, figures, ok):
    assert meets(limit, figures) is ok


def test_the_written_policy_keeps_pins_says_why_and_mixes_baselines_per_modality():
    rep = _report()
    measured = _static_then_dynamic(rep)
    decision = decide_modalities(rep, LIMITS, measured, "x")
    policy = build_policy(rep, LIMITS, get_target("cpu-reference"), fixed=decision.fixed)
    specs = _specs(rep, policy)
    assert specs["te.fc2"] in (Precision.BF16, Precision.FP32)
    assert specs["te.fc1"].precision == Precision.W8A8  # type: ignore[union-attr]
    assert specs["unet.conv"].precision == Precision.W8A8_DYNAMIC  # type: ignore[union-attr]
    assert specs["vae.decoder.conv"].precision == Precision.W8A8  # type: ignore[union-attr]
    reasons = {r.match: r.reason for r in policy.rules}
    assert any("all-w8a8-dynamic" in r and "26.0 dB" in r for r in reasons.values())
    assert policy.figures[DEN].chosen == "int8" and policy.figures[DEN].predicted_sqnr_db is None
    assert policy.figures[DEN].note == decision.fixed[DEN].reason
