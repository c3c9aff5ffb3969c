"""Issue 44 §1-2: a paired bootstrap interval on every quality figure of the acceptance report,
and verdicts on the interval (PASS / FAIL / INCONCLUSIVE, exit 0 / 3 / 4)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.asr import asr_quality
from opsnn_quant.evaluation.clip_score import ClipScoreResult
from opsnn_quant.evaluation.image_similarity import PairSimilarity
from opsnn_quant.evaluation.intervals import (
    NO_INTERVAL_NOTE,
    Interval,
    judge,
    samples_to_decide,
)
from opsnn_quant.evaluation.registry import metrics
from opsnn_quant.evaluation.report import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    AcceptanceReport,
    Criterion,
    overall_verdict,
    verdict_exit_code,
)
from opsnn_quant.evaluation.runner import build_report, verdict
from opsnn_quant.evaluation.suite import parse_suite
from tests.evaluation.test_runner import asr_suite, t2i_suite

# Ten words, none of them numbers (the English normaliser would turn "one two" into digits).
TEN = "the quick brown fox jumps over a lazy sleeping dog"


def _refs(n: int) -> list[str]:
    return [TEN] * n


# --- the intervals themselves, computed by hand ------------------------------------------------


def asr_intervals(refs, base, cand, level=0.95):
    """Every asr metric's interval (through the metric table) of the transcripts."""
    intervals = asr_quality(refs, base, cand, confidence=level).intervals
    assert intervals is not None
    return intervals


def image_intervals(psnr_db, ssim, prompts, *, clip_baseline=None, clip_candidate=None):
    """Every t2i metric's interval (through the metric table) of image pairs with these
    PSNR/SSIM values (seed-major) and, when given, CLIP scores."""
    from opsnn_quant.evaluation.t2i import ImageComparison

    values = zip(psnr_db, ssim, strict=True)
    pairs = [PairSimilarity(i, p, s, 0.0, 0) for i, (p, s) in enumerate(values)]
    clip = None
    if clip_baseline is not None:
        clip = (ClipScoreResult(float(np.mean(clip_baseline)), list(clip_baseline)),
                ClipScoreResult(float(np.mean(clip_candidate)), list(clip_candidate)))  # fmt: skip
    n = len(pairs)
    compared = ImageComparison([None] * n, [None] * n, prompts, pairs, clip=clip)
    got = {m.key: m.interval_at(compared, 0.95) for m in metrics("t2i")}
    return {k: v for k, v in got.items() if v is not None}


def test_identical_outputs_give_a_zero_interval():
    refs = _refs(8)
    base = [TEN.replace("fox", "cat")] * 8  # the baseline's own errors: the same in both
    got = asr_intervals(refs, base, base)
    for key in ("wer_delta_points", "cer_delta_points", "agreement_wer_points"):
        assert (got[key].low, got[key].high) == (0.0, 0.0), key
        assert got[key].n == 8 and got[key].level == 0.95


def test_one_more_error_in_every_ten_word_utterance_is_exactly_ten_points():
    refs = _refs(6)
    cand = [TEN.replace("fox", "cat")] * 6  # one substitution of ten words, every utterance
    got = asr_intervals(refs, refs, cand)
    wer = got["wer_delta_points"]
    assert (wer.low, wer.high) == (pytest.approx(10.0), pytest.approx(10.0))
    agree = got["agreement_wer_points"]  # against the baseline's words: also one in ten
    assert (agree.low, agree.high) == (pytest.approx(10.0), pytest.approx(10.0))
    assert got["cer_delta_points"].low == got["cer_delta_points"].high > 0


def test_two_utterances_resample_to_zero_ten_or_twenty_points():
    # Utterance A: no extra error; B: two of its ten words. A resample is AA (0 points), AB or
    # BA (10) or BB (20) with chances 1/4, 1/2, 1/4: the 95% interval's ends are 0 and 20.
    refs = _refs(2)
    cand = [TEN, TEN.replace("fox", "cat").replace("dog", "cow")]
    wer = asr_intervals(refs, refs, cand)["wer_delta_points"]
    assert (wer.low, wer.high) == (0.0, pytest.approx(20.0))
    narrow = asr_intervals(refs, refs, cand, level=0.4)["wer_delta_points"]
    assert (narrow.low, narrow.high) == (pytest.approx(10.0), pytest.approx(10.0))


def test_intervals_are_seeded():
    refs = [TEN] * 20
    rng = np.random.default_rng(3)
    words = TEN.split()
    cand = [" ".join(w if rng.random() > 0.1 else "x" for w in words) for _ in refs]
    assert asr_intervals(refs, refs, cand) == asr_intervals(refs, refs, cand)


