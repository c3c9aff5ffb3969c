"""The schema of ``report.json``: the report's fields and its rows (criteria, quality, latency,
image pairs, transcript diffs, sensitivity), and how numbers are printed in its tables.

:class:`~opsnn_quant.evaluation.report.AcceptanceReport` is :class:`ReportSchema` with ``save``;
the renderer (:mod:`opsnn_quant.evaluation.render`) reads the schema, so the report can write
itself through it without an import cycle.

JSON has no infinity; an infinite PSNR (identical images) is written as the string
``"Infinity"``, which these models read back as ``inf``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from opsnn_quant.core.readers import load_json_model
from opsnn_quant.evaluation.latency import LatencyResult
from opsnn_quant.evaluation.ort_speed import OrtSpeedResult
from opsnn_quant.evaluation.profile import ModuleTimeRow, StabilityResult, StageRow

if TYPE_CHECKING:
    from opsnn_quant.probe.report import SensitivityReport

# 2: criteria carry their backend; NOT JUDGED replaces INFO; target and latency_* fields.
# 3: criteria carry their interval (ci_low, ci_high, ci_level, n, samples_to_decide); the
#    INCONCLUSIVE status and verdict. A version 2 report is a version 3 one without them: read.
REPORT_SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (2, 3)
EXIT_PASS = 0
EXIT_FAIL = 3
EXIT_INCONCLUSIVE = 4

Status = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT JUDGED"]
Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]
NOT_JUDGED: Status = "NOT JUDGED"
NOTHING_JUDGED_NOTE = (
    "no criterion could be judged on this machine (every one is NOT JUDGED): the verdict is FAIL"
)


class ReportModel(BaseModel):
    """Base of every report model: no unknown fields; infinities as ``"Infinity"`` in JSON."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class Criterion(ReportModel):
    """One acceptance check.

    Attributes:
        key: The suite threshold, e.g. ``psnr_min``.
        label: What is compared, in words (says FD, not FID, for a non-Inception space).
        measured_key: Key of the measured value in ``AcceptanceReport.measured``.
        value: The measured value (None: not measured, which fails).
        threshold: The suite's bound.
        comparator: ``<=`` or ``>=`` (value comparator threshold passes).
        status: PASS, FAIL, INCONCLUSIVE or NOT JUDGED (reported, not counted: a latency
            figure from a backend that is not the policy target's, see :mod:`.gate`). With an
            interval, PASS when all of ``[ci_low, ci_high]`` meets the threshold, FAIL when none
            of it does, else INCONCLUSIVE; without one, the value decides PASS or FAIL.
        backend: Where the value was measured (``cpu-reference``, ``cpu-onnxruntime``, ``npu``);
            for a figure not measured, where it would have been.
        note: Why NOT JUDGED / FAIL, or which backend a latency criterion is judged on.
        ci_low, ci_high: The value's paired bootstrap interval (:mod:`.intervals`); None for a
            figure with no per-sample decomposition (FD) or a latency ratio.
        ci_level: The interval's confidence (the suite's ``metrics.confidence``).
        n: Samples the value comes from (utterances or prompts); None for latency ratios.
        samples_to_decide: INCONCLUSIVE only: about how many samples would decide it, by the
            1/sqrt(n) shrinking of the interval (None: the interval is centred on the
            threshold).
    """

    key: str
    label: str
    measured_key: str
    value: float | None
    threshold: float
    comparator: Literal["<=", ">="]
    status: Status
    backend: str = ""
    note: str = ""
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    n: int | None = None
    samples_to_decide: int | None = None


class QualityRow(ReportModel):
    """A quality metric of both models (``delta`` = candidate - baseline)."""

    metric: str
    baseline: float | None = None
    candidate: float | None = None
    delta: float | None = None
    unit: str = ""
    note: str = ""


class LatencyRow(ReportModel):
    """A latency measurement of one model (``label``: baseline, candidate, ...)."""

    label: str
    result: LatencyResult


class ImagePairRow(ReportModel):
    """One baseline/candidate image pair (same prompt and seed), or video pair: ``frames``
    set, its PSNR, SSIM and MAE the means over its frames, its max |diff| over all of them."""

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
    frames: int | None = None  # a video pair's frames; None: an image pair


class DiffChunkRow(ReportModel):
    """A piece of the baseline -> candidate word alignment."""

    op: str
    ref: str
    hyp: str


