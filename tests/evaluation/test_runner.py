"""Criteria, judged backends and report assembly on hand-made figures."""

from __future__ import annotations

import pytest

from opsnn_quant.evaluation.gate import plan_latency
from opsnn_quant.evaluation.latency import LatencyResult
from opsnn_quant.evaluation.ort_speed import OrtSpeedResult
from opsnn_quant.evaluation.report import NOTHING_JUDGED_NOTE
from opsnn_quant.evaluation.runner import (
    QualityResult,
    build_report,
    latency_measured,
    verdict,
)
from opsnn_quant.evaluation.suite import parse_suite
from opsnn_quant.policy.targets import get_target


def t2i_suite(**thresholds):
    return parse_suite({
        "name": "synthetic-t2i", "task": "t2i",
        "data": {"dataset": "shapes", "samples": 4, "reference": "dataset"},
        "metrics": {"fid_features": "clip", "clip": "tiny", "thresholds": thresholds},
    })  # fmt: skip


def asr_suite(**thresholds):
    return parse_suite({
        "name": "synthetic-asr", "task": "asr", "data": {"dataset": "speech", "samples": 2},
        "metrics": {"fid_features": None, "thresholds": thresholds},
    })  # fmt: skip


def latency(p99: float, peak: int | None, backend: str = "cpu-reference") -> LatencyResult:
    return LatencyResult(
        backend=backend, device="cpu", warmup=0, runs=3, p50_ms=p99, p90_ms=p99, p99_ms=p99,
        mean_ms=p99, std_ms=0.0, min_ms=p99, max_ms=p99, throughput_per_s=1e3 / p99,
        peak_memory_bytes=peak, samples_ms=[p99] * 3,
    )  # fmt: skip


def ort(fp32_p99: float, qdq_p99: float) -> OrtSpeedResult:
    return OrtSpeedResult(
        fp32=latency(fp32_p99, 100, "cpu-onnxruntime"), qdq=latency(qdq_p99, 80, "cpu-onnxruntime"),
        p50_speedup=fp32_p99 / qdq_p99, mean_speedup=fp32_p99 / qdq_p99, fp32_file_bytes=400,
        qdq_file_bytes=100, size_ratio=4.0, threads=2,
    )  # fmt: skip


def test_verdict_rules():
    suite = t2i_suite(psnr_min=20, ssim_min=0.9, clip_score_delta_min=-1, latency_p99_ratio_max=1.0)
    measured = {"psnr_median_db": 25.0, "ssim_mean": 0.8, "latency_p99_ratio": 2.0}

    def rows(backend, name):
        target = get_target(name) if name else None
        return {c.key: c for c in verdict(suite, measured, latency_backend=backend,
                                          quality_backend="cpu-reference", target=target)}  # fmt: skip

    cpu = rows("cpu-onnxruntime", "ascend910b-atc")
    assert cpu["psnr_min"].status == "PASS" and cpu["psnr_min"].comparator == ">="
    assert cpu["psnr_min"].backend == "cpu-reference" and cpu["psnr_min"].note == ""
    assert cpu["ssim_min"].status == "FAIL"
    assert cpu["clip_score_delta_min"].status == "FAIL"
    assert cpu["clip_score_delta_min"].note == "not measured"
    lat = cpu["latency_p99_ratio_max"]
    assert (lat.status, lat.backend, lat.value) == ("NOT JUDGED", "cpu-onnxruntime", 2.0)
    assert lat.note == (
        "not judged on cpu-onnxruntime: the policy targets ascend910b-atc (judged on npu)"
    )
    npu = rows("npu", "ascend910b-atc")["latency_p99_ratio_max"]
    assert (npu.status, npu.backend) == ("FAIL", "npu")
    assert npu.note == "judged on npu: the policy targets ascend910b-atc"
    # A CPU target judges ONNX Runtime; the emulated reference is never a speed figure.
    assert rows("cpu-onnxruntime", "cpu-reference")["latency_p99_ratio_max"].status == "FAIL"
    assert rows("cpu-reference", "cpu-reference")["latency_p99_ratio_max"].status == "NOT JUDGED"
    assert rows("npu", "cpu-reference")["latency_p99_ratio_max"].status == "NOT JUDGED"
    unknown = rows("npu", None)["latency_p99_ratio_max"]
    assert unknown.status == "NOT JUDGED" and "no deployment target is known" in unknown.note
    edge = {c.key: c for c in verdict(suite, {"psnr_median_db": 20.0, "ssim_mean": 0.9,
                                               "clip_score_delta": float("nan")})}  # fmt: skip
    assert edge["psnr_min"].status == "PASS" and edge["ssim_min"].status == "PASS"  # inclusive
    assert edge["clip_score_delta_min"].status == "FAIL"


