"""AcceptanceReport: JSON round trip, verdict/exit code, sensitivity rows."""

from __future__ import annotations

import json
import math

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.report import (
    EXIT_FAIL,
    EXIT_PASS,
    AcceptanceReport,
    Criterion,
    SensitivityRow,
    exit_code,
    fmt,
    overall_verdict,
    sensitivity_rows,
)
from tests.evaluation.sample_report import asr_report, sensitivity, t2i_report


def test_json_round_trip_with_infinite_psnr(tmp_path):
    report, _, _ = t2i_report()
    assert any(math.isinf(p.psnr_db) for p in report.image_pairs)
    out = report.save(tmp_path / "report")  # the directory the CLI writes
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "plots", "report.html", "report.json", "report.md",
    ]  # fmt: skip
    path = out / "report.json"
    text = path.read_text()
    data = json.loads(text)  # strict JSON: inf is the string "Infinity"
    assert data["schema_version"] == 3 and data["verdict"] == report.verdict
    assert "Infinity" in text and "NaN" not in text.replace('"NaN"', "")
    back = AcceptanceReport.load(path)
    assert back == report
    assert back.to_json() == text  # deterministic


def test_verdict_and_exit_codes():
    report, _, _ = t2i_report()
    statuses = {c.key: c.status for c in report.criteria}
    # ssim_min 0.999 fails on the noisy pairs; the latency ratio 1.4 is measured on
    # cpu-reference, not the target's npu, so it is reported and not judged.
    # (the baseline check passes: its images are not flat)
    assert statuses == {"fid_vs_baseline_max": "PASS", "psnr_min": "PASS", "ssim_min": "FAIL",
                        "latency_p99_ratio_max": "NOT JUDGED", "baseline_sane": "PASS"}  # fmt: skip
    assert report.verdict == "FAIL" and exit_code(report) == EXIT_FAIL == 3
    passing = asr_report()
    assert passing.verdict == "PASS" and passing.exit_code == EXIT_PASS == 0
    assert passing.transcripts[0].candidate_errors == 2


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        AcceptanceReport.load(tmp_path / "missing.json")
    bad = tmp_path / "r.json"
    data = json.loads(asr_report().to_json())
    for old in (1, 99):  # 1: before criteria named their backend (INFO instead of NOT JUDGED)
        data["schema_version"] = old
        bad.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match="schema_version"):
            AcceptanceReport.load(bad)
    data["schema_version"] = 2
    data["verdict"] = "MAYBE"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="verdict"):
        AcceptanceReport.load(bad)


def test_sensitivity_rows_most_sensitive_first():
    rows = sensitivity_rows(sensitivity())
    assert [r.name for r in rows[:2]] == ["unet.down.5.proj", "unet.down.4.proj"]
    assert rows[0].contribution == pytest.approx(0.06) and rows[0].sqnr_db == 25.0
    assert rows[-1].name == "vae.conv_out" and rows[-1].contribution is None
    assert [r.fp16_overflow for r in rows].count(True) == 1
    assert rows[0].modality == "denoiser"
    assert len(sensitivity_rows(sensitivity(), top=3)) == 3


def test_overall_verdict_counts_judged_criteria_only():
    def row(status):
        return Criterion(key="k", label="l", measured_key="m", value=1.0, threshold=1.0,
                         comparator="<=", status=status)  # fmt: skip

    assert overall_verdict([row("PASS"), row("NOT JUDGED")]) == "PASS"
    assert overall_verdict([row("PASS"), row("FAIL"), row("NOT JUDGED")]) == "FAIL"
    assert overall_verdict([row("NOT JUDGED")]) == "FAIL"  # a gate that judged nothing
    assert overall_verdict([]) == "PASS"  # a suite without thresholds asks nothing


def test_sensitivity_percentages_hand_computed():
    row = SensitivityRow(name="m", type="Linear", modality="denoiser", contribution=0.0125,
                         sqnr_db=20.0)  # fmt: skip
    assert row.e2e_pct() == pytest.approx(1.25)
    assert row.local_pct() == pytest.approx(1.0)  # 100 * 10^(-20/10)
    bare = SensitivityRow(name="m", type="Linear", modality="denoiser")
    assert bare.e2e_pct() is None and bare.local_pct() is None


def test_fmt():
    assert fmt(None) == "-" and fmt(math.inf) == "inf" and fmt(float("nan")) == "-"
    assert fmt(29_600.4) == "29,600" and fmt(2e-4) == "0.0002" and fmt(1e13) == "1e+13"
    assert fmt(12.34567) == "12.346" and fmt(123456.0) == "123,456" and fmt(0.0) == "0"


def test_a_fail_says_what_to_try_next():
    from tests.evaluation.sample_report import asr_report, t2i_report

    report, _, _ = t2i_report()  # ssim_min fails; the denoiser (31.25 dB) is the int8 modality
    assert report.next_steps("out/x") == [
        "next: ssim_min failed",
        "next: denoiser lost most (31.2 dB at its output); its costliest modules: "
        "unet.down.5.proj, unet.down.4.proj, unet.down.3.proj. Decide again under a higher floor "
        "without probing: opsnn-quant calibrate RECIPE --from-probe out/x --budget "
        "'{limits: {denoiser: {min_sqnr_db: 37}}}' -o out/x-2 (or keep it float: --budget "
        "'{limits: {denoiser: {min_sqnr_db: 99}}}')",
    ]
    passed = asr_report()  # WER within its 50 points: nothing to try
    assert passed.verdict == "PASS" and passed.next_steps() == []
    undecided = passed.model_copy(update={"verdict": "INCONCLUSIVE"})
    assert undecided.next_steps()[0].startswith("next: judge more samples (data.samples")
