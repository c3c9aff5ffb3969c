"""The text-to-image task (``t2i``) and its metrics.

A t2i suite's models generate one image per prompt and seed. The baseline's and the
candidate's images are compared once (:func:`compare_images`): each pair's PSNR and SSIM, each
image's CLIP score against its prompt, and both sets' Fréchet distance and KID in the suite's
feature space (and against the reference images); every metric below reads that
:class:`ImageComparison`, resampled by prompt (each prompt with every seed's image) for its
interval. :func:`t2i_quality` is both steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from opsnn_quant.errors import ConfigError, InputError
from opsnn_quant.evaluation.clip_score import ClipScorer, ClipScoreResult
from opsnn_quant.evaluation.fid import (
    FD_SUFFIX,
    INCEPTION_SPACE,
    FidResult,
    extract_features,
    fid_result,
)
from opsnn_quant.evaluation.image_similarity import PairSimilarity, pair_similarities, summarize
from opsnn_quant.evaluation.images import ImageBatch
from opsnn_quant.evaluation.kid import KidDelta, kid_delta, kid_space
from opsnn_quant.evaluation.metrics import Compared, Metric, Range, register_metric
from opsnn_quant.evaluation.quality import (
    FEATURE_BATCH,
    QualityResult,
    feature_module,
    flat,
    measure_metrics,
    share,
)
from opsnn_quant.evaluation.report_schema import ImagePairRow, QualityRow
from opsnn_quant.evaluation.tasks import Task, TaskInputs, register_task

if TYPE_CHECKING:
    from opsnn_quant.evaluation.suite_schema import SuiteSpec
    from opsnn_quant.models.base import ModelAdapter

TASK = "t2i"


@dataclass(frozen=True)
class ImageComparison(Compared):
    """Both models' images compared once: what the t2i metrics read.

    Attributes:
        pairs: each candidate image against the baseline image at its index.
        clip: the baseline's and the candidate's CLIP scores (None: no CLIP).
        space: the feature space of the distribution figures (empty: none).
        fd: the Fréchet distance of the candidate's images to the baseline's (None: no
            feature space).
        fd_reference: the baseline's and the candidate's Fréchet distances to the reference
            images (None: no reference).
        kid: KID of both against the reference and its delta's interval (None: not computed).
    """

    pairs: list[PairSimilarity]
    clip: tuple[ClipScoreResult, ClipScoreResult] | None = None
    space: str = ""
    fd: FidResult | None = None
    fd_reference: tuple[FidResult, FidResult] | None = None
    kid: KidDelta | None = None


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
    """Quality of candidate images against baseline images (same prompts and seeds): the
    comparison's tables and notes (:func:`compare_images`) and every t2i metric's figure.

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
            :meth:`opsnn_quant.evaluation.evaluate.TaskInputs.shared_features`).
        confidence: Also each figure's paired bootstrap interval at this level
            (:mod:`.intervals`); None: none (a measured search's slice).
        prompts_count: Distinct prompts, each with one image per seed in seed-major order
            (the resampling unit); default: every image its own prompt.

    Raises:
        InputError: Counts of images, prompts and seeds disagree.
    """
    out = QualityResult()
    compared = compare_images(
        out, baseline_images, candidate_images, prompts, seeds=seeds, clip=clip,
        fid_features=fid_features, reference_images=reference_images, batch_size=batch_size,
        extracted=extracted, confidence=confidence, prompts_count=prompts_count,
    )  # fmt: skip
    measure_metrics(TASK, compared, out, confidence)
    return out


def compare_images(
    out: QualityResult,
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
) -> ImageComparison:
    """Compare both image sets once (arguments as :func:`t2i_quality`'s): the comparison the
    metrics read; ``out`` gets the tables, the image pairs (worst first), the notes and the
    figures beside the metrics' (the worst pair, each model's CLIP score, FD and KID)."""
    pairs = pair_similarities(baseline_images, candidate_images)
    if len(pairs) != len(prompts) or (seeds is not None and len(seeds) != len(prompts)):
        raise InputError(f"{len(pairs)} image pairs, {len(prompts)} prompts, "
                         f"{'no' if seeds is None else len(seeds)} seeds")  # fmt: skip
    s = summarize(pairs)
    out.measured.update(psnr_min_db=s.psnr_worst, ssim_min=s.ssim_worst,
                        baseline_broken_share=share(flat(img) for img in baseline_images))  # fmt: skip
    out.quality += [
        QualityRow(metric="PSNR vs baseline (median)", candidate=s.psnr_median, unit="dB"),
        QualityRow(metric="PSNR vs baseline (worst)", candidate=s.psnr_worst, unit="dB"),
        QualityRow(metric="SSIM vs baseline (mean)", candidate=s.ssim_mean),
        QualityRow(metric="SSIM vs baseline (worst)", candidate=s.ssim_worst),
    ]
    units = prompts_count or len(pairs)
    compared = ImageComparison(baseline_images, candidate_images, units, pairs)
    if clip is not None:
        rb, rc = clip.score(baseline_images, prompts), clip.score(candidate_images, prompts)
        compared = dataclasses.replace(compared, clip=(rb, rc))
        out.measured.update(clip_score_baseline=rb.mean, clip_score_candidate=rc.mean)
        out.quality.append(QualityRow(metric=f"CLIP score [{clip.label}]", baseline=rb.mean,
                                      candidate=rc.mean, delta=rc.mean - rb.mean))  # fmt: skip
    if fid_features is not None:
        module = feature_module(fid_features)
        fb, fc = extracted or (
            extract_features(baseline_images, module, batch_size),
            extract_features(candidate_images, module, batch_size),
        )
        compared = _distributions(out, compared, (fb, fc), reference_images, module, batch_size,
                                  confidence)  # fmt: skip
    clip_b, clip_c = compared.clip or (None, None)
    order = sorted(range(len(pairs)), key=lambda i: (pairs[i].psnr_db, pairs[i].ssim, i))
    out.image_pairs = [
        ImagePairRow(index=i, prompt=str(prompts[i]), seed=None if seeds is None else int(seeds[i]),
                     psnr_db=pairs[i].psnr_db, ssim=pairs[i].ssim, mae=pairs[i].mae,
                     max_abs=pairs[i].max_abs,
                     clip_baseline=None if clip_b is None else clip_b.per_image[i],
                     clip_candidate=None if clip_c is None else clip_c.per_image[i])
        for i in order
    ]  # fmt: skip
    return compared


def _feature_space(features: nn.Module) -> str:
    """The label of a feature module's space (FD for any but TF-Inception's)."""
    return str(getattr(features, "feature_space", f"{type(features).__name__}{FD_SUFFIX}"))


def _distributions(
    out: QualityResult,
    compared: ImageComparison,
    features: tuple[torch.Tensor, torch.Tensor],
    reference: ImageBatch | None,
    module: nn.Module,
    batch_size: int,
    confidence: float | None,
) -> ImageComparison:
    """FD of the candidate's features against the baseline's (and of both against the
    reference images' when given), then KID against the reference."""
    space = _feature_space(module)
    fb, fc = features
    vs_base = fid_result(fb, fc, space, "candidate vs baseline")
    name = vs_base.metric
    out.quality.append(QualityRow(metric=f"{name} candidate vs baseline [{space}]",
                                  candidate=vs_base.value, note=f"n={vs_base.n_a}"))  # fmt: skip
    out.notes.append(vs_base.note)
    compared = dataclasses.replace(compared, space=space, fd=vs_base)
    fr = None
    if reference is not None:
        fr = extract_features(reference, module, batch_size)
        rb = fid_result(fr, fb, space, "baseline vs reference")
        rc = fid_result(fr, fc, space, "candidate vs reference")
        out.measured.update(fid_baseline_vs_reference=rb.value,
                            fid_candidate_vs_reference=rc.value)  # fmt: skip
        out.quality.append(QualityRow(metric=f"{name} vs reference [{space}]", baseline=rb.value,
                                      candidate=rc.value, delta=rc.value - rb.value,
                                      note=f"n={rb.n_b} vs {rb.n_a} reference"))  # fmt: skip
        compared = dataclasses.replace(compared, fd_reference=(rb, rc))
    if space != INCEPTION_SPACE:
        out.notes.append(f"{space}: a Fréchet distance in a non-Inception feature space; "
                         "not comparable with published FID values")  # fmt: skip
    if fr is not None:
        compared = dataclasses.replace(compared, kid=_kid(out, (fb, fc, fr), compared.units,
                                                          confidence, space))  # fmt: skip
    return compared


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
) -> KidDelta | None:
    """KID of baseline and candidate (``features``: theirs and the reference's) against the
    reference, their delta (the distribution criterion) and its interval when asked for."""
    fb, fc, fr = features
    if prompts < 2 or fr.shape[0] < 2 or fb.shape[0] % prompts:
        out.notes.append("KID not computed: it needs at least 2 prompts and 2 reference images")
        return None
    result = kid_delta(fb, fc, fr, prompts, confidence)
    out.measured.update(kid_baseline_vs_reference=result.baseline,
                        kid_candidate_vs_reference=result.candidate)  # fmt: skip
    where = kid_space(space)
    pairing = ("paired by prompt" if result.paired
               else f"vs {result.references} reference images, unpaired")  # fmt: skip
    out.quality.append(QualityRow(metric=f"KID vs reference [{where}]", baseline=result.baseline,
                                  candidate=result.candidate, delta=result.delta,
                                  note=f"n={prompts} prompts, {pairing}"))  # fmt: skip
    out.notes.append(KID_NOTE + (KID_PAIRED if result.paired else KID_UNPAIRED))
    if space != INCEPTION_SPACE:
        out.notes.append(f"KID in {where} features: not comparable with published KID values")
    return result


