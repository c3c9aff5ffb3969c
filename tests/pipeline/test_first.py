"""Decide first in ``calibrate`` (opsnn_quant/pipeline/first.py): a budget of floors is judged
on the naive baselines measured on held-out data before any estimator runs; the estimators run
only for a modality no baseline decides; ``--search full`` runs them anyway."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from opsnn_quant.cli import main
from opsnn_quant.pipeline import calibrate
from opsnn_quant.pipeline.calibrate import CalibrateResult, run_calibrate
from opsnn_quant.pipeline.recipe import load_recipe
from opsnn_quant.policy.first import DECIDED_FIRST
from opsnn_quant.types import Modality
from tests.pipeline.conftest import run_files
from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("first")
    save_tiny_sd(root / "pipe")
    (root / "holdout.txt").write_text("a green circle\na small red square\n")
    return root


def _recipe(root: Path, name: str, limits: str) -> Path:
    data = f"{{calibration: {root / 'prompts.txt'}, holdout: {root / 'holdout.txt'}}}"
    return tiny_sd_recipe(root, name, data=data, extra=f"budget: {{limits: {limits}}}\n")


def _run(recipe: Path, out: Path, search: str = "first") -> tuple[list[str], CalibrateResult]:
    said: list[str] = []
    edited = load_recipe(str(recipe)).model_copy(update={"search": search})
    return said, run_calibrate(edited, out, progress=said.append)


def test_baselines_that_meet_every_floor_decide_and_no_estimator_runs(tiny, tmp_path):
    recipe = _recipe(tiny, "met", "{text_encoder: {min_sqnr_db: 5}, denoiser: {min_sqnr_db: 5}}")
    said, result = _run(recipe, tmp_path / "out")
    out = tmp_path / "out"
    assert not any("SmoothQuant" in s or "end-to-end" in s or "pass 2" in s for s in said)
    assert sum("recording float outputs on held-out data" in s for s in said) == 1  # once
    report = json.loads((out / "probe.json").read_text())
    assert report["not_estimated"].startswith("decided first: all-w8a8-minmax with full int8")
    assert all(not m["w8a8"] and m["e2e"] is None for m in report["modules"])
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    (note,) = [n for n in policy["notes"] if n.startswith(DECIDED_FIRST)]
    assert "not run: the probe's estimators" in note
    timings = json.loads((out / "timings.json").read_text())["phases_seconds"]
    assert "decide first" in timings and "probe estimators" not in timings
    description = json.loads((out / "quant" / "description.json").read_text())
    int8 = {m["precision"] for m in description["modules"].values() if "8" in m["precision"]}
    assert int8 == {"w8a8"}  # static min/max everywhere: the first baseline decided
    # what decided: the baseline's figure on a quantized copy, which the measure phase
    # reports for the model quantize wrote (the same quantization on the same calls)
    assert "held-out figures: the decision measured this quantization on the same calls" in said
    assert not any("measuring the quantized model" in s for s in said)
    for modality in ("text_encoder", "denoiser"):
        note = policy["figures"][modality]["note"]
        decided = re.search(r"measured (-?[\d.]+) dB", note).group(1)  # type: ignore[union-attr]
        assert decided == f"{result.measured[Modality(modality)]['sqnr_db']:.1f}", modality


def test_the_measure_phase_would_measure_the_figures_the_decision_measured(
    tiny, tmp_path, monkeypatch
):
    # The reuse above is sound only if measuring the model quantize wrote gives the same
    # numbers as the decision's quantized copy: measured again here (the reuse turned off),
    # the same figures to the bit and the same files.
    recipe = _recipe(tiny, "again", "{text_encoder: {min_sqnr_db: 5}, denoiser: {min_sqnr_db: 5}}")
    _, reused = _run(recipe, tmp_path / "reused")
    monkeypatch.setattr(calibrate, "measured_key", lambda resolved: "measure again")
    said, again = _run(recipe, tmp_path / "again")
    assert "measuring the quantized model on held-out data" in said
    assert again.measured == reused.measured and again.measured
    assert run_files(tmp_path / "again") == run_files(tmp_path / "reused")


def test_a_floor_no_baseline_meets_leaves_its_modality_to_the_estimators(tiny, tmp_path):
    recipe = _recipe(tiny, "open", "{text_encoder: {min_sqnr_db: 5}, denoiser: {min_sqnr_db: 200}}")
    said, _ = _run(recipe, tmp_path / "out")
    assert any("decide first: open after the baselines: denoiser" in s for s in said)
    assert any("end-to-end attribution: denoiser" in s for s in said)
    out = tmp_path / "out"
    report = json.loads((out / "probe.json").read_text())
    assert report.get("not_estimated") is None
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    figures = policy["figures"]
    assert figures["text_encoder"]["note"].startswith("decided first: all-w8a8-minmax")
    assert not figures["denoiser"]["note"].startswith("decided first")  # the estimate's
    (note,) = [n for n in policy["notes"] if n.startswith(DECIDED_FIRST)]
    assert "the estimators ran for denoiser only" in note
    # their choice measured too (the estimate kept the denoiser fp16 under 200 dB: inf)
    checks = [n for n in policy["notes"] if n.startswith("final check")]
    assert checks == [
        "final check 1 passed (measured SQNR): denoiser measured inf dB on 5 held-out root "
        "calls (data.holdout) (>= 200 dB)"
    ]
    assert figures["denoiser"]["chosen"] == "fp16"
    # the estimators ran for the open modality only: the decided one's modules have no
    # estimate (and pass 1 gathered only the baselines' statistics for them)
    estimated = {m["modality"] for m in report["modules"] if m.get("e2e")}
    assert estimated == {"denoiser"}
    # ascend910b-atc runs static W8A8 alone: the one scheme of the decided modalities' modules
    assert report["config"]["decided"] == {"text_encoder": ["w8a8"], "image_decoder": ["w8a8"]}
    decided = [m for m in report["modules"] if m["modality"] == "text_encoder" and m["calls"]]
    assert decided and all(set(m["w8a8"]) <= {"w8a8"} for m in decided)


def test_search_full_runs_the_estimators_and_decides_every_modality_by_them(tiny, tmp_path):
    recipe = _recipe(tiny, "full", "{text_encoder: {min_sqnr_db: 5}, denoiser: {min_sqnr_db: 5}}")
    said, _ = _run(recipe, tmp_path / "out", "full")
    assert not any(s.startswith("decide first") for s in said)
    policy = yaml.safe_load((tmp_path / "out" / "policy.yaml").read_text())
    assert not any(n.startswith(DECIDED_FIRST) for n in policy.get("notes", []))
    assert all(not f["note"].startswith("decided first") for f in policy["figures"].values())


def test_search_flag_is_checked_before_any_work(tiny, tmp_path, capsys):
    recipe = _recipe(tiny, "flag", "{denoiser: {min_sqnr_db: 5}}")
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "o"), "--search", "most"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == ["error: --search must be one of first, full, got 'most'"]
    assert not (tmp_path / "o").exists()


def test_the_summary_says_what_decided_and_what_did_not_run(tiny, tmp_path, capsys):
    recipe = _recipe(tiny, "said", "{text_encoder: {min_sqnr_db: 5}, denoiser: {min_sqnr_db: 5}}")
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "o")]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines
    policy = yaml.safe_load((tmp_path / "o" / "policy.yaml").read_text())
    (note,) = [n for n in policy["notes"] if n.startswith(DECIDED_FIRST)]
    assert "all-w8a8-minmax" in note and "not run: the probe's estimators" in note
    assert " ".join(note.split()) in printed  # the same words as policy.yaml's


def test_a_reused_pass_1_report_runs_the_whole_probe_when_a_floor_needs_the_estimators(
    tiny, tmp_path
):
    # a run decided first leaves a report of pass 1 alone; reused by a run whose floor no
    # baseline meets, the estimators are needed: the whole probe runs then, and the files are
    # those of that run without --from-probe
    met = _recipe(tiny, "reuse", "{text_encoder: {min_sqnr_db: 5}, denoiser: {min_sqnr_db: 5}}")
    assert main(["calibrate", str(met), "-o", str(tmp_path / "met"), "--quiet"]) == 0
    again = ["calibrate", str(met), "-o", str(tmp_path / "again"), "--quiet", "--from-probe",
             str(tmp_path / "met")]  # fmt: skip
    assert main(again) == 0
    assert run_files(tmp_path / "again") == run_files(tmp_path / "met")
    tight = _recipe(tiny, "reuse", "{text_encoder: {min_sqnr_db: 5}, denoiser: {min_sqnr_db: 200}}")
    assert main(["calibrate", str(tight), "-o", str(tmp_path / "fresh"), "--quiet"]) == 0
    reused = ["calibrate", str(tight), "-o", str(tmp_path / "reused"), "--quiet", "--from-probe",
              str(tmp_path / "met")]  # fmt: skip
    assert main(reused) == 0
    assert json.loads((tmp_path / "reused" / "probe.json").read_text()).get("not_estimated") is None
    assert run_files(tmp_path / "reused") == run_files(tmp_path / "fresh")


def test_without_a_baseline_among_the_schemes_probed_the_estimators_decide(tiny, tmp_path):
    # probe.schemes without a naive baseline's scheme: nothing to measure first, said so
    text = _recipe(tiny, "mse", "{denoiser: {min_sqnr_db: 5}}").read_text()
    recipe = tmp_path / "mse.yaml"
    recipe.write_text(
        text.replace(
            "probe: {max_root_calls: 2}", "probe: {max_root_calls: 2, schemes: [w8a8_mse]}"
        )
    )
    said, _ = _run(recipe, tmp_path / "out")
    assert any("decide first: no naive baseline" in s for s in said)
    assert not any("held-out root calls" in s for s in said)
    report = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert report.get("not_estimated") is None
    policy = yaml.safe_load((tmp_path / "out" / "policy.yaml").read_text())
    (note,) = [n for n in policy["notes"] if n.startswith(DECIDED_FIRST)]
    assert "nothing to measure first" in note


def test_the_estimates_choice_is_held_to_the_floors_it_is_measured_against():
    from opsnn_quant.pipeline.first import floors_check
    from opsnn_quant.policy.budget import Budget, ModalityLimit

    budget = Budget(limits={Modality.DENOISER: ModalityLimit(min_sqnr_db=52)})
    open_ = [Modality.DENOISER, Modality.IMAGE_DECODER]  # the decoder: no floor, never blamed
    below = {Modality.DENOISER: {"sqnr_db": 50.8}, Modality.IMAGE_DECODER: {"sqnr_db": 1.0}}
    result = floors_check(budget, open_, below, "12 calls")
    assert not result.passed and result.modalities == (Modality.DENOISER,)
    assert "denoiser measured 50.8 dB on 12 calls (>= 52 dB)" in result.detail
    met = {Modality.DENOISER: {"sqnr_db": 52.0}}
    assert floors_check(budget, open_, met, "x").passed  # an unmeasured modality is not blamed
