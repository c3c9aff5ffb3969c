"""``AcceptanceReport``: the versioned, machine-readable result of an evaluation (``report.json``).

Holds the verdict and the evidence behind it: criteria rows, quality and latency tables,
backend labels, optional policy summary and per-module sensitivity, image pairs or transcript
diffs (worst first); the fields are :class:`~opsnn_quant.evaluation.report_schema.ReportSchema`'s.
:meth:`AcceptanceReport.save` writes it with ``report.md`` and a self-contained ``report.html``
(:mod:`opsnn_quant.evaluation.render`).
"""

from __future__ import annotations

import os
from pathlib import Path

from opsnn_quant.evaluation.images import ImageBatch
from opsnn_quant.evaluation.render import write_report
from opsnn_quant.evaluation.report_schema import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    NOT_JUDGED,
    NOTHING_JUDGED_NOTE,
    REPORT_SCHEMA_VERSION,
    SENSITIVITY_NOTE,
    SENSITIVITY_UNIT,
    Criterion,
    DiffChunkRow,
    ImagePairRow,
    LatencyRow,
    QualityRow,
    ReportSchema,
    SensitivityRow,
    Status,
    TranscriptRow,
    Verdict,
    exit_code,
    fmt,
    overall_verdict,
    sensitivity_rows,
    verdict_exit_code,
)

__all__ = [
    "EXIT_FAIL",
    "EXIT_INCONCLUSIVE",
    "EXIT_PASS",
    "NOTHING_JUDGED_NOTE",
    "NOT_JUDGED",
    "REPORT_SCHEMA_VERSION",
    "SENSITIVITY_NOTE",
    "SENSITIVITY_UNIT",
    "AcceptanceReport",
    "Criterion",
    "DiffChunkRow",
    "ImagePairRow",
    "LatencyRow",
    "QualityRow",
    "SensitivityRow",
    "Status",
    "TranscriptRow",
    "Verdict",
    "exit_code",
    "fmt",
    "overall_verdict",
    "sensitivity_rows",
    "verdict_exit_code",
]


class AcceptanceReport(ReportSchema):
    """The result of ``evaluate(baseline, candidate, suite)``: ``report.json``'s fields (see
    :class:`~opsnn_quant.evaluation.report_schema.ReportSchema`), able to write itself."""

    def save(
        self,
        out_dir: str | os.PathLike[str],
        *,
        baseline_images: ImageBatch | None = None,
        candidate_images: ImageBatch | None = None,
    ) -> Path:
        """Write ``report.json``, ``report.md``, ``report.html`` and ``plots/`` into ``out_dir``,
        as the CLI does (see :func:`~opsnn_quant.evaluation.render.write_report`).

        Args:
            out_dir: A new or empty directory (see :func:`~opsnn_quant.output.files.empty_dir`; the
                commands replace an earlier report whole).
            baseline_images, candidate_images: The images the image pairs point into (default:
                the run's own outputs, when the report carries them).

        Returns:
            ``out_dir``.
        """
        return write_report(
            self, out_dir, baseline_images=baseline_images, candidate_images=candidate_images
        )
