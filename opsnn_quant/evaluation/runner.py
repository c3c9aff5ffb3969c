"""The steps ``evaluate(baseline, candidate, suite)`` is made of, minus model loading and generation.

Quality figures come from the suite's task (:mod:`.t2i`, :mod:`.asr`: re-exported here); this
module turns them and the latency figures into criteria, one per threshold the suite sets, in
the metric table's order (:mod:`.registry`), and the report. The orchestrator generates with both models
(adapters), then::

    q = t2i_quality(base_imgs, cand_imgs, prompts, seeds=seeds, clip=scorer, fid_features=feats)
    lat_b = measure(lambda: adapter.generate(base, batch), warmup=..., runs=..., device=...)
    lat_c = measure(lambda: adapter.generate(cand, batch), ...)
    report = build_report(suite, q, baseline_latency=lat_b, candidate_latency=lat_c, ...)
    write_report(report, out / "report", baseline_images=base_imgs, candidate_images=cand_imgs)
    raise SystemExit(report.exit_code)
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from opsnn_quant.core.determinism import source_date_epoch
from opsnn_quant.evaluation.asr import asr_quality
from opsnn_quant.evaluation.gate import (
    LatencyPlan,
    Source,
    judged_backends,
    latency_note,
    pick_source,
)
from opsnn_quant.evaluation.intervals import NO_INTERVAL_NOTE, Interval, judge
from opsnn_quant.evaluation.latency import LatencyResult
from opsnn_quant.evaluation.ort_speed import OrtSpeedResult
from opsnn_quant.evaluation.profile import ModuleTimeRow, StabilityResult, StageRow
from opsnn_quant.evaluation.quality import QualityResult
from opsnn_quant.evaluation.registry import metrics
from opsnn_quant.evaluation.report import (
    NOT_JUDGED,
    NOTHING_JUDGED_NOTE,
    AcceptanceReport,
    Criterion,
    LatencyRow,
    Status,
    overall_verdict,
    sensitivity_rows,
)
from opsnn_quant.evaluation.speed import latency_measured
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.evaluation.t2i import t2i_quality

if TYPE_CHECKING:
    from opsnn_quant.policy.targets import Target
    from opsnn_quant.probe.report import SensitivityReport

__all__ = [
    "QualityResult",
    "asr_quality",
    "build_report",
    "latency_measured",
    "t2i_quality",
    "verdict",
]


def verdict(
    suite: Suite,
    measured: Mapping[str, float | None],
    *,
    latency_backend: str | None = None,
    labels: Mapping[str, str] | None = None,
    quality_backend: str = "",
    target: Target | None = None,
    unmeasured_why: str = "",
    intervals: Mapping[str, Interval] | None = None,
    samples: int | None = None,
) -> list[Criterion]:
    """One criterion row per threshold the suite sets, each naming the backend of its figure.

    A judged threshold whose value was not measured (missing, None or NaN) FAILS: a suite that
    asks for a check must get it. Latency and memory ratios are judged only on the target's
    own backends (:func:`~.gate.judged_backends`); elsewhere they are NOT JUDGED and the note
    says why.

    With ``intervals`` (the acceptance report's), a quality figure that has one is judged on
    it (:func:`~.intervals.judge`: PASS, FAIL or INCONCLUSIVE); one without (FD) keeps the
    point-estimate rule and says so. Without ``intervals`` (the default, as the measured
    search's :class:`~.slice_scorer.SliceScorer` calls it, which has its own sequential
    interval logic) every figure is judged on its point estimate: PASS or FAIL only.

    Args:
        latency_backend: Where the latency/memory ratios were (or would have been) measured.
        labels: Measured key -> row label (e.g. FD instead of FID).
        quality_backend: Where the quality figures were measured (the candidate's backend).
        target: The policy's target; None: unknown, so no latency criterion is judged.
        unmeasured_why: Appended to "not measured" for latency rows (e.g. ``--latency none``).
        intervals: Measured key -> its bootstrap interval; None: point estimates only.
        samples: Samples the quality figures come from (the rows' ``n``).
    """
    labels = labels or {}
    judged = judged_backends(target, suite.latency.enforce_backends)
    rows = []
    bounds = suite.metrics.thresholds
    for metric in metrics():
        threshold = bounds.get(metric.bound)
        if threshold is None:
            continue
        key, mkey, comp, label = metric.bound, metric.key, metric.comparator, metric.label
        value = measured.get(mkey)
        if value is not None and math.isnan(value):
            value = None
        is_latency = metric.speed
        backend = (latency_backend or "") if is_latency else quality_backend
        missing = "not measured" + (f" ({unmeasured_why})" if is_latency and unmeasured_why else "")
        status: Status
        interval = None if intervals is None or value is None else intervals.get(mkey)
        decide: int | None = None
        if value is None:
            status = "FAIL"
        elif interval is not None:
            status, decide = judge(interval, float(threshold), comp)
        else:
            ok = value <= threshold if comp == "<=" else value >= threshold
            status = "PASS" if ok else "FAIL"
        notes = [missing] if value is None else []
        if status == "INCONCLUSIVE":
            notes.append(_inconclusive_note(decide))
        elif intervals is not None and interval is None and value is not None and not is_latency:
            notes.append(NO_INTERVAL_NOTE)
        if is_latency:
            notes.append(latency_note(latency_backend, target, judged))
            if latency_backend not in judged:
                status = NOT_JUDGED
        rows.append(Criterion(key=key, label=labels.get(mkey, label), measured_key=mkey,
                              value=value, threshold=float(threshold), comparator=comp,
                              status=status, backend=backend, note="; ".join(notes),
                              ci_low=None if interval is None else interval.low,
                              ci_high=None if interval is None else interval.high,
                              ci_level=None if interval is None else interval.level,
                              n=interval.n if interval is not None else
                              (None if is_latency else samples),
                              samples_to_decide=decide))  # fmt: skip
    return rows


def _inconclusive_note(decide: int | None) -> str:
    """Why a criterion is INCONCLUSIVE, and the sample count that would likely decide it."""
    if decide is None:
        return "the interval straddles the threshold, centred on it: no sample count decides it"
    return (
        f"the interval straddles the threshold; about {decide} samples would decide it "
        "(its width shrinks as 1/sqrt(n))"
    )


def _latency_pair(
    measured: dict[str, float | None],
    backends: dict[str, str],
    judged: frozenset[str],
    onnxruntime: OrtSpeedResult | None,
    eager: tuple[LatencyResult | None, LatencyResult | None],
    unmeasured_backend: str | None,
) -> str | None:
    """Add every measured pair's ratios to ``measured`` (``*_eager`` / ``*_onnxruntime``) and
    the criteria's from the pair on a judged backend (:func:`~.gate.pick_source`); returns the
    latency criteria's backend (``unmeasured_backend`` when nothing was timed)."""
    pairs: list[tuple[Source, LatencyResult, LatencyResult]] = []
    if onnxruntime is not None:
        backends["onnxruntime"] = onnxruntime.qdq.backend
        pairs.append(("onnxruntime", onnxruntime.fp32, onnxruntime.qdq))
        _ratios(measured, "onnxruntime", onnxruntime.fp32, onnxruntime.qdq)
    base, cand = eager
    if base is not None and cand is not None:
        pairs.append(("eager", base, cand))
        _ratios(measured, "eager", base, cand)
    pick = pick_source([(src, c.backend) for src, _, c in pairs], judged)
    latency_backend = unmeasured_backend
    if pick is not None:
        _, b, c = pairs[pick]
        measured.update(latency_measured(b, c))
        latency_backend = c.backend
    if latency_backend is not None:
        backends["latency"] = latency_backend
    return latency_backend


# At most this share of the baseline's outputs may say nothing (flat images, empty or looping
# transcripts, silent inputs).
BASELINE_BROKEN_MAX = 0.5
# A float model's error rate cannot honestly pass this: more errors than reference words.
BASELINE_ERROR_MAX_POINTS = 100.0
BROKEN_NOTE = "the float model looks broken, so matching it proves nothing"


@dataclass(frozen=True)
class OutputCheck:
    """A check of what a model's outputs are, whatever the suite's thresholds: a float
    baseline that fails one is broken (FAIL, NOT JUDGED with ``--allow-broken-baseline``), a
    candidate that fails one is (FAIL).

    Attributes:
        key: the criterion's key.
        measured_key: the figure it reads (checked only when measured).
        label: the row's default label (the quality figures may give another).
        threshold: the largest value that passes.
        whose: ``baseline`` or ``candidate``.
        says: what a value past the threshold means, ``{value}`` and ``{label}`` filled in.
    """

    key: str
    measured_key: str
    label: str
    threshold: float
    whose: Literal["baseline", "candidate"]
    says: str


OUTPUT_CHECKS: tuple[OutputCheck, ...] = (
    OutputCheck("baseline_error_rate", "baseline_error_points", "baseline error rate (%)",
                BASELINE_ERROR_MAX_POINTS, "baseline",
                "{label}: {value:.1f}, more errors than the references have words (characters)"),
    OutputCheck("baseline_finite", "baseline_nan_share", "baseline outputs from NaN (share)", 0.0,
                "baseline", "{value:.0%} of the baseline's outputs were computed from NaN"),
    OutputCheck("candidate_finite", "candidate_nan_share", "candidate outputs from NaN (share)",
                0.0, "candidate", "{value:.0%} of the candidate's outputs were computed from NaN: "
                "the candidate is broken"),
    OutputCheck("baseline_sane", "baseline_broken_share",
                "baseline outputs empty, flat, one token repeated or of silent input (share)",
                BASELINE_BROKEN_MAX, "baseline",
                "{value:.0%} of the baseline's outputs are empty, flat or one token repeated, "
                "or of silent input"),
)  # fmt: skip


def output_criteria(
    measured: Mapping[str, float | None],
    labels: Mapping[str, str],
    backends: Mapping[str, str],
    allowed: bool,
) -> list[Criterion]:
    """The :data:`OUTPUT_CHECKS` whose figures were measured, judged on their point values:
    a baseline's past its threshold FAILS (NOT JUDGED when ``allowed``), a candidate's FAILS.

    Args:
        measured: the figures.
        labels: measured key -> the row's label, where the quality figures name it.
        backends: ``baseline`` / ``candidate`` -> where that model ran.
        allowed: ``--allow-broken-baseline``.
    """
    rows = []
    for check in OUTPUT_CHECKS:
        value = measured.get(check.measured_key)
        if value is None:
            continue
        label = labels.get(check.measured_key, check.label)
        # NaN (an unmeasurable figure) fails: a comparison with it would pass
        ok = not math.isnan(value) and value <= check.threshold
        note = "" if ok else check.says.format(value=value, label=label)
        status: Status = "PASS" if ok else "FAIL"
        if not ok and check.whose == "baseline":
            note += f": {BROKEN_NOTE}" + (
                " (allowed by --allow-broken-baseline)" if allowed
                else "; --allow-broken-baseline to judge the candidate anyway"
            )  # fmt: skip
            status = NOT_JUDGED if allowed else "FAIL"
        rows.append(Criterion(key=check.key, label=label, measured_key=check.measured_key,
                              value=value, threshold=check.threshold, comparator="<=",
                              status=status, backend=backends[check.whose], note=note))  # fmt: skip
    return rows


def _created() -> str:
    """Now, or ``SOURCE_DATE_EPOCH`` when set (the reproducible-builds convention), so that
    reruns on the same inputs can write byte-identical reports.

    Raises:
        ConfigError: ``SOURCE_DATE_EPOCH`` is not a time (:func:`source_date_epoch`).
    """
    epoch = source_date_epoch()
    when = (
        _dt.datetime.fromtimestamp(epoch, _dt.UTC)
        if epoch is not None
        else _dt.datetime.now(_dt.UTC)
    )
    return when.isoformat(timespec="seconds")


def _ratios(
    measured: dict[str, float | None], suffix: str, base: LatencyResult, cand: LatencyResult
) -> None:
    for key, value in latency_measured(base, cand).items():
        measured[f"{key}_{suffix}"] = value


def build_report(
    suite: Suite,
    quality: QualityResult,
    *,
    baseline_latency: LatencyResult | None = None,
    candidate_latency: LatencyResult | None = None,
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
    quality_backend: str = "cpu-reference",
    stages: dict[str, list[StageRow]] | None = None,
    top_modules: dict[str, list[ModuleTimeRow]] | None = None,
    stability: dict[str, StabilityResult] | None = None,
    onnxruntime: OrtSpeedResult | None = None,
    policy: dict[str, Any] | None = None,
    sensitivity: SensitivityReport | None = None,
    notes: Sequence[str] = (),
    created: str | None = None,
    target: Target | None = None,
    latency_plan: LatencyPlan | None = None,
    allow_broken_baseline: bool = False,
    baseline_backend: str = "cpu",
) -> AcceptanceReport:
    """Assemble the report: measured values, criteria, verdict, tables.

    The latency criteria read one pair of figures: the eager timing (``baseline_latency`` /
    ``candidate_latency``) or the ONNX Runtime one (``onnxruntime``), whichever is on a judged
    backend, else ONNX Runtime (:func:`~.gate.pick_source`). ``measured`` holds the ratios
    of each pair measured under ``*_eager`` / ``*_onnxruntime`` and the criteria's under the
    plain keys.

    Args:
        sensitivity: A :class:`~opsnn_quant.probe.report.SensitivityReport` (or None).
        created: Timestamp; default ``SOURCE_DATE_EPOCH`` if set, else now (UTC, ISO 8601).
            Pass ``""`` for reproducible output.
        target: The policy's target (None: unknown; no latency criterion is judged).
        latency_plan: What the run timed (:func:`~.gate.plan_latency`): its mode, the skipped
            measurements, and the backend of a latency criterion left unmeasured.
        allow_broken_baseline: A broken baseline (:data:`OUTPUT_CHECKS`) is reported, not
            failed.
        baseline_backend: Where the baseline ran (the baseline check's figure).
    """
    measured = dict(quality.measured)
    backends = {"quality": quality_backend}
    judged = judged_backends(target, suite.latency.enforce_backends)
    latency_backend = _latency_pair(
        measured, backends, judged, onnxruntime, (baseline_latency, candidate_latency),
        latency_plan.backend if latency_plan is not None else None,
    )  # fmt: skip
    latency_rows = []
    if baseline_latency is not None and candidate_latency is not None:
        latency_rows = [LatencyRow(label=baseline_label, result=baseline_latency),
                        LatencyRow(label=candidate_label, result=candidate_latency)]  # fmt: skip
    all_notes = list(quality.notes) + list(notes)
    for lat in (baseline_latency, candidate_latency):
        if lat is not None and lat.note and lat.note not in all_notes:
            all_notes.append(lat.note)
    why = "--latency none" if latency_plan is not None and latency_plan.mode == "none" else ""
    criteria = verdict(suite, measured, latency_backend=latency_backend, labels=quality.labels,
                       quality_backend=quality_backend, target=target,
                       unmeasured_why=why, intervals=quality.intervals,
                       samples=quality.samples)  # fmt: skip
    whose = {"baseline": baseline_backend, "candidate": quality_backend}
    whose_of = {c.key: c.whose for c in OUTPUT_CHECKS}
    for check in output_criteria(measured, quality.labels, whose, allow_broken_baseline):
        criteria.append(check)
        if check.status != "PASS":
            all_notes.append(f"{whose_of[check.key]} check: {check.note}")
    result = overall_verdict(criteria)
    if criteria and all(c.status == NOT_JUDGED for c in criteria):
        all_notes.append(NOTHING_JUDGED_NOTE)
    return AcceptanceReport(
        suite=suite.name,
        task=suite.task,
        baseline_label=baseline_label,
        candidate_label=candidate_label,
        created=_created() if created is None else created,
        verdict=result,
        target=None if target is None else target.name,
        criteria=criteria,
        backends=backends,
        measured=measured,
        quality=quality.quality,
        latency=latency_rows,
        latency_mode=latency_plan.mode if latency_plan is not None else "all",
        latency_skipped=list(latency_plan.skipped) if latency_plan is not None else [],
        latency_judged_on=sorted(judged),
        stages=stages or {},
        top_modules=top_modules or {},
        stability=stability or {},
        onnxruntime=onnxruntime,
        policy=policy,
        sensitivity=sensitivity_rows(sensitivity) if sensitivity is not None else [],
        image_pairs=quality.image_pairs,
        transcripts=quality.transcripts,
        notes=all_notes,
    )
