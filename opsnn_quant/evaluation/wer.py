"""Word and character error rates of transcripts (the one implementation: the acceptance run's,
the zoo's and the benchmarks'), and how far a quantized model's transcripts moved.

Corpus rates are total edits / total reference words or characters after Whisper's English
normalisation (:func:`opsnn_quant.evaluation.text_norm.normalize_english`), as Whisper's published
WERs are: the counts of torchmetrics ``WordErrorRate``/``CharErrorRate`` (Levenshtein distance
over whitespace-split words, or over characters; a test holds :func:`edit_counts` to
torchmetrics' own ``_edit_distance``), computed with RapidFuzz (jiwer's own edit-distance
library) instead: importing ``torchmetrics.text`` cost a Whisper calibrate ~1 s, more than every
look of its measured search. Per-utterance rows and word alignments come from jiwer, for the
report's worst-first diffs.

*Agreement WER* scores the candidate's transcripts with the baseline's as the reference: it
measures how much quantization changed the output, independently of ground truth.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opsnn_quant.errors import InputError, MissingDependencyError
from opsnn_quant.evaluation.report_schema import DiffChunkRow, TranscriptRow
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


def edit_counts(
    references: Sequence[str], hypotheses: Sequence[str], words: bool = True
) -> tuple[list[int], list[int]]:
    """Each utterance's edits (Levenshtein distance: substitutions, deletions and insertions of
    whitespace-split ``words``, else of characters, spaces included) of its hypothesis against
    its reference, and the reference's length in the same unit: torchmetrics' WER/CER counts.

    Raises:
        MissingDependencyError: RapidFuzz (with jiwer, ``[eval]``) is not installed.
    """
    try:
        from rapidfuzz.distance import Levenshtein
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(f"error rates need rapidfuzz: {INSTALL_HINT}") from err
    edits, lengths = [], []
    for ref, hyp in zip(references, hypotheses, strict=True):
        r, h = (ref.split(), hyp.split()) if words else (ref, hyp)
        edits.append(int(Levenshtein.distance(r, h)))
        lengths.append(len(r))
    return edits, lengths


def _rate(errors: int, total: int) -> float:
    """``errors / total`` as torchmetrics' ``compute`` gives it: a float32 division (both sums
    are exact in float32), so figures and reports keep their bytes."""
    return float(np.float32(errors) / np.float32(total))


def error_rates(
    references: Sequence[str], hypotheses: Sequence[str], normalize: Normalize = True
) -> ErrorRates:
    """Corpus WER and CER of ``hypotheses`` against ``references`` (torchmetrics).

    Raises:
        InputError: Lengths differ, no utterances, or the references have no words at all.
    """
    _check(references, hypotheses)
    refs = normalize_all(references, normalize)
    hyps = normalize_all(hypotheses, normalize)
    if not any(refs):
        raise InputError("the references have no words after normalisation")
    word_errors, ref_words = (sum(c) for c in edit_counts(refs, hyps, words=True))
    char_errors, ref_chars = (sum(c) for c in edit_counts(refs, hyps, words=False))
    return ErrorRates(
        wer=_rate(word_errors, ref_words),
        cer=_rate(char_errors, ref_chars),
        word_errors=word_errors,
        ref_words=ref_words,
        char_errors=char_errors,
        ref_chars=ref_chars,
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


# openai/whisper transcribe.py: a segment whose text compresses better than 2.4:1 (gzip) is
# "too repetitive" (its compression_ratio_threshold, which makes Whisper decode it again).
COMPRESSION_RATIO_MAX = 2.4
LOOP_REPEATS = 4  # the same token n-gram this many times in a row: a decoding loop
LENGTH_RATIO_MAX = 2.0  # a transcript twice the reference's length made the rest up


def repetition(text: str, reference: str, words: bool = True) -> str | None:
    """What makes a (normalised) transcript a repetition or a hallucination, in words, or None.

    A loop: the same n-gram of 1-4 tokens (words, or characters without word boundaries)
    :data:`LOOP_REPEATS` times or more in a row, or a text that compresses better than
    Whisper's own threshold (:data:`COMPRESSION_RATIO_MAX`); made up: more than
    :data:`LENGTH_RATIO_MAX` times the reference's tokens.
    """
    tokens = text.split() if words else list(text)
    ref = reference.split() if words else list(reference)
    for n in range(1, 5):
        for start in range(len(tokens) - n * LOOP_REPEATS + 1):
            gram, run = tokens[start : start + n], 1
            while tokens[start + run * n : start + (run + 1) * n] == gram:
                run += 1
            if run >= LOOP_REPEATS:
                return f"{(' ' if words else '').join(gram)!r} x{run}"
    raw = text.encode("utf-8")
    if len(raw) >= 32:
        ratio = len(raw) / len(zlib.compress(raw))
        if ratio > COMPRESSION_RATIO_MAX:
            return f"compresses {ratio:.1f}:1 (repetitive)"
    if ref and len(tokens) > LENGTH_RATIO_MAX * len(ref):
        unit = "words" if words else "characters"
        return f"{len(tokens)} {unit} for a reference of {len(ref)} (made up)"
    return None


def one_unit_loop(text: str, words: bool = True) -> str | None:
    """What a (normalised) transcript that is nothing but one unit said over and over says
    (``"'bang' x8"``, ``"'m' x16"``, ``"'virtual' x8"``), or None: its words (with word
    boundaries), or its characters with the spaces left out, are one unit repeated
    :data:`LOOP_REPEATS` times or more and nothing else. A random or broken decoder emits one
    token until its length limit, with or without a space before it; a transcript that merely
    contains a loop is :func:`repetition`'s."""
    views: list[tuple[list[str], str]] = [(list(text.replace(" ", "")), "")]
    if words:
        views.insert(0, (text.split(), " "))
    for tokens, sep in views:
        for n in range(1, len(tokens) // LOOP_REPEATS + 1):  # the shortest unit first
            times, rest = divmod(len(tokens), n)
            if not rest and tokens == tokens[:n] * times:
                return f"{sep.join(tokens[:n])!r} x{times}"
    return None


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
                baseline_repeats=repetition(b, r, words),
                candidate_repeats=repetition(c, r, words),
                unit="words" if words else "characters",
            )
        )
    rows.sort(key=lambda u: (-u.extra_errors, -u.agreement_errors, u.index))
    return rows


