"""``export-weights`` against a run writing the same output (issue 41 §2)."""

from __future__ import annotations

import subprocess
import sys

from opsnn_quant.cli import main
from tests.pipeline.conftest import run_files

_HOLD = """
import sys, time
from opsnn_quant.io import output_lock
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
