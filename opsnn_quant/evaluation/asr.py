"""The speech-to-text task (``asr``) and its metrics.

An asr suite's models transcribe each utterance once. Both models' transcripts are compared
once (:func:`compare_transcripts`): their corpus WER and CER against the reference transcripts
and against each other (agreement), after the suite language's normaliser; every metric below
reads that :class:`TranscriptComparison`, in points (percent), and its interval resamples the
utterances with both models' error counts (a corpus rate's ratio of sums,
:func:`~.sequential.delta_interval`). :func:`asr_quality` is both steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from opsnn_quant.evaluation.intervals import Interval
from opsnn_quant.evaluation.metrics import Compared, Metric, Range, register_metric
from opsnn_quant.evaluation.quality import QualityResult, measure_metrics, share
from opsnn_quant.evaluation.report_schema import QualityRow
from opsnn_quant.evaluation.sequential import Errors, Rate, delta_interval, utterance_errors
from opsnn_quant.evaluation.tasks import Task, TaskInputs, register_task
from opsnn_quant.evaluation.text_norm import Normalize, TextNorm, as_norm
from opsnn_quant.evaluation.wer import (
    ErrorRates,
    agreement_cer,
    agreement_wer,
    both_ways,
    drivers,
    error_rates,
    normalize_all,
    one_unit_loop,
    utterance_rows,
)

if TYPE_CHECKING:
    import torch

    from opsnn_quant.evaluation.suite_schema import SuiteSpec
    from opsnn_quant.models.base import ModelAdapter

TASK = "asr"


@dataclass(frozen=True)
class TranscriptComparison(Compared):
    """Both models' transcripts compared once: what the asr metrics read.

    Attributes:
        references: the reference transcripts, one per utterance.
        norm: the normaliser every transcript goes through before its errors are counted.
        baseline_rates, candidate_rates: each model's corpus WER and CER (fractions).
        agreement: the candidate's corpus (WER, CER) against the baseline's transcripts.
    """

    references: Sequence[str]
    norm: TextNorm
    baseline_rates: ErrorRates
    candidate_rates: ErrorRates
    agreement: tuple[float, float]


def asr_quality(
    references: Sequence[str],
    baseline_texts: Sequence[str],
    candidate_texts: Sequence[str],
    *,
    normalize: Normalize = True,
    max_rows: int | None = 50,
    confidence: float | None = None,
    silent: Sequence[bool] | None = None,
) -> QualityResult:
    """WER/CER of both models against references, agreement WER, worst-first transcript rows:
    the comparison's tables and notes (:func:`compare_transcripts`) and every asr metric's
    figure (``wer_delta_points`` = 100 x (WER candidate - WER baseline)), with its paired
    bootstrap interval at ``confidence`` (None: none, a measured search's slice).

    The baseline's own health, for :data:`~.runner.OUTPUT_CHECKS`: ``baseline_broken_share``,
    the share of utterances whose baseline transcript says nothing (empty or one token
    repeated after normalisation, :func:`~.wer.one_unit_loop`) or whose input is silent
    (``silent``, one flag per utterance; None: none is); ``baseline_error_points``, its WER
    (its CER without word boundaries), which above 100 % counts more errors than there are
    reference words.
    """
    out = QualityResult()
    compared = compare_transcripts(
        out, references, baseline_texts, candidate_texts, normalize=normalize,
        max_rows=max_rows, silent=silent,
    )  # fmt: skip
    measure_metrics(TASK, compared, out, confidence)
    return out


def compare_transcripts(
    out: QualityResult,
    references: Sequence[str],
    baseline_texts: Sequence[str],
    candidate_texts: Sequence[str],
    *,
    normalize: Normalize = True,
    max_rows: int | None = 50,
    silent: Sequence[bool] | None = None,
) -> TranscriptComparison:
    """Compare both models' transcripts once (arguments as :func:`asr_quality`'s): the
    comparison the metrics read; ``out`` gets the tables, the transcript rows (worst first),
    the notes and the figures beside the metrics' (each model's WER and CER, the baseline's
    health)."""
    norm = as_norm(normalize)
    eb = error_rates(references, baseline_texts, norm)
    ec = error_rates(references, candidate_texts, norm)
    agree = agreement_wer(baseline_texts, candidate_texts, norm)
    agree_c = agreement_cer(baseline_texts, candidate_texts, norm)
    out.measured.update(
        wer_baseline=100 * eb.wer, wer_candidate=100 * ec.wer,
        cer_baseline=100 * eb.cer, cer_candidate=100 * ec.cer,
        baseline_broken_share=share(
            not t.strip() or one_unit_loop(t, norm.words) is not None or bool(quiet)
            for t, quiet in zip(
                normalize_all(baseline_texts, norm), silent or [False] * len(baseline_texts),
                strict=True,
            )
        ),
        baseline_error_points=100 * (eb.wer if norm.words else eb.cer),
    )  # fmt: skip
    out.labels["baseline_error_points"] = f"baseline {'WER' if norm.words else 'CER'} (%)"
    out.quality += [
        QualityRow(metric="WER", baseline=100 * eb.wer, candidate=100 * ec.wer,
                   delta=100 * (ec.wer - eb.wer), unit="%", note=f"{eb.ref_words} reference words"),
        QualityRow(metric="CER", baseline=100 * eb.cer, candidate=100 * ec.cer,
                   delta=100 * (ec.cer - eb.cer), unit="%", note=f"{eb.ref_chars} reference chars"),
        QualityRow(metric="agreement WER (candidate vs baseline)", candidate=100 * agree, unit="%"),
        QualityRow(metric="agreement CER (candidate vs baseline)", candidate=100 * agree_c, unit="%"),
    ]  # fmt: skip
    if not norm.words:  # no word boundaries: a "word" is a whole utterance, CER decides
        out.quality = [q for q in out.quality if "WER" not in q.metric]
    rows = utterance_rows(references, baseline_texts, candidate_texts, norm)
    out.transcripts = both_ways(rows, max_rows)
    out.notes.append(f"error rates after {norm.name}; {len(rows)} utterances")
    out.notes += drivers(rows, norm.words)
    return TranscriptComparison(baseline_texts, candidate_texts, len(references), references,
                                norm, eb, ec, (agree, agree_c))  # fmt: skip


# --- what an asr suite's metrics read beside the transcripts ----------------------------------


def _prepare(inputs: TaskInputs, adapter: ModelAdapter, allow_pickle: bool) -> TaskInputs:
    """The utterances' reference transcripts (empty ones where the data has none)."""
    refs = adapter.references(inputs.records) or [""] * len(inputs.inputs)
    return dataclasses.replace(inputs, references=refs)


