"""Reproducible maths: MKL's strict reproducibility, which makes a float GEMM's row independent
of the rows batched with it (issue 46: a transcript must not change with the batch it was
decoded in)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from opsnn_quant.core import determinism
from opsnn_quant.core.determinism import gemm_rows_invariant, set_reproducible


def test_rows_are_invariant_with_strict_cnr_set_before_the_first_matmul():
    # tests/conftest.py sets it before torch loads, as the CLI's main() does before any work
    assert os.environ["MKL_CBWR"] == "AUTO,STRICT"
    assert gemm_rows_invariant()


def test_a_fresh_process_set_up_by_set_reproducible_has_invariant_rows():
    # the Python API's order: set_reproducible() first, then torch
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    code = (
        "from opsnn_quant.core.determinism import set_reproducible, gemm_rows_invariant\n"
        "set_reproducible()\nimport torch\nprint(gemm_rows_invariant())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "True"


def test_set_reproducible_warns_when_it_comes_after_the_first_matmul(monkeypatch, caplog):
    monkeypatch.setattr(determinism, "gemm_rows_invariant", lambda: False)
    monkeypatch.setattr(determinism, "_warned", False)
    with caplog.at_level(logging.WARNING, logger=determinism.__name__):
        set_reproducible()
        set_reproducible()  # the pipeline sets up at each phase: one warning a process
    assert caplog.text.count("round by their row count") == 1
    assert "not in effect (MKL_CBWR=AUTO,STRICT; it must be AUTO,STRICT before" in caplog.text
    caplog.clear()
    monkeypatch.setattr(determinism, "_warned", False)
    monkeypatch.setattr(determinism, "gemm_rows_invariant", lambda: True)
    with caplog.at_level(logging.WARNING, logger=determinism.__name__):
        set_reproducible()
    assert caplog.text == ""


@pytest.mark.parametrize("invariant", [True, False])
def test_the_report_says_what_outputs_depend_on(monkeypatch, invariant):
    import torch

    from opsnn_quant.evaluation.evaluate import output_conditions

    class Settings:
        batch_size = 3

    class Adapter:
        settings = Settings()
        device = torch.device("cpu")

    monkeypatch.setattr(determinism, "gemm_rows_invariant", lambda: invariant)
    assert output_conditions(Adapter()) == {  # type: ignore[arg-type]
        "batch_size": 3,
        "threads": torch.get_num_threads(),
        "device": "cpu",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "float_gemm_rows_invariant": invariant,
        "torch": torch.__version__,
    }
    # the report carries them, and a note where the rows are not invariant
    from opsnn_quant.evaluation.evaluate import BATCH_DEPENDENT_NOTE, _stamp_run
    from opsnn_quant.evaluation.report import AcceptanceReport

    report = AcceptanceReport(suite="s", task="asr", verdict="PASS")
    _stamp_run(report, {"baseline outputs": 1.0}, 0.0, Adapter())  # type: ignore[arg-type]
    assert report.outputs_depend_on["float_gemm_rows_invariant"] is invariant
    assert (BATCH_DEPENDENT_NOTE in report.notes) is (not invariant)
    assert report.timings == {"baseline outputs": 1.0}


def test_source_date_epoch_is_whole_seconds_up_to_the_last_datetime(monkeypatch):
    import datetime as dt

    from opsnn_quant.core.determinism import MAX_EPOCH, source_date_epoch
    from opsnn_quant.errors import ConfigError

    # the largest value is the last second a datetime holds
    assert dt.datetime.fromtimestamp(MAX_EPOCH, dt.UTC).isoformat() == "9999-12-31T23:59:59+00:00"
    for value, expected in (("0", 0), ("1767225600", 1767225600), (str(MAX_EPOCH), MAX_EPOCH)):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
        assert source_date_epoch() == expected
    for unset in ("", None):
        if unset is None:
            monkeypatch.delenv("SOURCE_DATE_EPOCH")
        else:
            monkeypatch.setenv("SOURCE_DATE_EPOCH", unset)
        assert source_date_epoch() is None
    for bad in (str(MAX_EPOCH + 1), "1.5", " 12", "١٢", "-1", "x" * 100):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", bad)
        with pytest.raises(ConfigError, match=r"^SOURCE_DATE_EPOCH=.* is not a time"):
            source_date_epoch()
