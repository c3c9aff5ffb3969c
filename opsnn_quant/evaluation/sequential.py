"""Sequential judging of a speech candidate: the paired bootstrap interval of its WER/CER
delta, looked at every few utterances of a slice.

The measured search of ``calibrate`` (:mod:`opsnn_quant.evaluation.slice_scorer` applies these
rules) transcribes a candidate and the float model in groups and stops at the first look that
decides; a candidate passes a bound only when its interval does, as in the acceptance report.

* Looks (:func:`looks`): after ``LOOK_EVERY // 2`` utterances, then every :data:`LOOK_EVERY`,
  the last one the whole slice.
* Interval (:func:`delta_interval`): the candidate's corpus rate (total errors / total
  reference length, :func:`utterance_errors`) minus the float model's, in points; paired
  percentile bootstrap (utterances drawn with replacement with both models' errors, both sums
  recomputed), seeded (:data:`SEED`): the same outputs give the same verdict.
* Levels (:func:`levels`): ``1 - alpha / n_looks`` to decide (Bonferroni over every look, the
  last included; ``alpha = 1 - metrics.confidence``), the one-sided ``1 - beta / (n_looks - 1)``
  lower bound for futility at the early looks.
* Verdict at a look: wholly within the bound PASS, wholly beyond it FAIL; at an early look, a
  futility lower bound beyond the bound FAILS (non-binding, as in group-sequential trials); at
  the last, across the bound is INCONCLUSIVE, not a pass. No look of fewer than
  :data:`MIN_PASS` utterances passes (the slice's last excepted: its size is the user's): a
  percentile bootstrap never reaches beyond its sample (on ``n`` utterances none of which got
  worse its upper end is exactly 0), and a share ``p`` of harmed utterances goes unseen in ``n``
  with chance ``(1 - p)^n``.

Guarantees, at the intervals' nominal level: the chance that any look passes a candidate whose
true delta is beyond the bound stays below ``alpha``; the futility stop only turns would-be
passes into fails, and stops a candidate whose true delta meets the bound with a chance below
``beta``. Fails may come at the first look: they are the safe direction. Why the constants are
what they are: ``docs/changelog.md`` (2026-12-05, 2026-12-06).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opsnn_quant.evaluation.text_norm import Normalize
from opsnn_quant.evaluation.wer import edit_counts, normalize_all

LOOK_EVERY = 16  # utterances between looks (a few whole batches of the zoo's Whisper settings)
ALPHA = 0.05  # default chance that any look passes a candidate beyond its bound
BETA = 0.2  # the chance that a futility stop fails a candidate within its bound
MIN_PASS = 16  # utterances before a look may pass (module docstring: the bootstrap's blind spot)
RESAMPLES = 2000
SEED = 0

Rate = Literal["wer", "cer"]


@dataclass(frozen=True)
class Errors:
    """Per utterance: a model's edit errors and the reference's length (words or chars)."""

    errors: tuple[int, ...]
    lengths: tuple[int, ...]


def utterance_errors(
    references: Sequence[str], hypotheses: Sequence[str], rate: Rate, normalize: Normalize = True
) -> Errors:
    """Each utterance's word (``wer``) or character (``cer``) edit errors and reference length,
    after the normalisation the corpus rates use (:func:`~.wer.error_rates`)."""
    refs = normalize_all(references, normalize)
    hyps = normalize_all(hypotheses, normalize)
    errors, lengths = edit_counts(refs, hyps, words=rate == "wer")
    return Errors(tuple(errors), tuple(lengths))


def delta_interval(
    baseline: Errors, candidate: Errors, level: float, *, resamples: int = RESAMPLES
) -> tuple[float, float, float]:
    """The candidate's rate minus the baseline's, in points, and its paired percentile
    bootstrap interval at ``level``: ``(delta, low, high)``.

    The rates are corpus rates (total errors / total reference length), so each resample
    draws utterances with replacement and recomputes both sums on the same draw.
    """
    base = np.asarray(baseline.errors, dtype=np.float64)
    cand = np.asarray(candidate.errors, dtype=np.float64)
    length = np.asarray(baseline.lengths, dtype=np.float64)
    total = length.sum()
    delta = 100.0 * (cand.sum() - base.sum()) / total if total else 0.0
    rng = np.random.default_rng(SEED)
    draws = rng.integers(0, len(base), size=(resamples, len(base)))
    words = length[draws].sum(axis=1)
    diff = (cand - base)[draws].sum(axis=1)
    stats = 100.0 * diff / np.where(words > 0, words, 1.0)
    tail = (1.0 - level) / 2
    low, high = np.quantile(stats, [tail, 1.0 - tail])
    return float(delta), float(low), float(high)


def looks(size: int, every: int = LOOK_EVERY) -> list[int]:
    """The slice sizes after which the verdict is looked at: after ``every // 2`` utterances,
    then every ``every``, the last one the whole slice (a slice of at most ``every // 2`` has
    only that look)."""
    first = every // 2
    ends = [first, *range(every, size, every)] if first < size else []
    return [*[e for e in ends if e < size], size]


def levels(n_looks: int, confidence: float = 1 - ALPHA, beta: float = BETA) -> tuple[float, float]:
    """The two-sided levels of a slice judged at ``n_looks`` looks: ``(decide, futility)``.

    ``decide`` is ``1 - alpha / n_looks`` (``alpha = 1 - confidence``, the suite's
    ``metrics.confidence``); ``futility`` is the two-sided level whose lower bound is the
    one-sided ``1 - beta / (n_looks - 1)`` bound of the early looks (1.0, never futile, with a
    single look).
    """
    decide = 1 - (1 - confidence) / n_looks
    futility = 1.0 if n_looks < 2 else 1 - 2 * beta / (n_looks - 1)
    return decide, futility