def _compare(
    inputs: TaskInputs,
    baseline: list[Any],
    candidate: list[Any],
    extracted: tuple[torch.Tensor, torch.Tensor] | None,
    confidence: float | None,
) -> QualityResult:
    """:func:`asr_quality` of the transcripts, silent inputs flagged."""
    from opsnn_quant.models.data import is_silent

    return asr_quality(
        inputs.references, baseline, candidate, confidence=confidence,
        normalize=inputs.suite.text_norm(),
        silent=[isinstance(x, np.ndarray) and is_silent(x) for x in inputs.inputs],
    )  # fmt: skip


# --- the metrics -------------------------------------------------------------------------------

_ASR = frozenset({TASK})


def _rate_delta(rate: Rate) -> Any:
    """The figure of a rate's delta, candidate - baseline, in points."""

    def compute(c: TranscriptComparison) -> float:
        return 100 * (getattr(c.candidate_rates, rate) - getattr(c.baseline_rates, rate))

    return compute


def _rate_delta_interval(rate: Rate) -> Any:
    """The interval of a rate's delta: each utterance resampled with both models' errors."""

    def interval(c: TranscriptComparison, level: float) -> Interval | None:
        if c.units == 0:
            return None
        base = utterance_errors(c.references, c.baseline, rate, c.norm)
        cand = utterance_errors(c.references, c.candidate, rate, c.norm)
        _, low, high = delta_interval(base, cand, level)
        return Interval(low=low, high=high, level=level, n=c.units)

    return interval


def _agreement_interval(rate: Rate) -> Any:
    """The interval of the candidate's rate against the baseline's transcripts, whose words
    (characters) are the denominator; a zero-error "baseline" makes the delta the plain
    ratio."""

    def interval(c: TranscriptComparison, level: float) -> Interval | None:
        if c.units == 0:
            return None
        agree = utterance_errors(c.baseline, c.candidate, rate, c.norm)
        zero = Errors(tuple(0 for _ in agree.errors), agree.lengths)
        _, low, high = delta_interval(zero, agree, level)
        return Interval(low=low, high=high, level=level, n=c.units)

    return interval


def _by_words(suite: SuiteSpec) -> str | None:
    """A WER of a language written without spaces between words counts whole sentences."""
    if suite.text_norm().words:
        return None
    return (
        f"generation.language {suite.generation.language} is written without spaces between "
        "words, so it is judged by characters: {names} would count whole sentences; use "
        f"{CER_DELTA.bound} and {AGREEMENT_CER.bound}"
    )


WER_DELTA = register_metric(Metric(
    key="wer_delta_points", tasks=_ASR, comparator="<=", bound="wer_delta_max_points",
    label="WER candidate - baseline (points)", default_bound=0.5, signed=True, rate="wer",
    compute=_rate_delta("wer"), interval=_rate_delta_interval("wer"), requires=_by_words,
))  # fmt: skip
CER_DELTA = register_metric(Metric(
    key="cer_delta_points", tasks=_ASR, comparator="<=", bound="cer_delta_max_points",
    label="CER candidate - baseline (points)", default_bound=0.5, signed=True, rate="cer",
    compute=_rate_delta("cer"), interval=_rate_delta_interval("cer"),
))  # fmt: skip
AGREEMENT_WER = register_metric(Metric(
    key="agreement_wer_points", tasks=_ASR, comparator="<=", bound="agreement_wer_max_points",
    label="WER of candidate vs baseline (points)", default_bound=3.0, bound_range=Range(0.0),
    compute=lambda c: 100 * c.agreement[0], interval=_agreement_interval("wer"),
    requires=_by_words,
))  # fmt: skip
AGREEMENT_CER = register_metric(Metric(
    key="agreement_cer_points", tasks=_ASR, comparator="<=", bound="agreement_cer_max_points",
    label="CER of candidate vs baseline (points)", default_bound=15.0, bound_range=Range(0.0),
    compute=lambda c: 100 * c.agreement[1], interval=_agreement_interval("cer"),
))  # fmt: skip


def _fidelity(suite: SuiteSpec) -> str:
    """The words that differ from the float transcripts (their characters without word
    boundaries)."""
    return (AGREEMENT_WER if suite.text_norm().words else AGREEMENT_CER).key


register_task(Task(
    name=TASK, outputs="transcripts", unit="utterances", doing="transcribing {count} utterances",
    seeded=False, inputs_file=None, reference_images=False, prepare=_prepare, compare=_compare,
    fidelity=_fidelity,
))  # fmt: skip
