"""Paired bootstrap intervals of the acceptance report's quality figures (issue 44).

Each interval resamples the samples the figure is made of (utterances, or prompts with all
their seeds' images) with replacement, baseline and candidate together, and recomputes the
figure on every resample: WER/CER deltas and agreement WER as corpus ratios of sums
(:func:`~.sequential.delta_interval`), median PSNR, mean SSIM and the CLIP-score delta as the
statistic of the drawn prompts' values. The percentile interval at the suite's
``metrics.confidence`` is the report's ``[ci_low, ci_high]``. The draws are seeded
(:data:`~.sequential.SEED`), so the same outputs give the same bytes.

A Fréchet distance is a statistic of the whole set (its means and covariances) with no
per-sample decomposition: it gets no interval and is judged on its point estimate. KID, the
distribution criterion, is a U-statistic over pairs of prompts: its interval
(:func:`~.kid.kid_delta`) resamples the same prompts, and each resample's estimate leaves out
the pairs of draws that are copies of one prompt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from opsnn_quant.evaluation.sequential import (
    RESAMPLES,
    SEED,
    Errors,
    delta_interval,
    utterance_errors,
)
from opsnn_quant.evaluation.suite import DEFAULT_CONFIDENCE
from opsnn_quant.evaluation.text_norm import Normalize

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


def asr_intervals(
    references: Sequence[str],
    baseline_texts: Sequence[str],
    candidate_texts: Sequence[str],
    level: float = DEFAULT_CONFIDENCE,
    *,
    normalize: Normalize = True,
    resamples: int = RESAMPLES,
) -> dict[str, Interval]:
    """Intervals of ``wer_delta_points``, ``cer_delta_points``, ``agreement_wer_points`` and
    ``agreement_cer_points`` (in points), each utterance resampled with its baseline and
    candidate errors."""
    n = len(references)
    out: dict[str, Interval] = {}
    if n == 0:
        return out
    for key, rate in (("wer_delta_points", "wer"), ("cer_delta_points", "cer")):
        base = utterance_errors(references, baseline_texts, rate, normalize)  # type: ignore[arg-type]
        cand = utterance_errors(references, candidate_texts, rate, normalize)  # type: ignore[arg-type]
        _, low, high = delta_interval(base, cand, level, resamples=resamples)
        out[key] = Interval(low=low, high=high, level=level, n=n)
    # Agreement WER: the candidate's errors against the baseline's transcripts, whose words
    # are the denominator; a zero-error "baseline" makes delta_interval the plain ratio.
    agree = utterance_errors(baseline_texts, candidate_texts, "wer", normalize)
    zero = Errors(tuple(0 for _ in agree.errors), agree.lengths)
    _, low, high = delta_interval(zero, agree, level, resamples=resamples)
    out["agreement_wer_points"] = Interval(low=low, high=high, level=level, n=n)
    agree = utterance_errors(baseline_texts, candidate_texts, "cer", normalize)
    zero = Errors(tuple(0 for _ in agree.errors), agree.lengths)
    _, low, high = delta_interval(zero, agree, level, resamples=resamples)
    out["agreement_cer_points"] = Interval(low=low, high=high, level=level, n=n)
    return out


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


def _by_prompt(values: Sequence[float], prompts: int) -> np.ndarray:
    """Per-image values (seed-major: every prompt for the first seed, then the next) as
    ``prompts x seeds``: one resampling unit per prompt."""
    arr = np.asarray(values, dtype=np.float64)
    return arr.reshape(-1, prompts).T


def image_intervals(
    psnr_db: Sequence[float],
    ssim: Sequence[float],
    prompts: int,
    level: float = DEFAULT_CONFIDENCE,
    *,
    clip_baseline: Sequence[float] | None = None,
    clip_candidate: Sequence[float] | None = None,
    resamples: int = RESAMPLES,
) -> dict[str, Interval]:
    """Intervals of ``psnr_median_db`` (median of the pairs' PSNR), ``ssim_mean`` and, with
    both CLIP scores per image, ``clip_score_delta`` (mean candidate - baseline), each prompt
    resampled with all of its images (``prompts`` divides the image count; images in the
    seed-major order the evaluation generates them in)."""
    n = len(psnr_db)
    if n == 0 or prompts <= 0 or n % prompts:
        return {}
    out: dict[str, Interval] = {}

    def put(key: str, values: Sequence[float], stat: Callable[[np.ndarray], np.ndarray]) -> None:
        low, high = group_bootstrap(_by_prompt(values, prompts), stat, level, resamples=resamples)
        out[key] = Interval(low=low, high=high, level=level, n=prompts)

    put("psnr_median_db", psnr_db, lambda d: np.median(d, axis=1))
    put("ssim_mean", ssim, lambda d: np.mean(d, axis=1))
    if clip_baseline is not None and clip_candidate is not None:
        diff = np.asarray(clip_candidate, dtype=np.float64) - np.asarray(clip_baseline)
        put("clip_score_delta", list(diff), lambda d: np.mean(d, axis=1))
    return out


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
