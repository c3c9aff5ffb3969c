"""``SliceScorer``: a suite's quality metrics on a small slice of its data, for a search.

The measured search of ``calibrate`` (:mod:`opsnn_quant.pipeline.measured`) scores many candidate
policies: the float model's outputs on the slice are generated once, each candidate's are scored
against them with the suite's own metrics (:class:`~.evaluate.QualityInputs`) and judged against
the user's bounds with :func:`~.runner.verdict`, the rule the acceptance report applies.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from opsnn_quant.backends.devices import backend_label
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.evaluate import QualityInputs, apply_generation, generate_outputs
from opsnn_quant.evaluation.report import Criterion
from opsnn_quant.evaluation.runner import THRESHOLDS, verdict
from opsnn_quant.evaluation.sequential import (
    ALPHA,
    Rate,
    delta_interval,
    early_verdict,
    looks,
    utterance_errors,
)
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.thresholds import Thresholds

# The bounds a speech slice can decide early (:mod:`.sequential`): each a delta of a rate.
SEQUENTIAL: dict[str, Rate] = {"wer_delta_max_points": "wer", "cer_delta_max_points": "cer"}

# Per task, the measured figure of closeness to the float model's outputs, and its direction:
# the words that differ from the float transcripts; the median PSNR against the float images.
FIDELITY: dict[str, tuple[str, Literal["<=", ">="]]] = {
    "asr": ("agreement_wer_points", "<="),
    "t2i": ("psnr_median_db", ">="),
}


@dataclass(frozen=True)
class SliceScore:
    """One candidate's figures on the slice.

    Attributes:
        measured: the suite's measured keys (e.g. ``wer_delta_points``) -> value.
        criteria: one row per bound, PASS or FAIL.
        passed: every bound holds.
        quality: the bounds' figures in their order, then the task's closeness to the float
            outputs (:data:`FIDELITY`), each signed so that larger is better
            (``-wer_delta_points``, ``-agreement_wer_points``): what ranks two candidates of
            equal coverage.
    """

    measured: dict[str, float | None]
    criteria: list[Criterion]
    passed: bool
    quality: tuple[float, ...]
    early: str | None = None  # how the verdict was reached before the whole slice

    def describe(self) -> str:
        """The bounds' figures in one phrase, e.g. ``wer_delta_points +0.42 (<= 0.5)``."""
        figures = ", ".join(
            f"{c.measured_key} {_figure(c.measured_key, c.value)} ({c.comparator} {c.threshold:g})"
            for c in self.criteria
        )
        return f"{figures}; {self.early}" if self.early else figures


def _figure(key: str, value: float | None) -> str:
    """A figure as printed: differences signed (``+0.45``), levels plain (``40.8``)."""
    if value is None:
        return "n/a"
    return f"{value:+.4g}" if "delta" in key else f"{value:.4g}"


