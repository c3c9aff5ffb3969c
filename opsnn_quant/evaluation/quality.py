"""Quality measurements of candidate vs baseline outputs: images (PSNR/SSIM, CLIP score, FID/FD, KID)
and transcripts (WER/CER, agreement WER), as a :class:`QualityResult` for
:func:`~opsnn_quant.evaluation.runner.build_report`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from pydantic import BaseModel, Field
from torch import nn

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.clip_score import ClipScorer
from opsnn_quant.evaluation.fid import (
    FD_SUFFIX,
    INCEPTION_SPACE,
    InceptionFeatures,
    extract_features,
    fid_result,
    metric_name,
)
from opsnn_quant.evaluation.image_similarity import pair_similarities, summarize
from opsnn_quant.evaluation.images import ImageBatch
from opsnn_quant.evaluation.intervals import Interval, asr_intervals, image_intervals
from opsnn_quant.evaluation.kid import kid_delta, kid_space
from opsnn_quant.evaluation.report import ImagePairRow, QualityRow, TranscriptRow
from opsnn_quant.evaluation.text_norm import Normalize, as_norm
from opsnn_quant.evaluation.wer import (
    agreement_cer,
    agreement_wer,
    both_ways,
    drivers,
    error_rates,
    normalize_all,
    one_unit_loop,
    utterance_rows,
)


class QualityResult(BaseModel):
    """Quality measurements ready for :func:`verdict` and :func:`build_report`.

    Attributes:
        measured: Flat metric name -> value (the keys :data:`THRESHOLDS` refers to).
        labels: Measured key -> label for criteria rows (e.g. FD rather than FID).
        quality: Table rows.
        image_pairs / transcripts: Worst first.
        notes: Caveats to print (sample counts, feature spaces).
        intervals: Measured key -> its paired bootstrap interval (:mod:`.intervals`, KID's
            :mod:`.kid`), when asked for (``confidence``; None: not asked); a set statistic
            (FD) has none.
        samples: Utterances or prompts the figures come from.
    """

    measured: dict[str, float | None] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    quality: list[QualityRow] = Field(default_factory=list)
    image_pairs: list[ImagePairRow] = Field(default_factory=list)
    transcripts: list[TranscriptRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    intervals: dict[str, Interval] | None = None
    samples: int | None = None


# A baseline output that says nothing: an image flatter than this (std of its uint8 values) or
# holding NaN/Inf; a transcript that is empty or one token repeated, or of a silent input. A
# broken float model makes every comparison with it pass.
FLAT_STD = 2.0


def _flat(image: object) -> bool:
    """Whether an image (or video: frames x H x W x 3) is flat, in uint8 steps, or holds
    NaN/Inf (no pixel value at all)."""
    arr = np.asarray(image, dtype=np.float64)
    if not np.isfinite(arr).all():
        return True
    if arr.size and arr.max() <= 1.0 and np.asarray(image).dtype.kind == "f":
        arr = arr * 255.0  # float images in [0, 1]
    return float(arr.std()) < FLAT_STD


def _share(flags: Iterable[bool]) -> float:
    values = list(flags)
    return sum(values) / len(values) if values else 0.0


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


FEATURE_BATCH = 16  # images per feature-extraction batch (FD / FID)


def t2i_quality(
    baseline_images: ImageBatch,
    candidate_images: ImageBatch,
    prompts: Sequence[str],
    *,
    seeds: Sequence[int] | None = None,
    clip: ClipScorer | None = None,
    fid_features: nn.Module | str | None = None,
    reference_images: ImageBatch | None = None,
    batch_size: int = FEATURE_BATCH,
    extracted: tuple[torch.Tensor, torch.Tensor] | None = None,
    confidence: float | None = None,
    prompts_count: int | None = None,
) -> QualityResult:
    """Quality of candidate images against baseline images (same prompts and seeds).

    Args:
        baseline_images, candidate_images: N images each, pair ``i`` from prompt ``i``.
        prompts: The N prompts.
        seeds: The N seeds (shown with the pairs).
        clip: CLIP scorer; None skips CLIP score.
        fid_features: Feature module (:class:`~.fid.InceptionFeatures`,
            :class:`~.fid.ClipImageFeatures`), ``"inception"``, or None to skip FID/FD and KID.
        reference_images: Real images for FID and KID against a reference set (one per
            prompt: KID is paired by prompt, :mod:`.kid`).
        batch_size: Feature-extraction batch.
        extracted: the baseline's and the candidate's features, already extracted with
            ``fid_features`` (a distributed run's, each rank its share: see
            :func:`opsnn_quant.evaluation.evaluate.shared_features`).
        confidence: Also each figure's paired bootstrap interval at this level
            (:func:`~.intervals.image_intervals`); None: none (a measured search's slice).
        prompts_count: Distinct prompts, each with one image per seed in seed-major order
            (the resampling unit); default: every image its own prompt.

    Raises:
        InputError: Counts of images, prompts and seeds disagree.
    """
    pairs = pair_similarities(baseline_images, candidate_images)
    if len(pairs) != len(prompts) or (seeds is not None and len(seeds) != len(prompts)):
        raise InputError(f"{len(pairs)} image pairs, {len(prompts)} prompts, "
                         f"{'no' if seeds is None else len(seeds)} seeds")  # fmt: skip
    out = QualityResult()
    m = out.measured
    m.update(summarize(pairs))
    m["baseline_broken_share"] = _share(_flat(img) for img in baseline_images)
    out.quality += [
        QualityRow(metric="PSNR vs baseline (median)", candidate=m["psnr_median_db"], unit="dB"),
        QualityRow(metric="PSNR vs baseline (worst)", candidate=m["psnr_min_db"], unit="dB"),
        QualityRow(metric="SSIM vs baseline (mean)", candidate=m["ssim_mean"]),
        QualityRow(metric="SSIM vs baseline (worst)", candidate=m["ssim_min"]),
    ]
    clip_b: list[float | None] = [None] * len(pairs)
    clip_c: list[float | None] = [None] * len(pairs)
    if clip is not None:
        rb, rc = clip.score(baseline_images, prompts), clip.score(candidate_images, prompts)
        clip_b, clip_c = list(rb.per_image), list(rc.per_image)
        m.update(clip_score_baseline=rb.mean, clip_score_candidate=rc.mean,
                 clip_score_delta=rc.mean - rb.mean)  # fmt: skip
        out.quality.append(QualityRow(metric=f"CLIP score [{clip.label}]", baseline=rb.mean,
                                      candidate=rc.mean, delta=rc.mean - rb.mean))  # fmt: skip
    units = prompts_count or len(pairs)
    out.samples = units
    kid_intervals: dict[str, Interval] = {}
    if fid_features is not None:
        module = feature_module(fid_features)
        fb, fc = extracted or (
            extract_features(baseline_images, module, batch_size),
            extract_features(candidate_images, module, batch_size),
        )
        fr = _fid(out, fb, fc, reference_images, module, batch_size)
        if fr is not None:
            kid_intervals = _kid(out, (fb, fc, fr), units, confidence, _feature_space(module))
    if confidence is not None:
        both = clip is not None
        out.intervals = image_intervals(
            [p.psnr_db for p in pairs], [p.ssim for p in pairs], units, confidence,
            clip_baseline=[float(x or 0.0) for x in clip_b] if both else None,
            clip_candidate=[float(x or 0.0) for x in clip_c] if both else None,
        ) | kid_intervals  # fmt: skip
    order = sorted(range(len(pairs)), key=lambda i: (pairs[i].psnr_db, pairs[i].ssim, i))
    out.image_pairs = [
        ImagePairRow(index=i, prompt=str(prompts[i]), seed=None if seeds is None else int(seeds[i]),
                     psnr_db=pairs[i].psnr_db, ssim=pairs[i].ssim, mae=pairs[i].mae,
                     max_abs=pairs[i].max_abs, clip_baseline=clip_b[i], clip_candidate=clip_c[i])
        for i in order
    ]  # fmt: skip
    return out


def feature_module(features: nn.Module | str) -> nn.Module:
    """The FD feature module: ``features`` itself, or TF-Inception for ``"inception"``.

    Raises:
        InputError: another name.
    """
    if isinstance(features, str):
        if features != "inception":
            raise InputError(f"fid_features {features!r}: pass a feature module or 'inception'")
        return InceptionFeatures()
    return features


def _feature_space(features: nn.Module) -> str:
    """The label of a feature module's space (FD for any but TF-Inception's)."""
    return str(getattr(features, "feature_space", f"{type(features).__name__}{FD_SUFFIX}"))


def _fid(
    out: QualityResult,
    fb: torch.Tensor,
    fc: torch.Tensor,
    reference: ImageBatch | None,
    features: nn.Module,
    batch_size: int,
) -> torch.Tensor | None:
    """FD of the candidate's features ``fc`` against the baseline's ``fb`` (and of both
    against the reference images' when given); returns the reference's features (None: no
    reference)."""
    space = _feature_space(features)
    name = metric_name(space)
    fr = None
    vs_base = fid_result(fb, fc, space, "candidate vs baseline")
    m = out.measured
    m["fid_vs_baseline"] = vs_base.value
    out.labels["fid_vs_baseline"] = f"{name} candidate vs baseline [{space}]"
    out.quality.append(QualityRow(metric=f"{name} candidate vs baseline [{space}]",
                                  candidate=vs_base.value, note=f"n={vs_base.n_a}"))  # fmt: skip
    out.notes.append(vs_base.note)
    if reference is not None:
        fr = extract_features(reference, features, batch_size)
        rb = fid_result(fr, fb, space, "baseline vs reference")
        rc = fid_result(fr, fc, space, "candidate vs reference")
        m.update(fid_baseline_vs_reference=rb.value, fid_candidate_vs_reference=rc.value,
                 fid_delta=rc.value - rb.value)  # fmt: skip
        out.labels["fid_delta"] = f"{name} vs reference, candidate - baseline [{space}]"
        out.quality.append(QualityRow(metric=f"{name} vs reference [{space}]", baseline=rb.value,
                                      candidate=rc.value, delta=rc.value - rb.value,
                                      note=f"n={rb.n_b} vs {rb.n_a} reference"))  # fmt: skip
    if space != INCEPTION_SPACE:
        out.notes.append(f"{space}: a Fréchet distance in a non-Inception feature space; "
                         "not comparable with published FID values")  # fmt: skip
    return fr


KID_NOTE = (
    "KID: the unbiased MMD² of the FD's features under the kernel (x·y/d + 1)^3 (unlike FD, "
    "unbiased at any n); "
)
KID_PAIRED = (
    "paired by prompt: over pairs of distinct prompts (an image and its own prompt's reference "
    "image are a dependent pair, left out); the interval resamples the prompts with their "
    "baseline, candidate and reference images"
)
KID_UNPAIRED = (
    "the reference images are not one per prompt: an independent set, resampled apart from "
    "the prompts in the interval"
)


def _kid(
    out: QualityResult,
    features: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    prompts: int,
    confidence: float | None,
    space: str,
) -> dict[str, Interval]:
    """KID of baseline and candidate (``features``: theirs and the reference's) against the
    reference, their delta (the distribution criterion) and its interval when asked for."""
    fb, fc, fr = features
    if prompts < 2 or fr.shape[0] < 2 or fb.shape[0] % prompts:
        out.notes.append("KID not computed: it needs at least 2 prompts and 2 reference images")
        return {}
    result = kid_delta(fb, fc, fr, prompts, confidence)
    out.measured.update(kid_baseline_vs_reference=result.baseline,
                        kid_candidate_vs_reference=result.candidate, kid_delta=result.delta)  # fmt: skip
    where = kid_space(space)
    out.labels["kid_delta"] = f"KID vs reference, candidate - baseline [{where}]"
    pairing = ("paired by prompt" if result.paired
               else f"vs {result.references} reference images, unpaired")  # fmt: skip
    out.quality.append(QualityRow(metric=f"KID vs reference [{where}]", baseline=result.baseline,
                                  candidate=result.candidate, delta=result.delta,
                                  note=f"n={prompts} prompts, {pairing}"))  # fmt: skip
    out.notes.append(KID_NOTE + (KID_PAIRED if result.paired else KID_UNPAIRED))
    if space != INCEPTION_SPACE:
        out.notes.append(f"KID in {where} features: not comparable with published KID values")
    return {} if result.interval is None else {"kid_delta": result.interval}


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
    """WER/CER of both models against references, agreement WER, worst-first transcript rows.

    Rates are reported in points (percent) in ``measured``: ``wer_delta_points`` = 100 x
    (WER candidate - WER baseline). ``confidence``: also their paired bootstrap intervals at
    this level (:func:`~.intervals.asr_intervals`); None: none (a measured search's slice).

    The baseline's own health, for :func:`~.runner.baseline_checks`: ``baseline_broken_share``,
    the share of utterances whose baseline transcript says nothing (empty or one token
    repeated after normalisation, :func:`~.wer.one_unit_loop`) or whose input is silent
    (``silent``, one flag per utterance; None: none is); ``baseline_error_points``, its WER
    (its CER without word boundaries), which above 100 % counts more errors than there are
    reference words.
    """
    norm = as_norm(normalize)
    eb = error_rates(references, baseline_texts, norm)
    ec = error_rates(references, candidate_texts, norm)
    agree = agreement_wer(baseline_texts, candidate_texts, norm)
    agree_c = agreement_cer(baseline_texts, candidate_texts, norm)
    out = QualityResult()
    out.measured.update(
        wer_baseline=100 * eb.wer, wer_candidate=100 * ec.wer,
        wer_delta_points=100 * (ec.wer - eb.wer),
        cer_baseline=100 * eb.cer, cer_candidate=100 * ec.cer,
        cer_delta_points=100 * (ec.cer - eb.cer),
        agreement_wer_points=100 * agree,
        agreement_cer_points=100 * agree_c,
        baseline_broken_share=_share(
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
    out.samples = len(references)
    if confidence is not None:
        out.intervals = asr_intervals(
            references, baseline_texts, candidate_texts, confidence, normalize=norm
        )
    rows = utterance_rows(references, baseline_texts, candidate_texts, norm)
    out.transcripts = both_ways(rows, max_rows)
    out.notes.append(f"error rates after {norm.name}; {len(rows)} utterances")
    out.notes += drivers(rows, norm.words)
    return out
