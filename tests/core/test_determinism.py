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
from opsnn_quant.core.determinism import (
    gemm_rows_floor,
    gemm_rows_invariant,
    rows_to_run,
    set_reproducible,
)


def test_rows_are_invariant_from_the_floor_with_strict_cnr_set_before_the_first_matmul():
    # tests/conftest.py sets it before torch loads, as the CLI's main() does before any work
    import torch

    assert os.environ["MKL_CBWR"] == "AUTO,STRICT"
    floor = gemm_rows_floor()
    assert floor is not None and 1 <= floor <= determinism.MAX_ROWS_FLOOR
    assert gemm_rows_invariant()
    # every count from the floor on gives a row the same bits as among 32 rows (a wider
    # product than the probe's, other sizes): what padding a batch to the floor relies on
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(32, 512, generator=g), torch.randn(1024, 512, generator=g)
    full = torch.nn.functional.linear(x, w)
    for m in range(floor, 32):
        assert torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]), m
    assert [rows_to_run(n) for n in (1, floor, floor + 5)] == [floor, floor, floor + 5]


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


@pytest.mark.parametrize(
    ("same", "floor"),
    [
        ([True] * 15, 1),  # Intel, strict: every count agrees
        ([False] * 3 + [True] * 12, 4),  # AMD EPYC, strict or not: from 4 rows on
        ([False, False, False, True, False, False, False] + [True] * 8, 8),
        ([False] * 8 + [True] * 7, None),  # from 9 rows only: past MAX_ROWS_FLOOR
        ([False, False, False, True] + [False] * 10 + [True], None),
        ([False] * 15, None),  # compatible mode on the AMD EPYC: no count agrees
    ],
)
def test_the_floor_is_the_first_count_from_which_every_count_agrees(same, floor):
    assert determinism.floor_of(same) == floor


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