def test_unmeasured_latency_fails_only_where_it_is_judged():
    suite = asr_suite(latency_p99_ratio_max=1.0)
    on_target = verdict(suite, {}, latency_backend="npu", target=get_target("ascend910b-eager"),
                        unmeasured_why="--latency none")[0]  # fmt: skip
    assert on_target.status == "FAIL" and on_target.value is None
    assert (
        on_target.note
        == "not measured (--latency none); judged on npu: the policy targets ascend910b-eager"
    )
    elsewhere = verdict(
        suite, {}, latency_backend="cpu-onnxruntime", target=get_target("ascend910b-eager")
    )[0]
    assert elsewhere.status == "NOT JUDGED" and elsewhere.note.startswith(
        "not measured; not judged"
    )


def test_latency_measured_ratios():
    r = latency_measured(latency(10.0, 100), latency(5.0, 50))
    assert r == {"latency_p99_ratio": 0.5, "memory_ratio": 0.5}
    assert latency_measured(latency(10.0, None), latency(5.0, 50))["memory_ratio"] is None


def test_demo_on_cpu_passes_on_quality_with_latency_reported_not_judged():
    # The shapes demo on a CPU: the int8 QDQ graph is 30% slower than fp32 on ONNX Runtime, the
    # eager reference 3x slower; the policy targets an Ascend device.
    suite = t2i_suite(psnr_min=20.0, latency_p99_ratio_max=1.0, memory_ratio_max=1.0)
    q = QualityResult(measured={"psnr_median_db": 30.0})
    r = build_report(suite, q, baseline_latency=latency(10.0, 100, "cpu"),
                     candidate_latency=latency(30.0, 50), onnxruntime=ort(10.0, 13.0),
                     policy={"target": "ascend910b-atc"}, target=get_target("ascend910b-atc"),
                     created="")  # fmt: skip
    assert r.verdict == "PASS" and r.target == "ascend910b-atc"
    rows = {c.key: c for c in r.criteria}
    lat = rows["latency_p99_ratio_max"]
    # The criterion reads the ONNX Runtime pair (13 / 10), not the emulated eager one (30 / 10).
    assert lat.value == pytest.approx(1.3) and lat.backend == "cpu-onnxruntime"
    assert lat.status == "NOT JUDGED" and "policy targets ascend910b-atc" in lat.note
    assert rows["memory_ratio_max"].value == pytest.approx(0.8)
    assert rows["psnr_min"].status == "PASS" and rows["psnr_min"].backend == "cpu-reference"
    assert r.measured["latency_p99_ratio_onnxruntime"] == pytest.approx(1.3)
    assert r.measured["latency_p99_ratio_eager"] == pytest.approx(3.0)
    assert r.backends == {"quality": "cpu-reference", "onnxruntime": "cpu-onnxruntime",
                          "latency": "cpu-onnxruntime"}  # fmt: skip
    assert r.latency_judged_on == ["npu"]
    # The same figures for a CPU deployment are judged, and the slow QDQ graph fails.
    cpu = build_report(
        suite, q, onnxruntime=ort(10.0, 13.0), target=get_target("cpu-reference"), created=""
    )
    assert cpu.verdict == "FAIL" and cpu.exit_code == 3
    assert {c.key: c.status for c in cpu.criteria}["latency_p99_ratio_max"] == "FAIL"
    assert cpu.latency_judged_on == ["cpu", "cpu-onnxruntime"]