# --- what a t2i suite's metrics read beside the images ----------------------------------------


def suite_clip(name: str | None, allow_pickle: bool = False) -> tuple[Any, Any, str] | None:
    """A suite's ``metrics.clip`` loaded: (CLIP model, its processor, its label); None: none
    named. A local directory, a zoo name (``shapes-clip``) or any ``<scheme>:<name>``."""
    if name is None:
        return None
    from opsnn_quant.evaluation.clip_score import load_local_clip

    if Path(name).is_dir():
        model, processor = load_local_clip(name, allow_pickle=allow_pickle)
        return model, processor, Path(name).name
    from opsnn_quant.sources import model_path

    # A bare name is a zoo model (shapes-clip); any <scheme>:<name> source works too.
    source = name if ":" in name else f"zoo:{name}"
    model, processor = load_local_clip(str(model_path(source)))
    return model, processor, name


def clip_metrics(suite: SuiteSpec, allow_pickle: bool = False) -> tuple[Any, Any]:
    """(CLIP scorer or None, FD features: ``"inception"``, CLIP features or None)."""
    clip = suite_clip(suite.metrics.clip, allow_pickle)
    scorer = None
    if clip is not None:
        scorer = ClipScorer(clip[0], clip[1], clip[2])
    if suite.metrics.fid_features == "clip":
        if clip is None:
            raise ConfigError("metrics.fid_features: clip needs metrics.clip")
        from opsnn_quant.evaluation.fid import ClipImageFeatures

        return scorer, ClipImageFeatures.from_processor(clip[0], clip[1], clip[2])
    return scorer, "inception" if suite.metrics.fid_features == "inception" else None


