"""``AcceptanceReport``: the versioned, machine-readable result of an evaluation (``report.json``).

Holds the verdict and the evidence behind it: criteria rows, quality and latency tables,
backend labels, optional policy summary and per-module sensitivity, image pairs or transcript
diffs (worst first). :mod:`opsnn_quant.evaluation.render` turns it into ``report.md`` and a
self-contained ``report.html``.

JSON has no infinity; an infinite PSNR (identical images) is written as the string
``"Infinity"``, which this model reads back as ``inf``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opsnn_quant.evaluation.latency import LatencyResult
from opsnn_quant.evaluation.ort_speed import OrtSpeedResult
from opsnn_quant.evaluation.profile import ModuleTimeRow, StabilityResult, StageRow
from opsnn_quant.io import atomic_write_text, load_json_model

REPORT_SCHEMA_VERSION = 1
EXIT_PASS = 0
EXIT_FAIL = 3

Status = Literal["PASS", "FAIL", "INFO"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class Criterion(_Model):
    """One acceptance check.

    Attributes:
        key: The suite threshold, e.g. ``psnr_min``.
        label: What is compared, in words (says FD, not FID, for a non-Inception space).
        measured_key: Key of the measured value in ``AcceptanceReport.measured``.
        value: The measured value (None: not measured, which fails).
        threshold: The suite's bound.
        comparator: ``<=`` or ``>=`` (value comparator threshold passes).
        status: PASS, FAIL or INFO (reported but not enforced, e.g. CPU-reference latency).
        note: Why INFO / FAIL when it is not obvious.
    """

    key: str
    label: str
    measured_key: str
    value: float | None
    threshold: float
    comparator: Literal["<=", ">="]
    status: Status
    note: str = ""


class QualityRow(_Model):
    """A quality metric of both models (``delta`` = candidate - baseline)."""

    metric: str
    baseline: float | None = None
    candidate: float | None = None
    delta: float | None = None
    unit: str = ""
    note: str = ""


class LatencyRow(_Model):
    """A latency measurement of one model (``label``: baseline, candidate, ...)."""

    label: str
    result: LatencyResult


class ImagePairRow(_Model):
    """One baseline/candidate image pair (same prompt and seed)."""

    index: int
    prompt: str = ""
    seed: int | None = None
    psnr_db: float
    ssim: float
    mae: float
    max_abs: int
    clip_baseline: float | None = None
    clip_candidate: float | None = None
    image: str | None = None  # path of the side-by-side PNG, relative to the report dir


class DiffChunkRow(_Model):
    """A piece of the baseline -> candidate word alignment."""

    op: str
    ref: str
    hyp: str


class TranscriptRow(_Model):
    """One utterance's normalised transcripts and word errors (see :mod:`.wer`)."""

    index: int
    reference: str
    baseline: str
    candidate: str
    ref_words: int
    baseline_errors: int
    candidate_errors: int
    agreement_errors: int
    diff: list[DiffChunkRow] = Field(default_factory=list)


class SensitivityRow(_Model):
    """Per-module sensitivity from a ``probe.json``, for the report's chart and table."""

    name: str
    type: str
    modality: str
    contribution: float | None = None  # end-to-end relative noise energy, if probed
    sqnr_db: float | None = None  # best local W8A8 SQNR over the probed schemes
    fp16_overflow: bool = False


class AcceptanceReport(_Model):
    """The result of ``evaluate(baseline, candidate, suite)``."""

    schema_version: int = REPORT_SCHEMA_VERSION
    suite: str
    task: Literal["t2i", "asr"]
    baseline_label: str = "baseline"
    candidate_label: str = "candidate"
    created: str = ""
    verdict: Literal["PASS", "FAIL"]
    criteria: list[Criterion] = Field(default_factory=list)
    backends: dict[str, str] = Field(default_factory=dict)
    measured: dict[str, float | None] = Field(default_factory=dict)
    quality: list[QualityRow] = Field(default_factory=list)
    latency: list[LatencyRow] = Field(default_factory=list)
    stages: dict[str, list[StageRow]] = Field(default_factory=dict)
    top_modules: dict[str, list[ModuleTimeRow]] = Field(default_factory=dict)
    stability: dict[str, StabilityResult] = Field(default_factory=dict)
    onnxruntime: OrtSpeedResult | None = None
    policy: dict[str, Any] | None = None
    sensitivity: list[SensitivityRow] = Field(default_factory=list)
    image_pairs: list[ImagePairRow] = Field(default_factory=list)
    transcripts: list[TranscriptRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != REPORT_SCHEMA_VERSION:
            raise ValueError(
                f"report schema_version {v} is not supported (expected {REPORT_SCHEMA_VERSION})"
            )
        return v

    @property
    def exit_code(self) -> int:
        """0 when the verdict is PASS, 3 when it is FAIL."""
        return exit_code(self)

    def to_json(self) -> str:
        """Deterministic JSON text (sorted keys, 2-space indent, ``"Infinity"`` for inf)."""
        data = json.loads(self.model_dump_json())
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write ``report.json`` atomically."""
        return atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceReport:
        """Read and validate a ``report.json``.

        Raises:
            ConfigError: Missing file, bad JSON or a schema violation (names the field).
        """
        return load_json_model(cls, path)


def overall_verdict(criteria: list[Criterion]) -> Literal["PASS", "FAIL"]:
    """FAIL if any criterion failed, else PASS (INFO rows do not count)."""
    return "FAIL" if any(c.status == "FAIL" for c in criteria) else "PASS"


def exit_code(report: AcceptanceReport) -> int:
    """Process exit code of ``opsnn-quant evaluate``: 0 PASS, 3 FAIL."""
    return EXIT_PASS if report.verdict == "PASS" else EXIT_FAIL


def sensitivity_rows(report: Any, top: int | None = None) -> list[SensitivityRow]:
    """Rows from a :class:`~opsnn_quant.probe.report.SensitivityReport`, most sensitive first.

    Ordered by end-to-end contribution where the probe measured it, then by lowest local
    SQNR; modules with neither come last in model order.
    """
    rows = []
    for m in report.modules:
        sqnrs = [s.sqnr_db for s in m.w8a8.values() if s.sqnr_db is not None]
        rows.append(
            SensitivityRow(
                name=m.name,
                type=m.type,
                modality=str(getattr(m.modality, "value", m.modality)),
                contribution=m.e2e.contribution if m.e2e is not None else None,
                sqnr_db=max(sqnrs) if sqnrs else None,
                fp16_overflow=bool(m.fp16.overflow) if m.fp16 is not None else False,
            )
        )

    def key(r: SensitivityRow) -> tuple[int, float]:
        if r.contribution is not None:
            return (0, -r.contribution)
        if r.sqnr_db is not None:
            return (1, r.sqnr_db)
        return (2, 0.0)

    rows = [r for _, r in sorted(enumerate(rows), key=lambda t: (*key(t[1]), t[0]))]
    return rows[:top] if top is not None else rows


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table: ``-`` for None, ``inf`` spelled out, fixed significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return (
        f"{value:.{digits}g}" if abs(value) >= 1e4 or abs(value) < 1e-3 else f"{value:.{digits}f}"
    )