def test_on_the_target_device_the_eager_npu_figure_is_judged():
    suite = asr_suite(wer_delta_max_points=1.0, latency_p99_ratio_max=1.0)
    q = QualityResult(measured={"wer_delta_points": 0.5})
    r = build_report(suite, q, baseline_latency=latency(10.0, 100, "npu"),
                     candidate_latency=latency(8.0, 90, "npu"), onnxruntime=ort(10.0, 13.0),
                     quality_backend="npu", target=get_target("ascend910b-eager"), created="")  # fmt: skip
    lat = {c.key: c for c in r.criteria}["latency_p99_ratio_max"]
    assert (lat.status, lat.backend, lat.value) == ("PASS", "npu", pytest.approx(0.8))
    assert r.verdict == "PASS" and r.backends["latency"] == "npu"
    slow = build_report(suite, q, baseline_latency=latency(10.0, 100, "npu"),
                        candidate_latency=latency(12.0, 90, "npu"), target=get_target("ascend910b-eager"),
                        created="")  # fmt: skip
    assert slow.verdict == "FAIL"


def test_latency_none_and_nothing_judged():
    suite = t2i_suite(psnr_min=20.0, latency_p99_ratio_max=1.0)
    plan = plan_latency(suite, "none", target=get_target("ascend910b-atc"), baseline_backend="cpu",
                        candidate_backend="cpu-reference", onnx_possible=True)  # fmt: skip
    q = QualityResult(measured={"psnr_median_db": 30.0})
    r = build_report(suite, q, target=get_target("ascend910b-atc"), latency_plan=plan, created="")
    lat = {c.key: c for c in r.criteria}["latency_p99_ratio_max"]
    assert lat.status == "NOT JUDGED" and lat.backend == "cpu-reference" and lat.value is None
    assert lat.note.startswith("not measured (--latency none); not judged on cpu-reference")
    assert (
        r.verdict == "PASS" and r.latency_mode == "none" and r.latency_skipped == list(plan.skipped)
    )
    only_latency = t2i_suite(latency_p99_ratio_max=1.0)
    nothing = build_report(only_latency, q, onnxruntime=ort(10.0, 5.0), target=get_target("ascend910b-atc"),
                           created="")  # fmt: skip
    assert [c.status for c in nothing.criteria] == ["NOT JUDGED"]
    assert nothing.verdict == "FAIL" and NOTHING_JUDGED_NOTE in nothing.notes
    assert build_report(t2i_suite(), q, created="").verdict == "PASS"  # no thresholds asked


def test_build_report_unmeasured_quality_fails():
    suite = asr_suite(wer_delta_max_points=1.0)
    assert build_report(suite, QualityResult(), created="").verdict == "FAIL"


def test_a_broken_baseline_fails_the_verdict_unless_allowed():
    # A random Whisper transcribes nothing: its empty transcripts "agree" with any candidate's.
    from opsnn_quant.evaluation.asr import asr_quality

    refs = ["one two", "three four", "five", "six"]
    broken = asr_quality(refs, ["", "", "", "five"], ["", "", "", "five"])
    assert broken.measured["baseline_broken_share"] == 0.75  # 3 of 4 empty
    suite = asr_suite(wer_delta_max_points=1.0)
    report = build_report(suite, broken, created="")
    sane = report.criteria[-1]
    assert (sane.key, sane.status, sane.value, sane.threshold) == (
        "baseline_sane",
        "FAIL",
        0.75,
        0.5,
    )
    assert report.verdict == "FAIL" and any("looks broken" in n for n in report.notes)
    allowed = build_report(suite, broken, created="", allow_broken_baseline=True)
    assert allowed.verdict == "PASS" and allowed.criteria[-1].status == "NOT JUDGED"
    fine = asr_quality(refs, refs, refs)
    assert build_report(suite, fine, created="").criteria[-1].status == "PASS"


def test_flat_baseline_images_count_as_broken():
    import numpy as np

    from opsnn_quant.evaluation.t2i import t2i_quality

    rng = np.random.default_rng(0)
    textured = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(3)]
    flat = [np.full((8, 8, 3), 7, np.uint8), np.full((8, 8, 3), 200, np.uint8)]
    q = t2i_quality(flat + textured[:1], flat + textured[:1], ["a", "b", "c"])
    assert q.measured["baseline_broken_share"] == pytest.approx(2 / 3)
    q = t2i_quality(textured, textured, ["a", "b", "c"])
    assert q.measured["baseline_broken_share"] == 0.0


