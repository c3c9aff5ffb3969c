"""Paired bootstrap intervals of the acceptance report's figures (issue 44): the machinery.

Each interval resamples the samples a figure is made of (its task's units: utterances, or
prompts with all their seeds' images) with replacement, baseline and candidate together, and
recomputes the figure on every resample; the percentile interval at the suite's
``metrics.confidence`` is the report's ``[ci_low, ci_high]``. How a figure decomposes is its
metric's (:class:`~.metrics.Metric`): a statistic of per-output values (median PSNR, mean
SSIM, the CLIP-score delta: :func:`unit_bootstrap`), a corpus rate's ratio of sums (WER/CER
deltas, agreement: :func:`~.sequential.delta_interval`), or KID's U-statistic over pairs of
prompts (:func:`~.kid.kid_delta`, whose resamples leave out the pairs of draws that are copies
of one prompt). A Fréchet distance is a statistic of the whole set (its means and covariances)
with no per-sample decomposition: it gets no interval and is judged on its point estimate. The
draws are seeded (:data:`~.sequential.SEED`), so the same outputs give the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from opsnn_quant.evaluation.sequential import RESAMPLES, SEED

DEFAULT_CONFIDENCE = 0.95  # a suite's metrics.confidence: the level of each figure's interval

NO_INTERVAL_NOTE = (
    "no interval: a set statistic with no per-sample decomposition, judged on its point estimate"
)


class Interval(BaseModel):
    """A figure's bootstrap interval: ``[low, high]`` at ``level`` from ``n`` samples."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")

    low: float
    high: float
    level: float
    n: int


def draw_groups(groups: int, resamples: int = RESAMPLES, *, stream: int = 0) -> np.ndarray:
    """The seeded bootstrap draws: ``resamples x groups`` indices, each resample drawing
    ``groups`` of them with replacement. Stream 0 is every interval's draws of the prompts or
    utterances (the same indices for every figure of a report); another stream gives draws
    independent of those (e.g. of reference images that are not one per prompt)."""
    rng = np.random.default_rng(SEED if stream == 0 else (SEED, stream))
    return rng.integers(0, groups, size=(resamples, groups))


def percentile_interval(stats: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval at ``level`` of the resamples' statistics. Infinite statistics
    (identical images' PSNR) stay infinite; NaN ones (a resample the statistic is undefined
    on) are left out."""
    values = np.asarray(stats, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return math.nan, math.nan
    big = np.finfo(np.float64).max
    finite = np.clip(values, -big, big)  # quantiles interpolate: inf - inf would be NaN
    tail = (1.0 - level) / 2
    low, high = (float(x) for x in np.quantile(finite, [tail, 1.0 - tail]))
    return _unclip(low, big), _unclip(high, big)


def group_bootstrap(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    level: float,
    *,
    resamples: int = RESAMPLES,
) -> tuple[float, float]:
    """Percentile interval of ``statistic`` over resamples of the rows of ``values``
    (``groups x members x ...``): each resample draws whole groups with replacement
    (:func:`draw_groups`), and ``statistic`` maps the ``resamples x drawn samples x ...``
    array to one value per resample (:func:`percentile_interval`)."""
    groups = values.shape[0]
    drawn = values[draw_groups(groups, resamples)]  # resamples x groups x members x ...
    drawn = drawn.reshape(resamples, -1, *values.shape[2:])
    return percentile_interval(np.asarray(statistic(drawn), dtype=np.float64), level)


def _unclip(x: float, big: float) -> float:
    return math.inf if x >= big else -math.inf if x <= -big else x


def by_unit(values: Sequence[float], units: int) -> np.ndarray:
    """Per-output values (repeat-major: every unit's first output, then the next: every prompt
    for the first seed, then the next) as ``units x repeats``: one resampling unit a row."""
    arr = np.asarray(values, dtype=np.float64)
    return arr.reshape(-1, units).T


def unit_bootstrap(
    values: Sequence[float],
    units: int,
    statistic: Callable[[np.ndarray], np.ndarray],
    level: float = DEFAULT_CONFIDENCE,
    *,
    resamples: int = RESAMPLES,
) -> Interval | None:
    """The interval of a figure that is ``statistic`` of per-output ``values``, each unit
    resampled with all of its outputs (``units`` divides their count; outputs in the
    repeat-major order a suite generates them in); None when they are not whole units."""
    n = len(values)
    if n == 0 or units <= 0 or n % units:
        return None
    low, high = group_bootstrap(by_unit(values, units), statistic, level, resamples=resamples)
    return Interval(low=low, high=high, level=level, n=units)


def samples_to_decide(interval: Interval, threshold: float) -> int | None:
    """Samples that would likely decide an undecided criterion: the interval's half-width
    shrinks as 1/sqrt(n), so about ``n (half-width / distance)^2`` samples make it clear the
    threshold, with ``distance`` from the interval's middle to the threshold. None when the
    middle sits on the threshold (no sample count decides it) or the interval is not finite."""
    half = (interval.high - interval.low) / 2
    middle = (interval.high + interval.low) / 2
    distance = abs(middle - threshold)
    if not (math.isfinite(half) and math.isfinite(middle)) or distance <= 0:
        return None
    return max(interval.n + 1, math.ceil(interval.n * (half / distance) ** 2))


def judge(
    interval: Interval, threshold: float, comparator: str
) -> tuple[Literal["PASS", "FAIL", "INCONCLUSIVE"], int | None]:
    """PASS when the whole interval meets ``value comparator threshold``, FAIL when none of it
    does, else INCONCLUSIVE with :func:`samples_to_decide`."""
    low, high = interval.low, interval.high
    if comparator == "<=":
        if high <= threshold:
            return "PASS", None
        if low > threshold:
            return "FAIL", None
    else:
        if low >= threshold:
            return "PASS", None
        if high < threshold:
            return "FAIL", None
    return "INCONCLUSIVE", samples_to_decide(interval, threshold)
