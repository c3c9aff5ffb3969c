"""A measured candidate's verdict on the paired bootstrap interval of a WER/CER delta, looked
at every few utterances (issue 43 §2, issue 44 §4).

The measured search of ``calibrate`` (:mod:`opsnn_quant.evaluation.slice_scorer`) judges each
candidate on a slice of utterances, and a candidate passes only when its interval does, as in
the acceptance report. Most candidates are far from the bound (a static W8A8 Whisper at +3 WER
points against a 0.5 bound), and transcribing the rest of the slice cannot change their verdict.
So the candidate is transcribed in groups of :data:`LOOK_EVERY` utterances, the first group
halved (:func:`looks`: a candidate far beyond the bound fails on 8 utterances), and, after
each group, the paired bootstrap interval of the delta (the utterances resampled with their float and
candidate errors together, the corpus rate's ratio of sums recomputed) is compared with the
bound (:func:`levels`):

* at level ``1 - alpha / looks`` (Bonferroni over every look, the last one included): wholly
  inside the bound is a PASS, wholly beyond it a FAIL; either ends the measurement, and the
  chance that any look passes a candidate whose true delta is beyond the bound stays below
  ``alpha``;
* at an early look, a *futility* stop (non-binding, as group-sequential trials use): when the
  one-sided lower bound at ``1 - beta / early looks`` already lies beyond the bound, the
  candidate is very unlikely ever to be shown to pass, and it FAILS there. This only turns
  would-be passes into fails (the search is never less safe); the chance that it stops a
  candidate whose true delta meets the bound stays below ``beta``;
* at the last look, an interval still across the bound is INCONCLUSIVE: not a pass;
* but the first look never passes (no look of fewer than :data:`MIN_PASS` utterances does;
  the slice's last look excepted: the slice is the user's size). A percentile bootstrap never
  reaches beyond what its sample holds: on 8 utterances none of which got worse, the interval's
  upper end is exactly 0 whatever the candidate does to the utterances not yet drawn, and it
  "passes" any bound. A share ``p`` of harmed utterances goes unseen in ``n`` with chance
  ``(1 - p)^n``: 39 % in 8 for the 11 % that the issue-46 Mandarin candidate harmed on its eval
  set (it passed its slice on 8 utterances, then measured +15 CER points on the eval set); 15 %
  in 16. On the same slice, that candidate is not passed at 16 (+9.7 [-0.30, +25.9] at 32:
  INCONCLUSIVE). 16 is a compromise with cost: 32 (an unseen harmed share of at most ~9 % at
  95 %, the rule of three) would add 24 utterances of each model to every passing candidate
  (calibrate whisper-tiny-en: +18 s on 38). Fails stay early: they are the safe direction.

The resampling is seeded: the same outputs give the same verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opsnn_quant.evaluation.text_norm import Normalize
from opsnn_quant.evaluation.wer import normalize_all

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
    from torchmetrics.text import CharErrorRate, WordErrorRate

    refs = normalize_all(references, normalize)
    hyps = normalize_all(hypotheses, normalize)
    errors, lengths = [], []
    for ref, hyp in zip(refs, hyps, strict=True):
        metric = WordErrorRate(sync_on_compute=False) if rate == "wer" else CharErrorRate(
            sync_on_compute=False
        )  # fmt: skip
        metric.update([hyp], [ref])
        errors.append(int(metric.errors))
        lengths.append(int(metric.total))
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