def test_image_intervals_by_prompt():
    same = image_intervals([30.0] * 4, [0.9] * 4, 4, clip_baseline=[20.0] * 4,
                           clip_candidate=[19.5] * 4)  # fmt: skip
    assert (same["psnr_median_db"].low, same["psnr_median_db"].high) == (30.0, 30.0)
    assert (same["ssim_mean"].low, same["ssim_mean"].high) == (pytest.approx(0.9),) * 2
    assert (same["clip_score_delta"].low, same["clip_score_delta"].high) == (-0.5, -0.5)
    identical = image_intervals([math.inf] * 3, [1.0] * 3, 3)["psnr_median_db"]
    assert (identical.low, identical.high) == (math.inf, math.inf)  # no NaN from inf - inf
    # Two prompts, two seeds, in the seed-major order of the evaluation: prompt 0's images are
    # 10 dB, prompt 1's 30 dB. Drawn by prompt, a resample's median is 10, 20 or 30; had the
    # images been drawn as neighbours (10, 30) every median would be 20.
    by_prompt = image_intervals([10.0, 30.0, 10.0, 30.0], [0.5] * 4, 2)["psnr_median_db"]
    assert (by_prompt.low, by_prompt.high, by_prompt.n) == (10.0, 30.0, 2)
    assert image_intervals([1.0, 2.0, 3.0], [0.5] * 3, 2) == {}  # not whole prompts: none


# --- the verdict on the interval ---------------------------------------------------------------


def test_judge_on_the_interval():
    iv = Interval(low=-0.5, high=1.5, level=0.95, n=64)
    assert judge(iv, 2.0, "<=") == ("PASS", None)
    assert judge(iv, -1.0, "<=") == ("FAIL", None)
    # middle 0.5, half-width 1.0, 0.5 from the bound: 64 x (1.0 / 0.5)^2 = 256 samples
    assert judge(iv, 1.0, "<=") == ("INCONCLUSIVE", 256)
    assert judge(iv, -0.5, ">=") == ("PASS", None) and judge(iv, 2.0, ">=") == ("FAIL", None)
    assert judge(iv, 0.0, ">=") == ("INCONCLUSIVE", 256)
    assert samples_to_decide(iv, 0.5) is None  # centred on the threshold: nothing decides it
    # middle 0.55, half-width 0.55, 0.45 from the bound: 10 x (0.55 / 0.45)^2 = 14.9 -> 15
    assert samples_to_decide(Interval(low=0.0, high=1.1, level=0.95, n=10), 1.0) == 15
    # the bound at the interval's end: more than the n it has, however slightly
    assert judge(Interval(low=1.0, high=2.0, level=0.95, n=10), 1.0, "<=") == ("INCONCLUSIVE", 11)


def test_overall_verdict_fail_then_inconclusive_then_pass():
    def row(status: str) -> Criterion:
        return Criterion(key="k", label="k", measured_key="k", value=0.0, threshold=0.0,
                         comparator="<=", status=status)  # type: ignore[arg-type]  # fmt: skip

    assert overall_verdict([row("PASS"), row("INCONCLUSIVE"), row("FAIL")]) == "FAIL"
    assert overall_verdict([row("PASS"), row("INCONCLUSIVE"), row("NOT JUDGED")]) == (
        "INCONCLUSIVE"
    )
    assert overall_verdict([row("PASS"), row("NOT JUDGED")]) == "PASS"
    assert overall_verdict([row("NOT JUDGED")]) == "FAIL"  # nothing judged: not let through
    assert [verdict_exit_code(v) for v in ("PASS", "FAIL", "INCONCLUSIVE")] == [
        EXIT_PASS, EXIT_FAIL, EXIT_INCONCLUSIVE,
    ] == [0, 3, 4]  # fmt: skip


def test_verdict_with_and_without_intervals():
    suite = asr_suite(wer_delta_max_points=1.0, cer_delta_max_points=0.5,
                      agreement_wer_max_points=5.0)  # fmt: skip
    measured = {"wer_delta_points": 0.45, "cer_delta_points": 0.2, "agreement_wer_points": 2.0}
    intervals = {
        "wer_delta_points": Interval(low=-0.4, high=1.3, level=0.95, n=64),  # straddles 1.0
        "cer_delta_points": Interval(low=0.6, high=0.9, level=0.95, n=64),  # wholly beyond
        "agreement_wer_points": Interval(low=1.0, high=3.0, level=0.95, n=64),  # wholly inside
    }
    rows = {c.key: c for c in verdict(suite, measured, intervals=intervals, samples=64)}
    wer = rows["wer_delta_max_points"]
    assert (wer.status, wer.ci_low, wer.ci_high, wer.ci_level, wer.n) == (
        "INCONCLUSIVE", -0.4, 1.3, 0.95, 64,
    )  # fmt: skip
    # middle 0.45, half-width 0.85, 0.55 from the bound: 64 x (0.85/0.55)^2 = 152.9 -> 153
    assert wer.samples_to_decide == 153 and "about 153 samples would decide it" in wer.note
    assert rows["cer_delta_max_points"].status == "FAIL"  # the point 0.2 alone would pass
    assert rows["agreement_wer_max_points"].status == "PASS"
    assert overall_verdict(list(rows.values())) == "FAIL"
    # No intervals (as the measured search's SliceScorer calls it): the point estimates decide,
    # PASS or FAIL only, and the rows carry no interval.
    point = {c.key: c for c in verdict(suite, measured)}
    assert {k: c.status for k, c in point.items()} == {
        "wer_delta_max_points": "PASS", "cer_delta_max_points": "PASS",
        "agreement_wer_max_points": "PASS",
    }  # fmt: skip
    assert all(c.ci_low is None and c.samples_to_decide is None for c in point.values())