class TranscriptRow(ReportModel):
    """One utterance: normalised texts, errors of both models and the baseline->candidate diff
    (computed by :func:`.wer.utterance_rows`).

    Attributes:
        index: Position in the inputs.
        reference, baseline, candidate: Normalised texts.
        ref_words: Words in the normalised reference.
        baseline_errors, candidate_errors: Word edits against the reference.
        agreement_errors: Word edits turning the baseline transcript into the candidate's.
        diff: Word alignment of baseline (``ref``) against candidate (``hyp``).
        baseline_repeats, candidate_repeats: what the model's transcript repeats in a loop, or
            the words it made up beyond the reference (:func:`.wer.repetition`); None: neither.
    """

    index: int
    reference: str
    baseline: str
    candidate: str
    ref_words: int
    baseline_errors: int
    candidate_errors: int
    agreement_errors: int
    diff: list[DiffChunkRow] = Field(default_factory=list)
    baseline_repeats: str | None = None
    candidate_repeats: str | None = None
    unit: str = "words"  # what ref_words and the errors count ("characters" without word spaces)

    @property
    def extra_errors(self) -> int:
        """Errors the candidate makes beyond the baseline's (negative: it did better)."""
        return self.candidate_errors - self.baseline_errors


SENSITIVITY_UNIT = "%"
SENSITIVITY_NOTE = (
    "e2e noise: the probe's estimated end-to-end noise energy of the module under W8A8, % of the "
    "model output's energy; local W8A8 noise: the module output's own, 100 x 10^(-SQNR/10); "
    "the chart plots the same % (e2e where probed, else local)"
)


class SensitivityRow(ReportModel):
    """Per-module sensitivity from a ``probe.json``, for the report's chart and table.

    The table and the chart show both figures in one unit, percent of relative noise energy:
    :meth:`e2e_pct` and :meth:`local_pct`.
    """

    name: str
    type: str
    modality: str
    contribution: float | None = None  # end-to-end relative noise energy, if probed
    sqnr_db: float | None = None  # best local W8A8 SQNR over the probed schemes
    fp16_overflow: bool = False

    def e2e_pct(self) -> float | None:
        """Estimated end-to-end noise, % of the output's energy (``100 ||dy||^2 / ||y||^2``)."""
        return None if self.contribution is None else 100.0 * self.contribution

    def local_pct(self) -> float | None:
        """Local W8A8 noise, % of the module output's energy (``100 * 10^(-SQNR/10)``)."""
        return None if self.sqnr_db is None else 100.0 * 10 ** (-self.sqnr_db / 10)


