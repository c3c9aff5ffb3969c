"""The metric and task tables (issue 59 §2): every built-in metric and task is one entry that
suites, criteria and intervals read; a metric registered from outside the package is bounded
by a suite and judged in the report like a built-in one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opsnn_quant.cli import main
from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.images import as_uint8_nhwc
from opsnn_quant.evaluation.registry import (
    Metric,
    bounded_by,
    budget_problem,
    metric,
    metrics,
    register_metric,
    task,
    tasks,
    thresholds_problem,
    unregister_metric,
)
from opsnn_quant.evaluation.suite import parse_suite
from opsnn_quant.formats.checkpoint import save_quantized
from opsnn_quant.models import load_adapter
from opsnn_quant.quant.api import quantize
from tests.tiny_pipelines import save_tiny_sd


def _pixel_mae(compared) -> list[float]:
    """Each image pair's mean absolute pixel difference (0..255), in the outputs' order."""
    base = as_uint8_nhwc(compared.baseline).astype(np.int16)
    cand = as_uint8_nhwc(compared.candidate).astype(np.int16)
    return [float(np.abs(b - c).mean()) for b, c in zip(base, cand, strict=True)]


PIXEL_MAE = Metric(
    key="pixel_mae", tasks=frozenset({"t2i"}), comparator="<=",
    label="mean absolute pixel difference vs baseline (0..255)", per_sample=_pixel_mae,
)  # fmt: skip


@pytest.fixture
def pixel_mae():
    """The toy metric, registered for the test only (the table is the process's)."""
    register_metric(PIXEL_MAE)
    yield PIXEL_MAE
    unregister_metric(PIXEL_MAE.key)


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    pipe = save_tiny_sd(root / "pipe")
    adapter = load_adapter("diffusers-sd", str(pipe), steps=2, batch_size=2)
    quantize(adapter.model, {"unet.*": "w8a8_dynamic"}, None)  # per-token: no calibration
    save_quantized(adapter.model, root / "out" / "quant", source_model=str(pipe))
    (root / "data").mkdir()
    (root / "data" / "prompts.txt").write_text("a red circle\na blue square\n")
    return root


def _suite(root, bound: float, where):
    path = where / f"suite_{bound}.yaml"
    path.write_text(
        "schema_version: 1\nname: plugin\ntask: t2i\n"
        f"data: {{folder: {root / 'data'}, samples: 2}}\n"
        "generation: {steps: 2, guidance_scale: 4.0, batch_size: 2}\n"
        f"metrics: {{fid_features: null, thresholds: {{pixel_mae_max: {bound}}}}}\n"
    )
    return path


def _evaluate(root, suite, out) -> int:
    return main(["evaluate", "--candidate", str(root / "out"), "--suite", str(suite),
                 "-o", str(out), "--latency", "none", "-q"])  # fmt: skip


def test_a_metric_registered_from_outside_is_bounded_measured_and_judged(
    pixel_mae, candidate, tmp_path
):
    assert pixel_mae.bound == "pixel_mae_max" and bounded_by("pixel_mae_max") is pixel_mae
    assert _evaluate(candidate, _suite(candidate, 255.0, tmp_path), tmp_path / "pass") == 0
    report = json.loads((tmp_path / "pass" / "report.json").read_text())
    row = next(c for c in report["criteria"] if c["key"] == "pixel_mae_max")
    # independent of the toy's own code: the report's image pairs carry each pair's MAE
    maes = [p["mae"] for p in report["image_pairs"]]
    assert len(maes) == 2 and maes[0] != maes[1]
    assert report["measured"]["pixel_mae"] == pytest.approx(np.mean(maes))
    # two prompts, resampled with replacement: the mean of AA, AB, BA or BB; the 95 % interval
    # runs from the smaller prompt's value to the larger's
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(min(maes)), pytest.approx(max(maes)))
    assert (row["n"], row["ci_level"], row["comparator"]) == (2, 0.95, "<=")
    assert row["label"] == pixel_mae.label and row["status"] == "PASS"
    assert report["verdict"] == "PASS"
    assert pixel_mae.label in (tmp_path / "pass" / "report.md").read_text()
    # a bound inside the interval: undecided (exit 4), a bound below it: FAIL (exit 3)
    middle = (min(maes) + max(maes)) / 2
    assert _evaluate(candidate, _suite(candidate, middle, tmp_path), tmp_path / "mid") == 4
    assert _evaluate(candidate, _suite(candidate, min(maes) / 2, tmp_path), tmp_path / "fail") == 3
    failed = json.loads((tmp_path / "fail" / "report.json").read_text())
    assert [c["status"] for c in failed["criteria"] if c["key"] == "pixel_mae_max"] == ["FAIL"]


