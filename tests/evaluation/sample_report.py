"""A fully populated AcceptanceReport (t2i and asr) for the report and render tests."""

from __future__ import annotations

import numpy as np

from opsnn_quant.evaluation.latency import LatencyResult
from opsnn_quant.evaluation.profile import ModuleTimeRow, StabilityResult, StageRow
from opsnn_quant.evaluation.report import AcceptanceReport
from opsnn_quant.evaluation.runner import QualityResult, asr_quality, build_report
from opsnn_quant.evaluation.suite import parse_suite
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import (
    EndToEnd,
    Fp16Stats,
    ModuleSensitivity,
    SchemeError,
    SensitivityReport,
)
from opsnn_quant.types import Modality
from tests.evaluation.conftest import random_images

# As policy_summary() writes it.
POLICY = {
    "model": "zoo:shapes-t2i", "target": "ascend910b-eager", "rules": 3,
    "modalities": {
        "denoiser": {"chosen": "int8", "predicted_sqnr_db": 31.25, "int8_mac_share": 0.5},
        "text_encoder": {"chosen": "fp16", "predicted_sqnr_db": None, "int8_mac_share": 0.0},
    },
}  # fmt: skip


def latency(label_ms: float, backend: str = "cpu-reference") -> LatencyResult:
    samples = [label_ms * (1 + 0.05 * i) for i in range(8)]
    return LatencyResult(
        backend=backend, device="cpu", warmup=1, runs=8, p50_ms=float(np.median(samples)),
        p90_ms=max(samples), p99_ms=max(samples), mean_ms=float(np.mean(samples)), std_ms=1.0,
        min_ms=min(samples), max_ms=max(samples), throughput_per_s=1e3 / label_ms,
        peak_memory_bytes=123 * 1024 * 1024, memory_method="cpu: test", samples_ms=samples,
    )  # fmt: skip


def sensitivity() -> SensitivityReport:
    mods = [
        ModuleSensitivity(
            name=f"unet.down.{i}.proj", type="Linear", modality=Modality.DENOISER, params=1024,
            w8a8={"static": SchemeError(sqnr_db=20.0 + i, cosine=0.99)},
            e2e=EndToEnd(scheme="static", contribution=0.01 * (i + 1), rank=6 - i),
            fp16=Fp16Stats(overflow=(i == 3)),
        )
        for i in range(6)
    ] + [ModuleSensitivity(name="vae.conv_out", type="Conv2d", modality=Modality.IMAGE_DECODER)]  # fmt: skip
    return SensitivityReport(model="test", modules=mods)


def t2i_report() -> tuple[AcceptanceReport, np.ndarray, np.ndarray]:
    """A FAIL report (SSIM threshold) with 4 image pairs, plots and every optional section."""
    from opsnn_quant.evaluation.runner import t2i_quality
    from tests.evaluation.test_fid import PooledFeatures

    suite = parse_suite({
        "name": "sample-t2i", "task": "t2i", "data": {"dataset": "shapes", "samples": 4},
        "metrics": {"fid_features": "inception", "thresholds": {
            "psnr_min": 20.0, "ssim_min": 0.999, "fid_vs_baseline_max": 100.0,
            "latency_p99_ratio_max": 1.0}},
    })  # fmt: skip
    base = random_images(4, seed=41)
    rng = np.random.default_rng(1)
    cand = np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)
    cand[2] = base[2]
    q = t2i_quality(base, cand, ["a red circle", "a blue <square> & co", "two stars", "moon"],
                    seeds=[0, 0, 0, 0], fid_features=PooledFeatures(),
                    confidence=0.95)  # fmt: skip
    stages = {"candidate": [StageRow(stage="denoise_step", module="UNet2DConditionModel", calls=20,
                                     total_ms=400.0, mean_ms=20.0, p50_ms=19.0, p90_ms=25.0,
                                     max_ms=30.0, first_ms=30.0)]}  # fmt: skip
    top = {"candidate": [ModuleTimeRow(name="unet.mid.attn", type="Attention", calls=20,
                                       total_ms=80.0, share=0.2)]}  # fmt: skip
    stab = {"candidate": StabilityResult(
        backend="cpu-reference", k=20, first_decile_median_ms=10.0, last_decile_median_ms=10.5,
        drift_ratio=1.05, memory_start_bytes=0, memory_end_bytes=1024, memory_growth_bytes=1024,
        memory_growth_per_call_bytes=1024 / 19, memory_method="cpu: RSS", samples_ms=[10.0] * 20)}  # fmt: skip
    report = build_report(
        suite, q, baseline_latency=latency(100.0), candidate_latency=latency(140.0),
        baseline_label="fp32", candidate_label="w8a8", stages=stages, top_modules=top,
        stability=stab, policy=POLICY, target=get_target(POLICY["target"]),
        sensitivity=sensitivity(), notes=["sample report"], created="2026-01-01T00:00:00+00:00",
    )  # fmt: skip
    return report, base, cand


def asr_report() -> AcceptanceReport:
    suite = parse_suite({
        "name": "sample-asr", "task": "asr", "data": {"dataset": "speech", "samples": 2},
        "metrics": {"fid_features": None, "thresholds": {"wer_delta_max_points": 50.0}},
    })  # fmt: skip
    q: QualityResult = asr_quality(
        ["the cat sat on the mat", "hello world"],
        ["the cat sat on the mat", "hello word"],
        ["the bat sat on mat", "hello word"],
    )
    return build_report(suite, q, created="")
