"""Word and character error rates of transcripts (the one implementation: the acceptance run's,
the zoo's and the benchmarks'), and how far a quantized model's transcripts moved.

Corpus rates come from torchmetrics ``WordErrorRate``/``CharErrorRate`` (total edits / total
reference words or characters) after Whisper's English normalisation
(:func:`opsnn_quant.evaluation.text_norm.normalize_english`), as Whisper's published WERs are.
Per-utterance rows and word alignments come from jiwer, for the report's worst-first diffs.

*Agreement WER* scores the candidate's transcripts with the baseline's as the reference: it
measures how much quantization changed the output, independently of ground truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opsnn_quant.errors import InputError, MissingDependencyError
from opsnn_quant.evaluation.report import DiffChunkRow, TranscriptRow
from opsnn_quant.evaluation.text_norm import Normalize, as_norm

INSTALL_HINT = "pip install 'opsnn-quant[eval]'"


@dataclass(frozen=True)
class ErrorRates:
    """Corpus WER/CER and the counts behind them (rates are fractions, not percent)."""

    wer: float
    cer: float
    word_errors: int
    ref_words: int
    char_errors: int
    ref_chars: int


def normalize_all(texts: Sequence[str], normalize: Normalize = True) -> list[str]:
    """Each text normalised: True Whisper's English normaliser, False whitespace collapsed
    only, or a language's :class:`~.text_norm.TextNorm`."""
    norm = as_norm(normalize)
    return [norm(t) for t in texts]


def _check(references: Sequence[str], hypotheses: Sequence[str]) -> None:
    if len(references) != len(hypotheses):
        raise InputError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if not references:
        raise InputError("error rates need at least one utterance")


def error_rates(
    references: Sequence[str], hypotheses: Sequence[str], normalize: Normalize = True
) -> ErrorRates:
    """Corpus WER and CER of ``hypotheses`` against ``references`` (torchmetrics).

    Raises:
        InputError: Lengths differ, no utterances, or the references have no words at all.
    """
    try:
        from torchmetrics.text import CharErrorRate, WordErrorRate
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(f"WER needs torchmetrics: {INSTALL_HINT}") from err
    _check(references, hypotheses)
    refs = normalize_all(references, normalize)
    hyps = normalize_all(hypotheses, normalize)
    if not any(refs):
        raise InputError("the references have no words after normalisation")
    # No sync: a distributed evaluate scores the gathered transcripts on rank 0 alone, and a
    # torchmetrics metric would otherwise wait in a collective for the other ranks.
    wer_m = WordErrorRate(sync_on_compute=False)
    cer_m = CharErrorRate(sync_on_compute=False)
    wer_m.update(hyps, refs)
    cer_m.update(hyps, refs)
    return ErrorRates(
        wer=float(wer_m.compute()),
        cer=float(cer_m.compute()),
        word_errors=int(wer_m.errors),
        ref_words=int(wer_m.total),
        char_errors=int(cer_m.errors),
        ref_chars=int(cer_m.total),
    )


def _alignment(ref: str, hyp: str, words: bool = True) -> tuple[int, list[DiffChunkRow]]:
    """Word (``words``) or character edits and alignment chunks of ``hyp`` against ``ref``
    (jiwer; characters are aligned as one-character words)."""
    import jiwer

    ref_w, hyp_w = (ref.split(), hyp.split()) if words else (list(ref), list(hyp))
    sep = " " if words else ""
    if not ref_w and not hyp_w:
        return 0, []
    if not ref_w:  # jiwer rejects empty references in some versions: all insertions
        return len(hyp_w), [DiffChunkRow(op="insert", ref="", hyp=hyp)]
    out = jiwer.process_words(" ".join(ref_w), " ".join(hyp_w) if hyp_w else "")
    edits = int(out.substitutions + out.deletions + out.insertions)
    chunks = [
        DiffChunkRow(
            op=c.type,
            ref=sep.join(ref_w[c.ref_start_idx : c.ref_end_idx]),
            hyp=sep.join(hyp_w[c.hyp_start_idx : c.hyp_end_idx]),
        )
        for c in out.alignments[0]
    ]
    return edits, chunks


def utterance_rows(
    references: Sequence[str],
    baseline: Sequence[str],
    candidate: Sequence[str],
    normalize: Normalize = True,
) -> list[TranscriptRow]:
    """Per-utterance errors of both models, worst first.

    Order: most extra candidate errors first, then most baseline→candidate changes, then
    input order, so the top of the list is where quantization hurt.

    Raises:
        InputError: The three lists differ in length or are empty.
    """
    _check(references, baseline)
    _check(references, candidate)
    words = as_norm(normalize).words  # no word boundaries: errors counted in characters
    refs = normalize_all(references, normalize)
    bases = normalize_all(baseline, normalize)
    cands = normalize_all(candidate, normalize)
    rows = []
    for i, (r, b, c) in enumerate(zip(refs, bases, cands, strict=True)):
        agreement, diff = _alignment(b, c, words)
        rows.append(
            TranscriptRow(
                index=i,
                reference=r,
                baseline=b,
                candidate=c,
                ref_words=len(r.split()) if words else len(r),
                baseline_errors=_alignment(r, b, words)[0],
                candidate_errors=_alignment(r, c, words)[0],
                agreement_errors=agreement,
                diff=diff,
            )
        )
    rows.sort(key=lambda u: (-u.extra_errors, -u.agreement_errors, u.index))
    return rows


def agreement_wer(
    baseline: Sequence[str], candidate: Sequence[str], normalize: Normalize = True
) -> float:
    """WER of the candidate transcripts with the baseline transcripts as the reference.

    When the baseline produced no words at all, returns 0.0 if the candidate did not either
    and ``inf`` otherwise.
    """
    _check(baseline, candidate)
    bases = normalize_all(baseline, normalize)
    cands = normalize_all(candidate, normalize)
    edits = sum(_alignment(b, c)[0] for b, c in zip(bases, cands, strict=True))
    words = sum(len(b.split()) for b in bases)
    if words == 0:
        return 0.0 if edits == 0 else float("inf")
    return edits / words


def agreement_cer(
    baseline: Sequence[str], candidate: Sequence[str], normalize: Normalize = True
) -> float:
    """CER of the candidate transcripts with the baseline transcripts as the reference: the
    agreement of a language judged by characters (0.0 / ``inf`` as :func:`agreement_wer`
    when the baseline has no characters)."""
    try:
        from torchmetrics.text import CharErrorRate
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(f"CER needs torchmetrics: {INSTALL_HINT}") from err
    _check(baseline, candidate)
    bases = normalize_all(baseline, normalize)
    cands = normalize_all(candidate, normalize)
    metric = CharErrorRate(sync_on_compute=False)
    metric.update(cands, bases)
    errors, total = int(metric.errors), int(metric.total)
    if total == 0:
        return 0.0 if errors == 0 else float("inf")
    return errors / total