def both_ways(rows: Sequence[TranscriptRow], max_rows: int | None) -> list[TranscriptRow]:
    """The rows a report shows, in their worst-first order: the candidate's largest losses,
    its largest gains (a third of the room at most), every row where either model repeats or
    makes up words (:func:`repetition`); then, room left, the other changed rows."""
    if max_rows is None or len(rows) <= max_rows:
        return list(rows)
    worse = [r for r in rows if r.extra_errors > 0]
    better = sorted(
        (r for r in rows if r.extra_errors < 0), key=lambda r: (r.extra_errors, r.index)
    )
    flagged = [r for r in rows if r.baseline_repeats or r.candidate_repeats]
    keep: dict[int, TranscriptRow] = {r.index: r for r in flagged[:max_rows]}
    for r in better[: max(1, max_rows // 3)]:
        if len(keep) < max_rows:
            keep.setdefault(r.index, r)
    for r in [*worse, *(r for r in rows if r.extra_errors == 0 and r.agreement_errors)]:
        if len(keep) >= max_rows:
            break
        keep.setdefault(r.index, r)
    return [r for r in rows if r.index in keep]


def drivers(rows: Sequence[TranscriptRow], words: bool = True, top: int = 5) -> list[str]:
    """Notes: which utterances make the error-rate delta (its largest contributions both
    ways, and their share of the extra errors), and where a model repeats or makes up words."""
    unit = "words" if words else "characters"
    out = []
    worse = sorted(
        (r for r in rows if r.extra_errors > 0), key=lambda r: (-r.extra_errors, r.index)
    )
    better = sorted(
        (r for r in rows if r.extra_errors < 0), key=lambda r: (r.extra_errors, r.index)
    )
    up, down = sum(r.extra_errors for r in worse), -sum(r.extra_errors for r in better)
    for name, group, total, sign in (("more", worse, up, "+"), ("fewer", better, down, "")):
        if not group:
            continue
        shown = group[:top]
        share = sum(abs(r.extra_errors) for r in shown) / total
        items = ", ".join(f"#{r.index} ({sign}{r.extra_errors})" for r in shown)
        out.append(
            f"the candidate makes {name} errors on {len(group)} utterances ({total} {unit} in "
            f"all); the largest: {items} = {share:.0%} of them"
        )
    for who, attr in (("float", "baseline_repeats"), ("candidate", "candidate_repeats")):
        flagged = [r for r in rows if getattr(r, attr)]
        if flagged:
            errors = sum(
                (r.baseline_errors if who == "float" else r.candidate_errors) for r in flagged
            )
            items = "; ".join(f"#{r.index} {getattr(r, attr)}" for r in flagged[:top])
            out.append(
                f"the {who} model repeats or makes up {unit} on {len(flagged)} utterances "
                f"({errors} of its errors): {items}"
            )
    return out


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
    edits, words = (sum(c) for c in edit_counts(bases, cands, words=True))
    if words == 0:
        return 0.0 if edits == 0 else float("inf")
    return edits / words


def agreement_cer(
    baseline: Sequence[str], candidate: Sequence[str], normalize: Normalize = True
) -> float:
    """CER of the candidate transcripts with the baseline transcripts as the reference: the
    agreement of a language judged by characters (0.0 / ``inf`` as :func:`agreement_wer`
    when the baseline has no characters)."""
    _check(baseline, candidate)
    bases = normalize_all(baseline, normalize)
    cands = normalize_all(candidate, normalize)
    errors, total = (sum(c) for c in edit_counts(bases, cands, words=False))
    if total == 0:
        return 0.0 if errors == 0 else float("inf")
    return errors / total
