"""``calibrate --resume``: an interrupted run's finished phases (probe, policy) are kept in its
temporary directory, and the same command with ``--resume`` writes what an uninterrupted run
writes, byte for byte (every file but the wall-clock ``timings.json`` and the run's marker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsnn_quant.cli import main
from opsnn_quant.pipeline import calibrate as calibrate_mod
from tests.pipeline.conftest import run_files


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f"{out.name}.tmp-"))


@pytest.fixture(scope="module")
def whole(tiny_sd_calibrated):
    _, recipe, out = tiny_sd_calibrated
    return recipe, out


def _interrupt(monkeypatch, phase: str) -> None:
    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # what Ctrl-C raises inside the phase

    monkeypatch.setattr(calibrate_mod, phase, stop)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stopped_in", "skipped"),
    [("decide", ["probe"]), ("quantize_phase", ["probe", "policy"])],
)
def test_a_resumed_run_writes_the_bytes_of_an_uninterrupted_one(
    whole, tmp_path, monkeypatch, capsys, caplog, stopped_in, skipped
):
    recipe, reference = whole
    out = tmp_path / "out"
    cmd = ["calibrate", str(recipe), "-o", str(out)]
    with monkeypatch.context() as m:
        _interrupt(m, stopped_in)
        assert main(cmd) == 130
    assert not out.exists()  # never a half-written output
    kept = _leftovers(out)
    assert len(kept) == 1
    record = json.loads((tmp_path / kept[0] / ".resume.json").read_text())
    assert record["done"] == skipped
    assert "the same command with --resume goes on" in caplog.text

    assert main([*cmd, "--resume"]) == 0
    err = capsys.readouterr().err
    for phase in skipped:
        assert f"resuming after the {phase}" in err
    assert run_files(out) == run_files(reference)
    assert not (out / ".resume.json").exists() and _leftovers(out) == []
    timings = json.loads((out / "timings.json").read_text())["phases_seconds"]
    assert "probe" not in timings and "probe pass 1 (statistics)" in timings


def test_resume_with_nothing_to_resume_is_one_error_line(whole, tmp_path, capsys):
    recipe, _ = whole
    out = tmp_path / "out"
    assert main(["calibrate", str(recipe), "-o", str(out), "--resume"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "no interrupted calibrate run into" in err[0]
    assert not out.exists()


def test_resume_of_another_command_is_refused_and_a_plain_run_starts_over(
    whole, tmp_path, monkeypatch, capsys
):
    recipe, _ = whole
    out = tmp_path / "out"
    cmd = ["calibrate", str(recipe), "-o", str(out), "--quiet"]
    with monkeypatch.context() as m:
        _interrupt(m, "decide")
        assert main(cmd) == 130
    assert len(_leftovers(out)) == 1
    capsys.readouterr()
    assert main([*cmd, "--resume", "--seed", "7"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "ran with other recipe" in err[0]
    assert len(_leftovers(out)) == 1 and not out.exists()  # still there to resume
    with monkeypatch.context() as m:  # without --resume: the kept work is removed, run anew
        _interrupt(m, "quantize_phase")
        assert main(cmd) == 130
    kept = _leftovers(out)
    assert len(kept) == 1
    assert json.loads((tmp_path / kept[0] / ".resume.json").read_text())["done"] == [
        "probe",
        "policy",
    ]


def test_a_failure_before_any_phase_finished_keeps_nothing(whole, tmp_path, monkeypatch):
    recipe, _ = whole
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _interrupt(m, "run_probe")
        assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 130
    assert _leftovers(out) == [] and not out.exists()


def test_a_same_length_edit_of_the_kept_policy_is_refused_naming_the_file(
    whole, tmp_path, monkeypatch, capsys
):
    # issue 58 §14: --resume compared sizes: a kept policy.yaml edited to the same length (a
    # rule's precision changed) was adopted and deployed
    recipe, _ = whole
    out = tmp_path / "out"
    cmd = ["calibrate", str(recipe), "-o", str(out), "--quiet"]
    with monkeypatch.context() as m:
        _interrupt(m, "float_references")  # the first phase after the policy's
        assert main(cmd) == 130
    (kept,) = _leftovers(out)
    policy = tmp_path / kept / "policy.yaml"
    text = policy.read_text()
    edited = text.replace("int8", "fp16", 1) if "int8" in text else text.replace("fp16", "int8", 1)
    assert edited != text and len(edited.encode()) == len(text.encode())
    policy.write_text(edited)
    capsys.readouterr()
    assert main([*cmd, "--resume"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [
        f"error: --resume: {policy} was added, removed or changed since the interrupted run kept "
        "its output; run without --resume"
    ]
    assert policy.read_text() == edited and not out.exists()  # nothing adopted, nothing removed
