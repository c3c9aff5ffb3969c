"""The metric table: one :class:`Metric` per figure a suite can bound.

A metric is one object: its key (the figure in the report's ``measured``), the tasks whose
outputs it is measured on, how it is computed from them, how it decomposes into per-sample
values for its paired bootstrap interval (:mod:`.intervals`), its comparator, the suite threshold
that bounds it with the values that bound may take and a typical one, and how the report names
it. Suites (:mod:`.suite`), recipes' ``budget.metric``, the criteria (:mod:`.runner`), the
quality figures (:mod:`.quality`) and the measured search (:mod:`.slice_scorer`) read the table;
none names a metric. :func:`register_metric` adds one (the built-in ones are registered by their
task's module, :mod:`.t2i`, :mod:`.t2v`, :mod:`.asr`, and by :mod:`.speed`; :mod:`.registry` holds the
lookups)::

    register_metric(Metric(
        key="pixel_mae", tasks=frozenset({"t2i"}), comparator="<=",
        label="mean absolute pixel difference vs baseline",
        per_sample=lambda c: [float(np.abs(b - a).mean()) for a, b in zip(c.baseline, c.candidate)],
    ))  # bounded by a suite's ``pixel_mae_max``

What a metric reads is its task's :class:`Compared`: both models' outputs in the suite's order,
and what the task computed from them once (image pairs' PSNR, CLIP scores, error counts ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.intervals import Interval, unit_bootstrap
from opsnn_quant.evaluation.sequential import Rate

if TYPE_CHECKING:
    from opsnn_quant.evaluation.suite_schema import SuiteSpec

Comparator = Literal["<=", ">="]


@dataclass(frozen=True)
class Compared:
    """Both models' outputs on a suite's inputs, and what their task computed from them once:
    what every metric of the task reads (a task's own subclass adds its shared figures).

    Attributes:
        baseline, candidate: the outputs, in the suite's order: one per unit and repeat,
            repeat-major (every unit's first output, then every unit's second, ...).
        units: the samples a figure is over and its interval resamples (prompts, with every
            seed's image; utterances): output ``i`` belongs to unit ``i % units``.
    """

    baseline: Any
    candidate: Any
    units: int


@dataclass(frozen=True)
class Range:
    """The values a bound may take (None: unbounded on that side)."""

    low: float | None = None
    high: float | None = None
    low_excluded: bool = False

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range (None: in range), worded as the schema's checks."""
        if self.low is not None and self.low_excluded and not value > self.low:
            return f"Input should be greater than {self.low:g}"
        if self.low is not None and not value >= self.low:
            return f"Input should be greater than or equal to {self.low:g}"
        if self.high is not None and not value <= self.high:
            return f"Input should be less than or equal to {self.high:g}"
        return None


def mean_of_drawn(drawn: np.ndarray) -> np.ndarray:
    """The mean of each resample's drawn per-sample values (a row each)."""
    return np.mean(drawn, axis=1)


@dataclass(frozen=True)
class Metric:
    """One figure a suite can bound.

    Attributes:
        key: the figure's name in the report's ``measured`` (``psnr_median_db``).
        tasks: the tasks whose outputs it is measured on (None: every task's, e.g. latency).
        comparator: ``<=`` (the figure may be at most the bound) or ``>=``.
        label: the criterion row's name in the report (the units in it: ``(dB)``).
        bound: the suite threshold that bounds it; default the key and ``_max`` (``<=``) or
            ``_min`` (``>=``).
        default_bound: a typical bound, where a new suite starts (the templates' value); the
            example in messages. None: none.
        bound_range: the values the bound may take.
        compute: the figure from the task's :class:`Compared` (None: not measurable here,
            e.g. a CLIP score without a CLIP); default: ``statistic`` of every per-sample value.
        per_sample: the figure's per-sample values (one per output, in the outputs' order),
            the decomposition its interval resamples by unit (:func:`~.intervals.unit_bootstrap`).
        statistic: the figure from drawn per-sample values: ``resamples x drawn`` to one value
            per resample (default: their mean).
        interval: the interval at a level, for a figure whose decomposition is not a
            statistic of per-sample values (a corpus rate's ratio of sums, KID's pairs);
            default: ``statistic`` over resamples of ``per_sample``; neither: a set statistic
            (a Fréchet distance), judged on its value.
        label_of: the row's name for one comparison (e.g. naming the feature space).
        requires: what a suite bounding the metric must also set: a suite -> the problem (None:
            fine). A ``{names}`` in it lists every bound with the same problem.
        requires_records: what the suite's records must hold for the metric (a label column,
            e.g. a video's motion): the records -> the problem (None: fine), worded as
            ``requires``'. Checked once the records are loaded, before anything is generated
            (:func:`~.registry.records_problem`).
        speed: a speed figure, not a quality one: measured by timing, judged only on the
            target's own backend (:mod:`.gate`); a slice of quality measurements cannot bound
            it.
        signed: a difference (candidate - baseline), printed with its sign in the search's
            lines.
        rate: the error rate (``wer``, ``cer``) whose delta the figure is: a measured search
            bounded by such deltas only looks at its slice every few utterances
            (:mod:`.sequential`).
    """

    key: str
    tasks: frozenset[str] | None
    comparator: Comparator
    label: str
    bound: str = ""
    default_bound: float | None = None
    bound_range: Range = field(default_factory=Range)
    compute: Callable[[Any], float | None] | None = None
    per_sample: Callable[[Any], Sequence[float] | None] | None = None
    statistic: Callable[[np.ndarray], np.ndarray] = mean_of_drawn
    interval: Callable[[Any, float], Interval | None] | None = None
    label_of: Callable[[Any], str] | None = None
    requires: Callable[[SuiteSpec], str | None] | None = None
    requires_records: Callable[[Sequence[dict[str, Any]]], str | None] | None = None
    speed: bool = False
    signed: bool = False
    rate: Rate | None = None

    def __post_init__(self) -> None:
        if self.tasks is not None:  # any collection of names will do
            object.__setattr__(self, "tasks", frozenset(self.tasks))
        if not self.bound:
            suffix = "_max" if self.comparator == "<=" else "_min"
            object.__setattr__(self, "bound", self.key + suffix)

    def applies_to(self, task: str) -> bool:
        """Whether the metric is measured on ``task``'s outputs."""
        return self.tasks is None or task in self.tasks

    def value(self, compared: Compared) -> float | None:
        """The figure on ``compared`` (None: not measurable there)."""
        if self.compute is not None:
            return self.compute(compared)
        values = None if self.per_sample is None else self.per_sample(compared)
        if values is None or len(values) == 0:
            return None
        return float(self.statistic(np.asarray(values, dtype=np.float64)[None, :])[0])

    def interval_at(self, compared: Compared, level: float) -> Interval | None:
        """The figure's paired bootstrap interval at ``level`` (None: it has none)."""
        if self.interval is not None:
            return self.interval(compared, level)
        values = None if self.per_sample is None else self.per_sample(compared)
        if values is None:
            return None
        return unit_bootstrap(values, compared.units, self.statistic, level)


TABLE: dict[str, Metric] = {}  # key -> metric, in registration order (the criteria's order)


def register_metric(metric: Metric) -> Metric:
    """Add ``metric`` to the table; it is measured on its tasks' outputs from then on and its
    bound is a threshold suites may set.

    Raises:
        ConfigError: its key or bound is another metric's.
    """
    for other in TABLE.values():
        if metric.key in (other.key, other.bound) or metric.bound in (other.key, other.bound):
            raise ConfigError(
                f"metric {metric.key} (bound {metric.bound}): the key or bound of metric "
                f"{other.key} (bound {other.bound}) is taken"
            )
    TABLE[metric.key] = metric
    return metric


def unregister_metric(key: str) -> None:
    """Remove the metric ``key`` (a test's, or a plug-in's being replaced); no such metric:
    nothing."""
    TABLE.pop(key, None)
