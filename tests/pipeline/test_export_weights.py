"""``export-weights`` against a run writing the same output (issue 41 §2)."""

from __future__ import annotations

import subprocess
import sys

from opsnn_quant.cli import main
from tests.pipeline.conftest import run_files

_HOLD = """
import sys, time
from opsnn_quant.output.locks import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_export_weights_refuses_an_output_another_run_is_writing(tiny_sd_calibrated, capsys):
    # export-weights OUT and calibrate -o OUT at once: both exited 0 and OUT mixed the new
    # checkpoint with an export of the old one. calibrate holds this lock while it builds OUT
    # (io.atomic_dir); the stand-in holds the same lock.
    root, _, out = tiny_sd_calibrated
    before = run_files(out)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code = main(["export-weights", str(out), "--data", str(root / "prompts.txt"), "--quiet"])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    # refused at the check, before the model loads (issue 58 §3: the exports lie in OUT)
    assert err[0] == (
        f"error: output {out / 'export' / 'ascendv1'} lies in the output {out}, which another "
        "opsnn-quant run is writing; wait for it to finish or choose another output"
    )
    assert run_files(out) == before


def test_an_output_calibrated_at_a_short_decoding_length_exports_and_evaluates(
    tiny_whisper_calibrated, tmp_path, capsys
):
    # issue 58: a 16-position Whisper calibrated with --set max_new_tokens=8 was refused by
    # export-weights and evaluate at the family's default, 64 ("does not fit ... use at most
    # 14"): the model is loaded again with the settings it was calibrated with
    import json

    _, out = tiny_whisper_calibrated
    exported = tmp_path / "export"
    argv = ["export-weights", str(out), "-o", str(exported), "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    assert (exported / "ascendv1" / "quant_model_weights.safetensors").is_file()
    # evaluate runs both models at the suite's decoding length: 8 fits, 15 does not
    suite = tmp_path / "asr.yaml"
    text = (
        "schema_version: 1\nname: tiny-asr\ntask: asr\n"
        "data: {dataset: speech, split: eval, samples: 2}\n"
        "generation: {max_new_tokens: TOKENS, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {wer_delta_max_points: 100.0}}\n"
    )
    suite.write_text(text.replace("TOKENS", "8"))
    args = ["evaluate", "--candidate", str(out), "--suite", str(suite), "--latency", "none",
            "--allow-broken-baseline", "--quiet"]  # fmt: skip
    assert main([*args, "-o", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "report.json").read_text())["verdict"] == "PASS"
    suite.write_text(text.replace("TOKENS", "15"))
    capsys.readouterr()
    assert main([*args, "-o", str(tmp_path / "r15")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: suite tiny-asr: generation.max_new_tokens: 15 does not fit "
    ), err
    assert "use at most 14" in err[0] and not (tmp_path / "r15").exists()