def test_an_unregistered_or_foreign_metric_is_refused_in_one_line(candidate, tmp_path, capsys):
    assert _evaluate(candidate, _suite(candidate, 1.0, tmp_path), tmp_path / "r") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "metrics.thresholds.pixel_mae_max: no metric is bounded by it" in err[0]
    assert not (tmp_path / "r").exists()
    base = {"name": "x", "data": {"dataset": "speech", "samples": 4},
            "metrics": {"fid_features": None}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"thresholds \['psnr_min'\] do not apply to task 'asr'"):
        parse_suite({**base, "task": "asr", "metrics": {"thresholds": {"psnr_min": 20}}}, "s")


def test_every_bound_is_one_metric_of_the_table():
    bounds = [m.bound for m in metrics()]
    assert len(set(bounds)) == len(bounds) == len(metrics())
    assert [m.bound for m in metrics() if m.speed] == bounds[-2:]  # the criteria's order
    for m in metrics():
        assert bounded_by(m.bound) is m and metric(m.key) is m
        assert m.tasks is None or m.tasks <= {t.name for t in tasks()}
    assert {m.key for m in metrics("asr")} >= {"wer_delta_points", "latency_p99_ratio"}
    assert not {m.key for m in metrics("asr")} & {m.key for m in metrics("t2i") if m.tasks}
    with pytest.raises(ConfigError, match="unknown task 'video'; the tasks: "):
        task("video")
    with pytest.raises(ConfigError, match="did you mean 'psnr_median_db'"):
        metric("psnr_median")


def test_a_budget_is_checked_against_the_table():
    assert budget_problem(Thresholds(wer_delta_max_points=0.5)) is None
    assert budget_problem(Thresholds(wer_delta_max_points=0.5), "asr") is None
    assert budget_problem(Thresholds(psnr_min=30.0), "asr") == (
        "budget.metric: thresholds ['psnr_min'] do not apply to task 'asr'"
    )
    assert budget_problem(Thresholds(psnr_min=-1.0)) == (
        "budget.metric.psnr_min: Input should be greater than or equal to 0"
    )
    assert budget_problem(Thresholds(wer_delta_max_pointz=1.0)).startswith(
        "budget.metric.wer_delta_max_pointz: no metric is bounded by it; did you mean "
        "'wer_delta_max_points'?"
    )
    assert budget_problem(Thresholds()).startswith("budget.metric: sets no bound (e.g. ")
    assert budget_problem(Thresholds(memory_ratio_max=1.0)) == (
        "budget.metric: memory_ratio_max is a speed bound; a slice measures quality"
    )


def test_a_bound_the_float_model_itself_fails_is_refused():
    # every difference against the float model is 0 for the float model: "WER may rise by at
    # most -1 point" or "CLIP may move by at least +0.5" would fail it and every candidate (a
    # measured search ran 129 s and kept nothing in int8 before this was refused)
    assert budget_problem(Thresholds(wer_delta_max_points=-1.0)) == (
        "budget.metric.wer_delta_max_points: -1 fails the float model itself (wer_delta_points "
        "is candidate - float model: 0 for the float model); a bound of a difference is >= 0"
    )
    assert "a bound of a difference is <= 0" in str(
        budget_problem(Thresholds(clip_score_delta_min=0.5))
    )
    assert "fails the float model itself" in str(
        thresholds_problem(Thresholds(motion_accuracy_delta_min=0.1), "metrics.thresholds")
    )
    # the edges and the usual bounds pass; levels (not differences) keep their own ranges
    for ok in ({"wer_delta_max_points": 0.0}, {"cer_delta_max_points": 2.0},
               {"clip_score_delta_min": 0.0}, {"clip_temp_delta_min": -0.01},
               {"kid_delta_max": 0.02}, {"psnr_min": 30.0}):  # fmt: skip
        assert thresholds_problem(Thresholds(**ok), "metrics.thresholds") is None, ok