class SliceScorer:
    """Scores candidates with a suite's metrics on ``records`` (a slice of data).

    Args:
        baseline: the float model (its settings take the suite's generation settings).
        suite: the suite whose generation settings and metrics are used.
        bounds: the user's bounds (suite threshold names), judged instead of the suite's.
        records: the slice (e.g. :func:`~.evaluate.suite_records` after the suite's samples).
        allow_pickle: as :func:`~.evaluate.evaluate`'s (the suite's CLIP).

    Raises:
        ConfigError: bad bounds, or a task the model does not have.
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
        problem = bounds.quality_problem()
        if problem:
            raise ConfigError(f"budget.metric {problem}")
        if baseline.task and baseline.task != suite.task:
            raise ConfigError(
                f"budget.metric: suite {suite.name} is a {suite.task} suite, but "
                f"{baseline.model_id} is a {baseline.task} model"
            )
        self.suite = suite
        self.judged = suite.model_copy(
            update={"metrics": suite.metrics.model_copy(update={"thresholds": bounds.bounds()})}
        )
        apply_generation(baseline, suite)
        self.inputs = QualityInputs.load(suite, baseline, records, allow_pickle)
        self.baseline: list[Any] = generate_outputs(baseline, suite, self.inputs.inputs)

    @property
    def size(self) -> int:
        """Inputs in the slice."""
        return len(self.inputs.inputs)

    def score(self, candidate: ModelAdapter) -> SliceScore:
        """``candidate``'s figures on the slice, judged against the bounds; a speech slice
        whose bounds are all WER/CER deltas is transcribed in groups and its measurement ends
        as soon as the delta's interval decides every bound (:mod:`.sequential`)."""
        apply_generation(candidate, self.suite)
        rates = self._sequential_rates()
        ends = looks(self.size) if rates else [self.size]
        outputs: list[Any] = []
        for end in ends:
            outputs += generate_outputs(
                candidate, self.suite, self.inputs.inputs[len(outputs) : end]
            )
            if end < self.size and rates:
                early = self._early(candidate, outputs, rates, level=1 - ALPHA / (len(ends) - 1))
                if early is not None:
                    return early
        return self._judge(candidate, self.inputs, self.baseline, outputs)

    def _judge(
        self,
        candidate: ModelAdapter,
        inputs: QualityInputs,
        baseline: list[Any],
        outputs: list[Any],
    ) -> SliceScore:
        measured = inputs.quality(baseline, outputs).measured
        rows = verdict(self.judged, measured, quality_backend=backend_label(candidate.device))
        passed = all(r.status == "PASS" for r in rows)
        return SliceScore(measured, rows, passed, _quality(rows, measured, self.suite.task))

    def _sequential_rates(self) -> dict[str, tuple[Rate, float]]:
        """Bound name -> (rate, bound) when every bound is a WER/CER delta on a speech slice
        (the figures a paired interval is computed for); empty otherwise."""
        if self.suite.task != "asr":
            return {}
        bounds = self.judged.metrics.thresholds
        names = bounds.set_names()
        if not names or not names <= set(SEQUENTIAL):
            return {}
        return {n: (SEQUENTIAL[n], float(getattr(bounds, n))) for n in sorted(names)}

    def _early(
        self,
        candidate: ModelAdapter,
        outputs: list[Any],
        rates: dict[str, tuple[Rate, float]],
        level: float,
    ) -> SliceScore | None:
        """The score on the first ``len(outputs)`` utterances if their intervals decide every
        bound (a FAIL decides alone), else None."""
        n = len(outputs)
        refs, base = self.inputs.references[:n], self.baseline[:n]
        decided, spans = [], []
        for name, (rate, bound) in rates.items():
            delta, low, high = delta_interval(
                utterance_errors(refs, base, rate), utterance_errors(refs, outputs, rate), level
            )
            decided.append(early_verdict(low, high, bound))
            spans.append(
                f"{name.replace('_max_points', '')} {delta:+.3g} [{low:+.3g}, {high:+.3g}]"
            )
        if False not in decided and None in decided:
            return None
        part = dataclasses.replace(
            self.inputs, records=self.inputs.records[:n], inputs=self.inputs.inputs[:n],
            references=refs,
        )  # fmt: skip
        score = self._judge(candidate, part, base, outputs)
        note = (
            f"decided after {n} of {self.size} utterances: {', '.join(spans)} "
            f"({level:.1%} paired bootstrap)"
        )
        return dataclasses.replace(score, passed=False not in decided, early=note)


def _quality(
    rows: list[Criterion], measured: dict[str, float | None], task: str
) -> tuple[float, ...]:
    """Each bound's figure signed so that larger is better (an unmeasured one: worst), then the
    task's closeness to the float outputs (:data:`FIDELITY`), which breaks the ties a coarse
    metric leaves (one word more or less is the same WER delta for many candidates)."""
    figures = [(r.value, THRESHOLDS[r.key][1]) for r in rows]
    if task in FIDELITY:
        key, comparator = FIDELITY[task]
        figures.append((measured.get(key), comparator))
    out = []
    for value, comparator in figures:
        if value is None or math.isnan(value):
            out.append(-math.inf)
        else:
            out.append(-value if comparator == "<=" else value)
    return tuple(out)
