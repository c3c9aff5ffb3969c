"""``timings.json``: the wall-clock seconds of one run, apart from the files that describe the model.

Every other file ``calibrate`` and ``probe`` write is a function of the inputs (recipe, model,
data, seed) and the platform: rerun, it is the same bytes. Wall-clock times are not, so they
live here (and in the log, and in an acceptance report's "Run times", its one section that
differs between runs), never in ``probe.json``, the policy or a checkpoint. So does the
``environment`` the times were taken in: the CPU's int8 features and the exact int8 GEMM path
each size class of product ran (chosen by a timed race, :mod:`opsnn_quant.ascend.gemm_path`,
so it may differ between runs on one machine; it never changes a result).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from opsnn_quant.formats.calibrate_output import TIMINGS_FILE
from opsnn_quant.output.files import atomic_write_text

SCHEMA_VERSION = 1


def timings_json(*, probe: Mapping[str, float], phases: Mapping[str, float] | None = None) -> str:
    """The text of ``timings.json`` (sorted keys, seconds to the microsecond).

    Args:
        probe: the probe's costs (:attr:`~opsnn_quant.probe.report.SensitivityReport.costs`:
            ``pass1_seconds``, ``<modality>_estimator_seconds``, ... and the
            ``*_forward_equivalents`` ratios of those times).
        phases: seconds per phase of the command (``probe``, ``quantize``, ``total``), if any.
    """
    doc: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "probe": {k: round(float(v), 6) for k, v in probe.items()},
        "environment": run_environment(),
    }
    if phases is not None:
        doc["phases_seconds"] = {k: round(float(v), 6) for k, v in phases.items()}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def run_environment() -> dict[str, object]:
    """What the run's times depend on: the int8 GEMM path per size class and how it was chosen,
    the CPU's flags and torch's CPU capability, the threads (see
    :func:`opsnn_quant.ascend.gemm_path.describe`)."""
    from opsnn_quant.ascend.gemm_path import describe
    from opsnn_quant.ascend.matmul import gemm_choice

    return describe(gemm_choice())


def write_timings(
    directory: Path, *, probe: Mapping[str, float], phases: Mapping[str, float] | None = None
) -> Path:
    """Write ``directory/timings.json`` atomically (see :func:`timings_json`); returns its path."""
    return atomic_write_text(directory / TIMINGS_FILE, timings_json(probe=probe, phases=phases))