def test_a_set_statistic_keeps_the_point_rule_and_says_so():
    suite = t2i_suite(fid_vs_baseline_max=10.0, psnr_min=30.0, latency_p99_ratio_max=1.0)
    measured = {"fid_vs_baseline": 12.0, "psnr_median_db": 35.0, "latency_p99_ratio": 0.5}
    intervals = {"psnr_median_db": Interval(low=31.0, high=39.0, level=0.9, n=16)}
    rows = {c.key: c for c in verdict(suite, measured, intervals=intervals, samples=16)}
    fd = rows["fid_vs_baseline_max"]
    assert (fd.status, fd.ci_low, fd.n, fd.note) == ("FAIL", None, 16, NO_INTERVAL_NOTE)
    psnr = rows["psnr_min"]
    assert (psnr.status, psnr.ci_low, psnr.ci_level, psnr.n) == ("PASS", 31.0, 0.9, 16)
    lat = rows["latency_p99_ratio_max"]  # a speed ratio: no interval, no n, no such note
    assert lat.ci_low is None and lat.n is None and NO_INTERVAL_NOTE not in lat.note


# --- the suite, the report ---------------------------------------------------------------------


def test_suite_confidence():
    assert asr_suite().metrics.confidence == 0.95
    base = {"name": "s", "task": "asr", "data": {"dataset": "speech"}}
    ok = parse_suite({**base, "metrics": {"fid_features": None, "confidence": 0.9}})
    assert ok.metrics.confidence == 0.9
    for bad in (0.3, 1.0, "high"):
        with pytest.raises(ConfigError, match=r"metrics\.confidence"):
            parse_suite({**base, "metrics": {"fid_features": None, "confidence": bad}})


def test_report_json_carries_each_interval(tmp_path):
    # 20 ten-word utterances; the candidate makes one extra error in 3 of them: +1.5 points,
    # within a 2-point bound, but 20 utterances cannot tell it from 2.
    suite = asr_suite(wer_delta_max_points=2.0, agreement_wer_max_points=50.0)
    refs = _refs(20)
    cand = [TEN.replace("fox", "cat") if i in (2, 9, 15) else TEN for i in range(20)]
    q = asr_quality(refs, refs, cand, confidence=suite.metrics.confidence)
    report = build_report(suite, q, created="")
    rows = {c.key: c for c in report.criteria}
    wer = rows["wer_delta_max_points"]
    assert wer.value == pytest.approx(1.5) and wer.status == "INCONCLUSIVE"
    assert wer.ci_low is not None and wer.ci_high is not None
    assert wer.ci_low <= 1.5 <= wer.ci_high and wer.ci_low < 2.0 < wer.ci_high
    assert (wer.ci_level, wer.n) == (0.95, 20) and wer.samples_to_decide is not None
    assert wer.samples_to_decide > 20
    assert rows["agreement_wer_max_points"].status == "PASS"
    assert report.verdict == "INCONCLUSIVE" and report.exit_code == EXIT_INCONCLUSIVE == 4
    out = report.save(tmp_path / "report")
    data = json.loads((out / "report.json").read_text())
    assert data["schema_version"] == 3 and data["verdict"] == "INCONCLUSIVE"
    row = {c["key"]: c for c in data["criteria"]}["wer_delta_max_points"]
    assert {"ci_low", "ci_high", "ci_level", "n", "samples_to_decide"} <= set(row)
    assert AcceptanceReport.load(out / "report.json") == report
    md = (out / "report.md").read_text()
    assert "# Acceptance report: synthetic-asr — **INCONCLUSIVE**" in md
    # (Markdown escapes the brackets)
    assert f"| {wer.label} | cpu-reference | 1.500 | \\[0, 3.000\\] (95%) | 20 |" in md
    assert "| INCONCLUSIVE | the interval straddles the threshold; about " in md
    assert "paired percentile bootstrap" in md
    html = (out / "report.html").read_text()
    assert "<span class='INCONCLUSIVE'>INCONCLUSIVE</span>" in html
    assert "<td class='INCONCLUSIVE'>INCONCLUSIVE</td>" in html and "td.INCONCLUSIVE{" in html
    # Same outputs, same bytes.
    again = build_report(suite, asr_quality(refs, refs, cand, confidence=0.95), created="")
    assert again.to_json() == report.to_json()


def test_a_version_2_report_still_loads(tmp_path):
    suite = asr_suite(wer_delta_max_points=50.0)
    report = build_report(suite, asr_quality(_refs(2), _refs(2), _refs(2)), created="")
    data = json.loads(report.to_json())
    data["schema_version"] = 2
    for row in data["criteria"]:
        for key in ("ci_low", "ci_high", "ci_level", "n", "samples_to_decide"):
            row.pop(key)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = AcceptanceReport.load(path)
    assert old.schema_version == 2 and old.criteria[0].ci_low is None
