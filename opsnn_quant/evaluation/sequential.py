"""A measured candidate's verdict before the whole slice: the paired bootstrap interval of a
WER/CER delta, looked at every few utterances.

The measured search of ``calibrate`` (:mod:`opsnn_quant.evaluation.slice_scorer`) judges each
candidate on a slice of utterances. Most candidates are far from the bound (a static W8A8
Whisper at +3 WER points against a 0.5 bound), and transcribing the rest of the slice cannot
change their verdict. So the candidate is transcribed in groups of :data:`LOOK_EVERY`
utterances and, after each group but the last, the paired bootstrap interval of the delta (the
utterances resampled with their float and candidate errors together, the corpus rate's ratio of
sums recomputed) is compared with the bound: wholly inside it is a PASS, wholly beyond it a
FAIL, either ends the measurement. The interval of each look is at level ``1 - alpha / looks``
(Bonferroni over the early looks), so the chance that any early look decides wrongly stays
below ``alpha``; without an early decision the whole slice's point estimate decides, as it did
before. The resampling is seeded: the same outputs give the same verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opsnn_quant.evaluation.wer import normalize_all

LOOK_EVERY = 16  # utterances between looks (a few whole batches of the zoo's Whisper settings)
ALPHA = 0.05  # the chance that any early look decides otherwise than the truth
RESAMPLES = 2000
SEED = 0

Rate = Literal["wer", "cer"]


@dataclass(frozen=True)
class Errors:
    """Per utterance: a model's edit errors and the reference's length (words or chars)."""

    errors: tuple[int, ...]
    lengths: tuple[int, ...]


def utterance_errors(
    references: Sequence[str], hypotheses: Sequence[str], rate: Rate, normalize: bool = True
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


def early_verdict(low: float, high: float, bound: float) -> bool | None:
    """A delta bound ``delta <= bound`` judged on an interval: True (the whole interval meets
    it), False (none of it does), None (undecided: look again)."""
    if high <= bound:
        return True
    if low > bound:
        return False
    return None


def looks(size: int, every: int = LOOK_EVERY) -> list[int]:
    """The slice sizes after which the verdict is looked at: every ``every`` utterances, the
    last one the whole slice (a slice of at most ``every`` has only that look)."""
    ends = list(range(every, size, every))
    return [*ends, size]