def reference_images(suite: SuiteSpec, records: list[dict[str, Any]]) -> list[np.ndarray] | None:
    """The suite's reference images: its dataset records' own (``data.reference: dataset``),
    one per prompt; None otherwise."""
    if suite.data.reference != "dataset":
        return None
    return [
        np.asarray(r["image"].convert("RGB") if hasattr(r["image"], "convert") else r["image"])
        for r in records
    ]


def _prepare(inputs: TaskInputs, adapter: ModelAdapter, allow_pickle: bool) -> TaskInputs:
    """The suite's CLIP (scorer and FD features), loaded once."""
    scorer, features = clip_metrics(inputs.suite, allow_pickle)
    return dataclasses.replace(inputs, clip=scorer, features=features)


def _compare(
    inputs: TaskInputs,
    baseline: list[Any],
    candidate: list[Any],
    extracted: tuple[torch.Tensor, torch.Tensor] | None,
    confidence: float | None,
) -> QualityResult:
    """:func:`t2i_quality` of the images of every prompt and suite seed (seed-major)."""
    suite, n = inputs.suite, len(inputs.inputs)
    return t2i_quality(
        baseline, candidate, inputs.inputs * len(suite.seeds),
        seeds=[seed + i for seed in suite.seeds for i in range(n)], clip=inputs.clip,
        fid_features=inputs.features, reference_images=reference_images(suite, inputs.records),
        extracted=extracted, confidence=confidence, prompts_count=n,
    )  # fmt: skip