def _by_key(report):
    return {c.key: c for c in report.criteria}


def test_a_looping_baseline_above_100_percent_wer_is_broken_unless_allowed():
    # issue 58: a random Whisper says "bang" eight times for every utterance: WER above 100 %,
    # no transcript empty, and every candidate that does the same "matches" it
    from opsnn_quant.evaluation.asr import asr_quality

    refs = ["the truck is parked", "i like juice", "we bought apples", "call me"]
    bang = ["Bang bang bang bang bang bang bang bang."] * 4
    q = asr_quality(refs, bang, bang)
    # 8 words against 4, 3, 3 and 2 reference words: each reference word substituted, the rest
    # inserted, 8 errors per utterance: 32 errors for 12 reference words
    assert q.measured["baseline_error_points"] == pytest.approx(100 * 32 / 12)
    assert q.measured["baseline_broken_share"] == 1.0
    suite = asr_suite(wer_delta_max_points=1.0)
    report = build_report(suite, q, created="")
    rows = _by_key(report)
    assert rows["wer_delta_max_points"].status == "PASS"  # the candidate matches it exactly
    assert rows["baseline_error_rate"].status == "FAIL"
    assert rows["baseline_error_rate"].label == "baseline WER (%)"
    assert rows["baseline_sane"].status == "FAIL" and report.verdict == "FAIL"
    assert "--allow-broken-baseline" in rows["baseline_sane"].note
    allowed = build_report(suite, q, created="", allow_broken_baseline=True)
    assert {k: c.status for k, c in _by_key(allowed).items()} == {
        "wer_delta_max_points": "PASS", "baseline_error_rate": "NOT JUDGED",
        "baseline_sane": "NOT JUDGED",
    }  # fmt: skip
    assert allowed.verdict == "PASS"
    # a sound baseline passes both; silent inputs count as saying nothing
    fine = asr_quality(refs, refs, refs)
    assert fine.measured["baseline_error_points"] == 0.0
    assert {c.status for c in build_report(suite, fine, created="").criteria} == {"PASS"}
    quiet = asr_quality(refs, refs, refs, silent=[True, True, True, False])
    assert quiet.measured["baseline_broken_share"] == 0.75
    assert _by_key(build_report(suite, quiet, created=""))["baseline_sane"].status == "FAIL"


def test_outputs_computed_from_nan_fail_a_candidate_always_and_a_baseline_unless_allowed():
    suite = asr_suite(wer_delta_max_points=1.0)
    base = {"wer_delta_points": 0.0}
    for allowed in (False, True):
        nan_candidate = QualityResult(measured=base | {"baseline_nan_share": 0.0,
                                                       "candidate_nan_share": 0.25})  # fmt: skip
        report = build_report(suite, nan_candidate, created="", allow_broken_baseline=allowed)
        row = _by_key(report)["candidate_finite"]
        assert (row.status, row.value, row.threshold) == ("FAIL", 0.25, 0.0)
        assert report.verdict == "FAIL" and "computed from NaN" in row.note
        assert any(n.startswith("candidate check: 25% of the candidate") for n in report.notes)
    nan_baseline = QualityResult(measured=base | {"baseline_nan_share": 0.5,
                                                  "candidate_nan_share": 0.0})  # fmt: skip
    assert (
        _by_key(build_report(suite, nan_baseline, created=""))["baseline_finite"].status == "FAIL"
    )
    allowed = build_report(suite, nan_baseline, created="", allow_broken_baseline=True)
    assert _by_key(allowed)["baseline_finite"].status == "NOT JUDGED" and allowed.verdict == "PASS"
    # a NaN figure (unmeasurable) fails rather than passing every comparison
    odd = QualityResult(measured=base | {"candidate_nan_share": float("nan")})
    assert _by_key(build_report(suite, odd, created=""))["candidate_finite"].status == "FAIL"