class ReportSchema(ReportModel):
    """The fields of ``report.json`` (:class:`~opsnn_quant.evaluation.report.AcceptanceReport`
    is this schema with :meth:`~opsnn_quant.evaluation.report.AcceptanceReport.save`).

    Attributes (beyond the self-explanatory ones):
        target: The policy's deployment target; it decides which backends' latency is judged.
        backends: Where each kind of figure came from (``quality``, ``latency``: the backend the
            latency criteria read, ``onnxruntime``).
        latency_mode: ``--latency`` of the run (``none``, ``target``, ``all``).
        latency_skipped: One line per measurement the suite configures that this run skipped.
        latency_judged_on: Backends whose latency/memory ratios count for the verdict.
    """

    schema_version: int = REPORT_SCHEMA_VERSION
    suite: str
    task: str  # the suite's (a task of :mod:`.tasks`)
    baseline_label: str = "baseline"
    candidate_label: str = "candidate"
    created: str = ""
    verdict: Verdict
    target: str | None = None
    criteria: list[Criterion] = Field(default_factory=list)
    backends: dict[str, str] = Field(default_factory=dict)
    measured: dict[str, float | None] = Field(default_factory=dict)
    quality: list[QualityRow] = Field(default_factory=list)
    latency: list[LatencyRow] = Field(default_factory=list)
    latency_mode: Literal["none", "target", "all"] = "all"
    latency_skipped: list[str] = Field(default_factory=list)
    latency_judged_on: list[str] = Field(default_factory=list)
    stages: dict[str, list[StageRow]] = Field(default_factory=dict)
    top_modules: dict[str, list[ModuleTimeRow]] = Field(default_factory=dict)
    stability: dict[str, StabilityResult] = Field(default_factory=dict)
    onnxruntime: OrtSpeedResult | None = None
    policy: dict[str, Any] | None = None
    sensitivity: list[SensitivityRow] = Field(default_factory=list)
    image_pairs: list[ImagePairRow] = Field(default_factory=list)
    transcripts: list[TranscriptRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    # Wall-clock seconds per phase of the run that made the report (calibrate's phases before
    # the acceptance run's): like ``created``, the run's own; every other field is the same
    # bytes on a rerun without latency timing.
    timings: dict[str, float] = Field(default_factory=dict)
    # A distributed run (torchrun): world size, hosts, backend and each rank's device.
    world: dict[str, Any] = Field(default_factory=dict)
    # What the outputs' bits depend on beside the inputs and the models: the batch size they
    # were generated in, the threads, the device and torch's CPU capability and version (a
    # float GEMM rounds by its rows and threads and by the kernel the CPU kind runs). A rerun
    # with the same values gives the same outputs; with other values, outputs may differ.
    outputs_depend_on: dict[str, Any] = Field(default_factory=dict)
    # The two models' outputs (images or transcripts) of the run, for the report's image grids;
    # not part of report.json.
    _outputs: tuple[list[Any], list[Any]] | None = PrivateAttr(default=None)

    def with_outputs(self, baseline: list[Any], candidate: list[Any]) -> Self:
        """This report carrying the run's outputs (see :attr:`outputs`)."""
        self._outputs = (list(baseline), list(candidate))
        return self

    @property
    def outputs(self) -> tuple[list[Any], list[Any]] | None:
        """``(baseline, candidate)`` outputs of the run that made this report (None when it
        was loaded from disk)."""
        return self._outputs

    def next_steps(self, out: str = "OUT") -> list[str]:
        """What to try after a FAIL or an INCONCLUSIVE verdict, one line each (none after a
        PASS): the modality whose output lost most and its costliest modules (from the
        policy's figures and the probe's sensitivity), and the commands that decide again
        without probing (``out``: the calibrate output the candidate came from)."""
        if self.verdict == "INCONCLUSIVE":
            return [
                "next: judge more samples (data.samples of the suite): each interval narrows "
                "as 1/sqrt(n); a criterion's interval that still straddles its threshold at "
                "the size you can afford is a budget smaller than the noise of your data"
            ]
        if self.verdict != "FAIL":
            return []
        failed = ", ".join(c.key for c in self.criteria if c.status == "FAIL")
        steps = [f"next: {failed} failed"]
        modalities = (self.policy or {}).get("modalities", {})
        int8 = {
            m: f.get("measured_sqnr_db", f.get("predicted_sqnr_db"))
            for m, f in modalities.items()
            if f.get("int8_mac_share")
            and f.get("measured_sqnr_db", f.get("predicted_sqnr_db")) is not None
        }
        if int8:
            worst = min(int8, key=lambda m: (int8[m], m))
            costly = sorted(
                (r for r in self.sensitivity if r.modality == worst and r.contribution),
                key=lambda r: (-(r.contribution or 0.0), r.name),
            )[:3]
            names = ", ".join(r.name for r in costly)
            floor = float(int8[worst]) + 6.0
            steps.append(
                f"next: {worst} lost most ({int8[worst]:.1f} dB at its output)"
                + (f"; its costliest modules: {names}" if names else "")
                + f". Decide again under a higher floor without probing: opsnn-quant calibrate "
                f"RECIPE --from-probe {out} --budget '{{limits: {{{worst}: {{min_sqnr_db: "
                f"{floor:.0f}}}}}}}' -o {out}-2 (or keep it float: --budget "
                f"'{{limits: {{{worst}: {{min_sqnr_db: 99}}}}}}')"
            )
        return steps

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(
                f"report schema_version {v} is not supported (expected {REPORT_SCHEMA_VERSION})"
            )
        return v

    @property
    def exit_code(self) -> int:
        """0 when the verdict is PASS, 3 when it is FAIL, 4 when it is INCONCLUSIVE."""
        return exit_code(self)

    def to_json(self) -> str:
        """Deterministic JSON text (sorted keys, 2-space indent, ``"Infinity"`` for inf)."""
        data = json.loads(self.model_dump_json())
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read and validate a ``report.json``.

        Raises:
            ConfigError: Missing file, bad JSON or a schema violation (names the field).
        """
        return load_json_model(cls, path)


def verdict_exit_code(verdict: str) -> int:
    """The exit code of a verdict: 0 PASS, 3 FAIL, 4 INCONCLUSIVE."""
    return {"PASS": EXIT_PASS, "INCONCLUSIVE": EXIT_INCONCLUSIVE}.get(verdict, EXIT_FAIL)


def exit_code(report: ReportSchema) -> int:
    """Process exit code of ``opsnn-quant evaluate``: 0 PASS, 3 FAIL, 4 INCONCLUSIVE."""
    return verdict_exit_code(report.verdict)


def overall_verdict(criteria: list[Criterion]) -> Verdict:
    """FAIL when a judged criterion FAILED, else INCONCLUSIVE when one is INCONCLUSIVE, else
    PASS; NOT JUDGED rows do not count.

    A suite that sets thresholds none of which could be judged here FAILS: a gate that judged
    nothing has not let anything through. No thresholds at all: PASS (nothing was asked).
    """
    judged = [c for c in criteria if c.status != NOT_JUDGED]
    if criteria and not judged:
        return "FAIL"
    if any(c.status == "FAIL" for c in judged):
        return "FAIL"
    return "INCONCLUSIVE" if any(c.status == "INCONCLUSIVE" for c in judged) else "PASS"


def sensitivity_rows(report: SensitivityReport, top: int | None = None) -> list[SensitivityRow]:
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
    """A number for a table: ``-`` for None, ``inf`` spelled out, ``digits`` decimals, a large
    one whole with thousands separators, a tiny one in significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if 1e4 <= abs(value) < 1e12:  # 29,600 (a latency in ms), never 2.96e+04
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if not 1e-3 <= abs(value) < 1e12 else f"{value:.{digits}f}"
