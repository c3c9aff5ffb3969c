"""The orchestration steps on synthetic images and texts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.clip_score import ClipScorer
from opsnn_quant.evaluation.fid import ClipImageFeatures, frechet_distance
from opsnn_quant.evaluation.latency import LatencyResult
from opsnn_quant.evaluation.runner import (
    QualityResult,
    asr_quality,
    build_report,
    latency_measured,
    t2i_quality,
    verdict,
)
from opsnn_quant.evaluation.suite import parse_suite
from tests.evaluation.conftest import random_images
from tests.evaluation.test_fid import PooledFeatures


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


def synthetic_images():
    base = random_images(4, seed=31)
    cand = base.copy()
    cand[1] = np.clip(base[1].astype(int) + 12, 0, 255).astype(np.uint8)  # PSNR ~ 26.6 dB
    cand[3] = np.clip(base[3].astype(int) + 3, 0, 255).astype(np.uint8)
    return base, cand


def test_t2i_quality(tiny_clip):
    model, processor = tiny_clip
    base, cand = synthetic_images()
    ref = random_images(5, seed=32)
    prompts = ["a", "b", "c", "d"]
    feats = ClipImageFeatures(model, "tiny-clip", mean=(0.5,) * 3, std=(0.5,) * 3)
    q = t2i_quality(base, cand, prompts, seeds=[0, 0, 0, 0], clip=ClipScorer(model, processor, "tiny"),
                    fid_features=feats, reference_images=ref)  # fmt: skip
    m = {k: v for k, v in q.measured.items() if v is not None}
    assert len(m) == len(q.measured)
    # Worst PSNR first: pair 1 (+12 offset, clipped), then 3, then the identical pairs 0 and 2.
    assert [p.index for p in q.image_pairs] == [1, 3, 0, 2]
    assert q.image_pairs[2].psnr_db == math.inf
    assert m["psnr_min_db"] == q.image_pairs[0].psnr_db
    assert m["psnr_median_db"] == math.inf  # two of four pairs identical
    assert m["clip_score_delta"] == pytest.approx(
        m["clip_score_candidate"] - m["clip_score_baseline"]
    )
    assert m["fid_delta"] == pytest.approx(
        m["fid_candidate_vs_reference"] - m["fid_baseline_vs_reference"]
    )
    assert m["fid_vs_baseline"] > 0
    # FD labels: never called FID.
    assert (
        q.labels["fid_vs_baseline"].startswith("FD ")
        and "tiny-clip (FD, not FID)" in q.labels["fid_vs_baseline"]
    )
    assert not any(r.metric.startswith("FID") for r in q.quality)
    assert any("not comparable with published FID" in n for n in q.notes)
    assert q.image_pairs[0].clip_baseline is not None and q.image_pairs[0].seed == 0


def test_t2i_quality_fid_value_matches_direct_computation():
    base, cand = synthetic_images()
    q = t2i_quality(base, cand, list("abcd"), fid_features=PooledFeatures())
    f = PooledFeatures()
    to = lambda a: f(torch.from_numpy(a).permute(0, 3, 1, 2)).double()  # noqa: E731
    assert q.measured["fid_vs_baseline"] == pytest.approx(frechet_distance(to(base), to(cand)))
    assert "PooledFeatures (FD, not FID)" in q.labels["fid_vs_baseline"]
    with pytest.raises(InputError, match="prompts"):
        t2i_quality(base, cand, ["a"])


def test_asr_quality_points():
    refs = ["the cat sat on the mat", "hello world"]
    base = ["the cat sat on the mat", "hello word"]
    cand = ["the bat sat on mat", "hello word"]
    q = asr_quality(refs, base, cand)
    m = q.measured
    # 8 reference words; baseline 1 error, candidate 3 errors: 12.5% -> 37.5%, +25 points.
    assert m["wer_baseline"] == pytest.approx(12.5) and m["wer_candidate"] == pytest.approx(37.5)
    assert m["wer_delta_points"] == pytest.approx(25.0)
    # Agreement: 2 edits over the baseline's 8 words.
    assert m["agreement_wer_points"] == pytest.approx(25.0)
    assert q.transcripts[0].index == 0 and q.transcripts[0].candidate_errors == 2


def test_verdict_rules():
    suite = t2i_suite(psnr_min=20, ssim_min=0.9, clip_score_delta_min=-1, latency_p99_ratio_max=1.0)
    measured = {"psnr_median_db": 25.0, "ssim_mean": 0.8, "latency_p99_ratio": 2.0}
    rows = {c.key: c for c in verdict(suite, measured, latency_backend="cpu-reference")}
    assert rows["psnr_min"].status == "PASS" and rows["psnr_min"].comparator == ">="
    assert rows["ssim_min"].status == "FAIL"
    assert (
        rows["clip_score_delta_min"].status == "FAIL"
        and rows["clip_score_delta_min"].note == "not measured"
    )
    assert rows["latency_p99_ratio_max"].status == "INFO"  # cpu-reference: not enforced
    on_npu = {c.key: c for c in verdict(suite, measured, latency_backend="npu")}
    assert on_npu["latency_p99_ratio_max"].status == "FAIL"
    edge = {c.key: c for c in verdict(suite, {"psnr_median_db": 20.0, "ssim_mean": 0.9,
                                               "clip_score_delta": float("nan")})}  # fmt: skip
    assert (
        edge["psnr_min"].status == "PASS" and edge["ssim_min"].status == "PASS"
    )  # bounds inclusive
    assert edge["clip_score_delta_min"].status == "FAIL"


def test_latency_measured_ratios():
    r = latency_measured(latency(10.0, 100), latency(5.0, 50))
    assert r == {"latency_p99_ratio": 0.5, "memory_ratio": 0.5}
    assert latency_measured(latency(10.0, None), latency(5.0, 50))["memory_ratio"] is None


def test_build_report_pass_and_fail():
    suite = asr_suite(wer_delta_max_points=1.0, latency_p99_ratio_max=1.0)
    q = QualityResult(measured={"wer_delta_points": 0.5}, notes=["n"])
    ok = build_report(suite, q, baseline_latency=latency(10.0, 100),
                      candidate_latency=latency(12.0, 90), created="")  # fmt: skip
    assert ok.verdict == "PASS" and ok.exit_code == 0  # latency ratio 1.2 is INFO on cpu
    assert ok.backends == {"quality": "cpu-reference", "latency": "cpu-reference"}
    assert ok.measured["latency_p99_ratio"] == pytest.approx(1.2)
    assert [x.label for x in ok.latency] == ["baseline", "candidate"]
    bad = build_report(suite, q, baseline_latency=latency(10.0, 100, "npu"),
                       candidate_latency=latency(12.0, 90, "npu"), created="")  # fmt: skip
    assert bad.verdict == "FAIL" and bad.exit_code == 3
    assert build_report(suite, QualityResult(), created="").verdict == "FAIL"  # WER not measured