# --- the metrics -------------------------------------------------------------------------------

_T2I = frozenset({TASK})


def _needs_features(suite: SuiteSpec) -> str | None:
    return (
        None if suite.metrics.fid_features else "FID and KID thresholds need metrics.fid_features"
    )


def _needs_reference(suite: SuiteSpec) -> str | None:
    if suite.data.reference is None:
        return "metrics.thresholds.{names} needs data.reference (real images)"
    return _needs_features(suite)


def _needs_clip(suite: SuiteSpec) -> str | None:
    return None if suite.metrics.clip else "{names} needs metrics.clip"


def _fd_delta(c: ImageComparison) -> float | None:
    if c.fd_reference is None:
        return None
    rb, rc = c.fd_reference
    return rc.value - rb.value


def _clip_delta(c: ImageComparison) -> float | None:
    return None if c.clip is None else c.clip[1].mean - c.clip[0].mean


def _clip_differences(c: ImageComparison) -> list[float] | None:
    if c.clip is None:
        return None
    rb, rc = c.clip
    return list(np.asarray(rc.per_image, dtype=np.float64) - np.asarray(rb.per_image))


def _median(drawn: np.ndarray) -> np.ndarray:
    return np.median(drawn, axis=1)


# Neutral labels: a comparison's names the feature space (FID or FD).
FD_VS_BASELINE = register_metric(Metric(
    key="fid_vs_baseline", tasks=_T2I, comparator="<=", bound="fid_vs_baseline_max",
    label="Fréchet distance candidate vs baseline", default_bound=10.0, bound_range=Range(0.0),
    compute=lambda c: None if c.fd is None else c.fd.value,
    label_of=lambda c: f"{c.fd.metric} candidate vs baseline [{c.space}]",
    requires=_needs_features,
))  # fmt: skip
FD_DELTA = register_metric(Metric(
    key="fid_delta", tasks=_T2I, comparator="<=", default_bound=2.0, signed=True,
    label="Fréchet distance vs reference, candidate - baseline", compute=_fd_delta,
    label_of=lambda c: f"{c.fd.metric} vs reference, candidate - baseline [{c.space}]",
    requires=_needs_reference,
))  # fmt: skip
KID_DELTA = register_metric(Metric(
    key="kid_delta", tasks=_T2I, comparator="<=", default_bound=0.02, signed=True,
    label="KID vs reference, candidate - baseline",
    compute=lambda c: None if c.kid is None else c.kid.delta,
    interval=lambda c, level: None if c.kid is None else c.kid.interval,  # kid.py's U-statistic
    label_of=lambda c: f"KID vs reference, candidate - baseline [{kid_space(c.space)}]",
    requires=_needs_reference,
))  # fmt: skip
# Also a video's (t2v), whose comparison gives ``clip`` per video: its frames' mean (:mod:`.t2v`).
CLIP_SCORE_DELTA = register_metric(Metric(
    key="clip_score_delta", tasks=_T2I | {"t2v"}, comparator=">=", default_bound=-0.5, signed=True,
    label="CLIP score, candidate - baseline", compute=_clip_delta,
    per_sample=_clip_differences, requires=_needs_clip,
))  # fmt: skip
PSNR_MEDIAN = register_metric(Metric(
    key="psnr_median_db", tasks=_T2I, comparator=">=", bound="psnr_min", default_bound=18.0,
    label="median PSNR vs baseline (dB)", bound_range=Range(0.0),
    per_sample=lambda c: [p.psnr_db for p in c.pairs], statistic=_median,
))  # fmt: skip
SSIM_MEAN = register_metric(Metric(
    key="ssim_mean", tasks=_T2I, comparator=">=", bound="ssim_min", default_bound=0.6,
    label="mean SSIM vs baseline", bound_range=Range(-1.0, 1.0),
    per_sample=lambda c: [p.ssim for p in c.pairs],
))  # fmt: skip

register_task(Task(
    name=TASK, outputs="images", unit="prompts", doing="generating {count} images", seeded=True,
    inputs_file="prompts.txt", reference_images=True, prepare=_prepare, compare=_compare,
    fidelity=lambda suite: PSNR_MEDIAN.key,
))  # fmt: skip
