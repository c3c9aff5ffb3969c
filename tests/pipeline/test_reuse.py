"""Reusing a probe: ``calibrate --from-probe`` (same model, data and settings, else refused) and
``policy build`` (another budget or target, no model run)."""

from __future__ import annotations

import json

import pytest
import yaml

from opsnn_quant.cli import main
from opsnn_quant.policy.budget import Budget, ModalityLimit
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.sources import resolve_source
from tests.pipeline.conftest import run_files


@pytest.fixture(scope="module")
def done(tiny_sd_calibrated):
    return tiny_sd_calibrated


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


def test_the_probe_records_its_models_and_datas_fingerprints(done):
    from opsnn_quant.core.fingerprint import data_fingerprint, model_fingerprint

    root, _, out = done
    inputs = json.loads((out / "probe.json").read_text())["inputs"]
    assert inputs["model"] == model_fingerprint(resolve_source(str(root / "pipe")))
    assert inputs["data"] == data_fingerprint(
        [{"prompt": "a red circle"}, {"prompt": "a blue square"}]
    )


@pytest.mark.slow
def test_from_probe_skips_the_probe_and_writes_the_same_files(done, tmp_path):
    _, recipe, out = done
    again = tmp_path / "again"
    assert (
        main(["calibrate", str(recipe), "-o", str(again), "--from-probe", str(out), "--quiet"]) == 0
    )
    # the same report and decisions, and the same checkpoint: probe pass 1 runs again alone for
    # the statistics quantize is seeded from (deterministic: the full run's bits)
    assert run_files(again) == run_files(out)
    assert (again / "quant" / "model.safetensors").is_file()
    assert "probe" not in json.loads((again / "timings.json").read_text())["phases_seconds"]


def test_from_probe_of_other_data_or_settings_is_refused(done, tmp_path, capsys):
    root, recipe, out = done
    other = tmp_path / "other.txt"
    other.write_text("a green circle\na blue square\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(recipe.read_text().replace(str(root / "prompts.txt"), str(other)))
    assert main(["calibrate", str(bad), "-o", str(tmp_path / "o"), "--from-probe", str(out)]) == 2
    err = [ln for ln in _errors(capsys.readouterr().err) if ln.startswith("error:")]
    assert len(err) == 1 and "the probe ran on another data than this run's" in err[0]
    # another target: another engine's arithmetic and schemes
    cmd = [
        "calibrate",
        str(recipe),
        "-o",
        str(tmp_path / "o"),
        "--from-probe",
        str(out / "probe.json"),
    ]
    assert main([*cmd, "--target", "ascend910b-vllm-ascend"]) == 2
    err = [ln for ln in _errors(capsys.readouterr().err) if ln.startswith("error:")]
    assert len(err) == 1 and "the probe ran with other settings (" in err[0] and "engine" in err[0]
    assert not (tmp_path / "o").exists()
    # nothing there to reuse: one line naming what was expected
    assert (
        main(["calibrate", str(recipe), "-o", str(tmp_path / "o"), "--from-probe", str(tmp_path)])
        == 2
    )
    err = [ln for ln in _errors(capsys.readouterr().err) if ln.startswith("error:")]
    assert err == [f"error: --from-probe {tmp_path}: no probe report there (a probe or calibrate "
                   "output, or its probe.json)"]  # fmt: skip


def test_policy_build_decides_again_under_another_budget(done, tmp_path, capsys):
    _, _, out = done
    policy = tmp_path / "p.yaml"
    budget = "{limits: {denoiser: {min_sqnr_db: 45}}, min_int8_mac_share: 0.0}"
    argv = [
        "policy",
        "build",
        str(out),
        "--target",
        "ascend910b-atc",
        "--budget",
        budget,
        "-o",
        str(policy),
    ]
    assert main(argv) == 0
    report = SensitivityReport.load(out / "probe.json")
    expected = build_policy(
        report, Budget(limits={"denoiser": ModalityLimit(min_sqnr_db=45)}, min_int8_mac_share=0.0),
        get_target("ascend910b-atc"),
    )  # fmt: skip
    assert policy.read_text() == expected.to_yaml()
    assert "precision policy for" in capsys.readouterr().out
    # a metric budget needs the model; a non-policy file is not replaced; bad YAML
    for bad_budget, error in (
        ("{metric: {suite: shapes-t2i, psnr_min: 30}}", "a metric budget measures candidates"),
        ("{limits: [1", "--budget is not YAML"),
        ("{min_int8_mac_share: 3}", "--budget min_int8_mac_share: Input should be less"),
    ):
        assert main([*argv[:6], bad_budget, "-o", str(tmp_path / "x.yaml")]) == 2
        assert error in capsys.readouterr().err
    # our policy is replaced on the next build; a user's file, a policy or not, never is
    assert main(argv) == 0 and policy.read_text() == expected.to_yaml()
    notes = tmp_path / "notes.yaml"
    notes.write_text("my: notes\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text(expected.to_yaml())  # a policy the user wrote (a copy of ours, say)
    for theirs in (notes, mine):
        for force in ([], ["--force"]):
            assert main([*argv[:-1], str(theirs), *force]) == 2
            assert "exists and is not an opsnn-quant file" in capsys.readouterr().err
    assert yaml.safe_load(notes.read_text()) == {"my": "notes"}
    # ours, edited since: kept without --force, replaced with it
    policy.write_text(policy.read_text() + "# my note\n")
    assert main(argv) == 2
    assert "not an opsnn-quant policy file (or was changed since)" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0 and policy.read_text() == expected.to_yaml()


def test_policy_build_refuses_a_target_the_probe_did_not_measure(
    tiny_whisper_calibrated, tmp_path, capsys
):
    # issue 58: a vLLM-Ascend probe (its errors in vLLM-Ascend's bf16 arithmetic, SmoothQuant
    # folded, its schemes only) built a cpu-reference policy that policy show/export rejected
    _, out = tiny_whisper_calibrated
    policy = tmp_path / "p.yaml"
    argv = ["policy", "build", str(out), "-o", str(policy)]
    assert main([*argv, "--target", "cpu-reference"]) == 2
    err = _errors(capsys.readouterr().err)
    assert err == [
        f"error: {out / 'probe.json'} cannot decide a policy for cpu-reference: it measured the "
        "errors of vllm-ascend's (bfloat16, SmoothQuant folded) arithmetic, cpu-reference "
        "computes opsnn's (the model dtype); it did not measure w4a16, w8a8_timestep, "
        "w8a8_timestep_smoothquant on Linear, which cpu-reference runs; probe for it: "
        "`opsnn-quant calibrate RECIPE --target cpu-reference --strategy search` (its "
        "probe.json serves later policy builds for that target)"
    ]
    assert not policy.exists()
    # its own target: decided again, and policy show accepts what was written
    assert main([*argv, "--target", "ascend910b-vllm-ascend"]) == 0
    assert main(["policy", "show", str(policy), "--probe", str(out / "probe.json")]) == 0
