"""``SliceScorer``: a suite's quality metrics on a small slice of its data, for a search.

The measured search of ``calibrate`` (:mod:`opsnn_quant.pipeline.measured`) scores many candidate
policies: the float model's outputs on the slice are generated once each (only as far as a
candidate needed them), each candidate's are scored against them with the suite's own metrics
(:class:`~.evaluate.QualityInputs`) and judged on their paired bootstrap intervals against the
user's bounds with :func:`~.runner.verdict`, the rule the acceptance report applies.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from opsnn_quant.backends.devices import backend_label
from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.evaluate import QualityInputs, generate_outputs, generation_of
from opsnn_quant.evaluation.metrics import Comparator
from opsnn_quant.evaluation.registry import bounded_by, budget_problem, check_task, metric, task
from opsnn_quant.evaluation.report import Criterion, Status
from opsnn_quant.evaluation.runner import verdict
from opsnn_quant.evaluation.sequential import (
    MIN_PASS,
    Rate,
    delta_interval,
    levels,
    looks,
    utterance_errors,
)
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.models.base import ModelAdapter


@dataclass(frozen=True)
class SliceScore:
    """One candidate's figures on the slice.

    Attributes:
        measured: the suite's measured keys (e.g. ``wer_delta_points``) -> value.
        criteria: one row per bound, PASS or FAIL.
        passed: every bound holds.
        quality: the bounds' figures in their order, then the task's closeness to the float
            outputs (:attr:`~.tasks.Task.fidelity`), each signed so that larger is better
            (``-wer_delta_points``, ``-agreement_wer_points``): what ranks two candidates of
            equal coverage.
    """

    measured: dict[str, float | None]
    criteria: list[Criterion]
    passed: bool
    quality: tuple[float, ...]
    early: str | None = None  # how the verdict was reached before the whole slice
    status: Status = "PASS"  # PASS, FAIL, or INCONCLUSIVE (not a pass) on the intervals

    def describe(self) -> str:
        """The bounds' figures with their intervals in one phrase, e.g.
        ``wer_delta_points +0.42 [-0.2, +0.48] (<= 0.5, 98.8%)``, then how it was decided."""
        text = ", ".join(_criterion(c) for c in self.criteria)
        if self.status == "INCONCLUSIVE":
            text += "; INCONCLUSIVE on the whole slice: not a pass"
        return f"{text}; {self.early}" if self.early else text


def _criterion(c: Criterion) -> str:
    """One criterion as described: figure, interval, bound and level, and why undecided."""
    figure = f"{c.measured_key} {_figure(c.measured_key, c.value)}"
    if c.ci_low is None or c.ci_high is None:
        return f"{figure} ({c.comparator} {c.threshold:g})"
    span = f"[{_figure(c.measured_key, c.ci_low)}, {_figure(c.measured_key, c.ci_high)}]"
    level = f", {c.ci_level:.1%}" if c.ci_level is not None else ""
    text = f"{figure} {span} ({c.comparator} {c.threshold:g}{level})"
    if c.status == "INCONCLUSIVE" and c.samples_to_decide is not None:
        text += f", about {c.samples_to_decide} samples would decide it"
    return text


def _figure(key: str, value: float | None) -> str:
    """A figure as printed: differences signed (``+0.45``), levels plain (``40.8``)."""
    if value is None:
        return "n/a"
    return f"{value:+.4g}" if metric(key).signed else f"{value:.4g}"


class SliceScorer:
    """Scores candidates with a suite's metrics on ``records`` (a slice of data).

    A candidate passes only when the interval of every bound's figure meets it, at the level
    of :func:`~.sequential.levels` (the suite's ``metrics.confidence`` shared by the looks). A
    speech slice whose bounds are all WER/CER deltas is transcribed in groups and looked at
    after each (:mod:`.sequential`); any other slice is judged once, whole. The float model's
    outputs are generated only as far as a candidate needed them: those of the first look when
    the scorer is built, the rest when a candidate goes on to a later look.

    Args:
        baseline: the float model, kept for the float outputs of later looks (no copy: a
            calibrate run goes on with the same model); it generates with the suite's
            generation settings, its own restored after each look.
        suite: the suite whose generation settings and metrics are used.
        bounds: the user's bounds (suite threshold names), judged instead of the suite's.
        records: the slice (e.g. :func:`~.evaluate.suite_records` after the suite's samples).
        allow_pickle: as :func:`~.evaluate.evaluate`'s (the suite's CLIP).

    Raises:
        ConfigError: bad bounds, a task the model does not have, or records without what a
            bound reads (:func:`~.registry.records_problem`).
    """

    def __init__(
        self,
        baseline: ModelAdapter,
        suite: Suite,
        bounds: Thresholds,
        records: list[dict[str, Any]],
        *,
        allow_pickle: bool = False,
    ) -> None:
        problem = budget_problem(bounds, suite.task)
        if problem:
            raise ConfigError(problem)
        check_task(suite, baseline, "budget.metric: ")
        self.suite = suite
        self.judged = suite.model_copy(
            update={"metrics": suite.metrics.model_copy(update={"thresholds": bounds.bounds()})}
        )
        with generation_of(baseline, suite):
            # the judged suite: the slice's records must hold what the user's bounds read
            self.inputs = QualityInputs.load(self.judged, baseline, records, allow_pickle)
        self.rates = self._sequential_rates()
        self.ends = looks(self.size) if self.rates else [self.size]
        self.level, self.futility = levels(len(self.ends), suite.metrics.confidence)
        self._float = baseline
        self.baseline: list[Any] = []
        self._extend_float(self.ends[0])

    @property
    def size(self) -> int:
        """Inputs in the slice."""
        return len(self.inputs.inputs)

    def _extend_float(self, end: int) -> None:
        """The float outputs of the first ``end`` inputs (generated once each)."""
        if len(self.baseline) >= end:
            return
        with generation_of(self._float, self.suite):
            self.baseline += generate_outputs(
                self._float, self.suite, self.inputs.inputs[len(self.baseline) : end]
            )

    def score(self, candidate: ModelAdapter) -> SliceScore:
        """``candidate``'s figures on the slice, judged on their intervals against the bounds;
        a sequential slice ends as soon as a look decides (:mod:`.sequential`)."""
        outputs: list[Any] = []
        for end in self.ends:
            with generation_of(candidate, self.suite):
                outputs += generate_outputs(
                    candidate, self.suite, self.inputs.inputs[len(outputs) : end]
                )
            self._extend_float(end)
            score = self._look(candidate, outputs, last=end == self.size)
            if score is not None:
                return score
        raise AssertionError("the last look always decides")  # pragma: no cover

    def _look(
        self, candidate: ModelAdapter, outputs: list[Any], *, last: bool
    ) -> SliceScore | None:
        """The score on the first ``len(outputs)`` inputs when it is decided (PASS or FAIL on
        the intervals, or a futility stop), or at the last look; None: look again."""
        n = len(outputs)
        part = dataclasses.replace(
            self.inputs, records=self.inputs.records[:n], inputs=self.inputs.inputs[:n],
            references=self.inputs.references[:n],
        )  # fmt: skip
        base = self.baseline[:n]
        result = part.quality(base, outputs, confidence=self.level)
        rows = verdict(
            self.judged, result.measured, quality_backend=backend_label(candidate.device),
            intervals=result.intervals, samples=n,
        )  # fmt: skip
        statuses = {r.status for r in rows}
        status: Status = (
            "FAIL" if "FAIL" in statuses else "PASS" if statuses == {"PASS"} else "INCONCLUSIVE"
        )
        where = f"{n} of {self.size} {self._unit}"
        note = None
        if status == "PASS" and not last and self.rates and n < MIN_PASS:
            return None  # too few to see a harm they did not draw (sequential.MIN_PASS)
        if status == "INCONCLUSIVE" and not last:
            note = self._futile(part.references, base, outputs)
            if note is None:
                return None
            status = "FAIL"
            note = f"cannot pass after {where}: {note}"
        elif not last:
            note = f"decided after {where}"
        fidelity = metric(task(self.suite.task).fidelity(self.suite))
        quality = _quality(rows, result.measured, fidelity.key, fidelity.comparator)
        return SliceScore(result.measured, rows, status == "PASS", quality, note, status)

    @property
    def _unit(self) -> str:
        return task(self.suite.task).unit

    def _futile(self, refs: list[str], base: list[Any], outputs: list[Any]) -> str | None:
        """Why an undecided look stops for futility: a bound's one-sided lower bound at the
        futility level lies beyond it (None: none does)."""
        tail = (1 + self.futility) / 2
        for key, (rate, bound) in self.rates.items():
            norm = self.suite.text_norm()
            _, low, _ = delta_interval(
                utterance_errors(refs, base, rate, norm),
                utterance_errors(refs, outputs, rate, norm),
                self.futility,
            )  # fmt: skip
            if low > bound:
                return f"the {tail:.1%} lower bound of {key} is {low:+.3g} > {bound:g} (futility)"
        return None

    def _sequential_rates(self) -> dict[str, tuple[Rate, float]]:
        """Measured key -> (rate, bound) when every bound is a WER/CER delta (a speech slice's,
        :attr:`~.metrics.Metric.rate`: the figures a paired interval is computed for); empty
        otherwise."""
        bounds = self.judged.metrics.thresholds
        rates: dict[str, tuple[Rate, float]] = {}
        for name in sorted(bounds.set_names()):
            found = bounded_by(name)
            if found is None or found.rate is None:
                return {}
            rates[found.key] = (found.rate, float(bounds.get(name) or 0.0))
        return rates


def _quality(
    rows: list[Criterion],
    measured: dict[str, float | None],
    fidelity: str,
    comparator: Comparator,
) -> tuple[float, ...]:
    """Each bound's figure signed so that larger is better (an unmeasured one: worst), then the
    task's closeness to the float outputs (``fidelity``, a measured key, and its
    ``comparator``: :attr:`~.tasks.Task.fidelity`), which breaks the ties a coarse metric
    leaves (one word more or less is the same WER delta for many candidates)."""
    figures = [(r.value, r.comparator) for r in rows]
    figures.append((measured.get(fidelity), comparator))
    out = []
    for value, comparator in figures:
        if value is None or math.isnan(value):
            out.append(-math.inf)
        else:
            out.append(-value if comparator == "<=" else value)
    return tuple(out)
