"""The text-to-video task (``t2v``) and its metrics.

A t2v suite's models generate one video per prompt and seed: ``uint8`` frames ``[F, H, W, 3]``
(prompt ``i`` seeded ``s + i``, seed-major as t2i's images). Both models' videos are compared
once (:func:`compare_videos`) into a :class:`VideoComparison`, frame by frame and across
frames; every metric below reads it, one value per video, and its interval resamples the
prompts with every seed's video (the paired bootstrap of :mod:`.intervals`):

==============================  =================================================================
``video_psnr_median_db``        per video the mean of its per-frame PSNRs (candidate frame ``t``
                                vs baseline frame ``t``, :func:`.image_similarity.psnr`, each
                                at most :data:`FRAME_PSNR_CAP_DB`); the median over videos, dB
                                (bound ``video_psnr_min``, >=)
``video_ssim_mean``             per video the mean of its per-frame SSIMs; their mean
                                (``video_ssim_min``, >=)
``flicker_delta``               per video the temporal change (:func:`temporal_change`: the mean
                                ``|frame[t+1] - frame[t]|``, grey levels 0..255) of the candidate
                                minus the baseline's; their mean (``flicker_delta_max``, <=)
``temporal_psnr_median_db``     per video the PSNR of the candidate's frame differences against
                                the baseline's (:func:`temporal_psnr`); the median, dB
                                (``temporal_psnr_min``, >=)
``clip_score_delta``            t2i's metric: per video the mean over its frames of each frame's
                                CLIP score against the prompt; candidate - baseline
                                (``clip_score_delta_min``, >=; needs ``metrics.clip``)
``clip_temp_delta``             per video the mean cosine of consecutive frames' CLIP image
                                embeddings (CLIP-Temp), candidate - baseline
                                (``clip_temp_delta_min``, >=; needs ``metrics.clip``)
``kvd_delta``                   KVD(candidate, reference) - KVD(baseline, reference) in the
                                suite's video encoder's features (below)
``motion_accuracy_delta``       per video 1 when :func:`.motion.detect_motion` finds the motion
                                of the record's ``motion`` label, else 0; candidate accuracy -
                                baseline accuracy (``motion_accuracy_delta_min``, >=; needs
                                records with a ``motion`` label)
==============================  =================================================================

Why temporal figures: a figure blind to the frames' order (each frame's CLIP score, a
distribution of frames) cannot see frames shown in the wrong order, and a per-frame PSNR cannot
tell an error that stays put from one that alternates from frame to frame (flicker: visible at
a few grey levels, at a PSNR far above any bound). The temporal change sees energy added
between frames (alternate frames a few grey levels darker and brighter add up to twice that to
every frame step), but not a video played backwards (every ``|step|`` kept); the
frame-difference PSNR sees any change in what happens between frames, the float's own frames
reordered included; the motion accuracy sees a reversed motion. Independent per-frame errors
give a frame-difference PSNR 3 dB below the per-frame PSNR (a difference of two frames' errors
has twice their variance): the default bounds keep that gap.

The distribution criterion, ``kvd_delta``: KVD (KID's unbiased kernel MMD², :mod:`.kid`, in a
video encoder's features, :mod:`.video_features`; FVD's role with I3D) of each model's videos
against the suite's reference videos (``data.reference: dataset``: each record's ``video``,
one per prompt, paired as KID's images are), candidate - baseline, with KID's paired bootstrap
interval by prompt (bound ``kvd_delta_max``, <=; needs ``metrics.video_features``). A Fréchet
video distance is not computed (biased at these sizes, as FD is for images).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from opsnn_quant.errors import InputError, ShapeError
from opsnn_quant.evaluation.clip_score import ClipScorer, ClipScoreResult
from opsnn_quant.evaluation.fid import ClipImageFeatures, extract_features
from opsnn_quant.evaluation.image_similarity import DATA_RANGE, pair_similarities
from opsnn_quant.evaluation.images import as_uint8_nhwc
from opsnn_quant.evaluation.kid import KidDelta, kid_delta
from opsnn_quant.evaluation.metrics import Compared, Metric, Range, register_metric
from opsnn_quant.evaluation.motion import MOTIONS, Motion, detect_motion
from opsnn_quant.evaluation.quality import (
    FEATURE_BATCH,
    QualityResult,
    flat,
    measure_metrics,
    share,
)
from opsnn_quant.evaluation.report_schema import ImagePairRow, QualityRow
from opsnn_quant.evaluation.t2i import CLIP_SCORE_DELTA, suite_clip
from opsnn_quant.evaluation.tasks import Task, TaskInputs, register_task
from opsnn_quant.evaluation.video_features import suite_video_encoder, video_features

if TYPE_CHECKING:
    from opsnn_quant.evaluation.suite_schema import SuiteSpec
    from opsnn_quant.models.base import ModelAdapter

TASK = "t2v"

# A frame's PSNR counts at most this in its video's mean: an identical frame's is infinite, and
# one such frame (the first frames of two runs often nearly agree) must not make the mean
# infinite; 60 dB is an RMS error of about a quarter grey level, far above any bound. A video
# whose every frame is identical is infinite, as an identical t2i image is.
FRAME_PSNR_CAP_DB = 60.0
# The record column the motion criterion reads: the motion the prompt asks for.
MOTION_COLUMN = "motion"
NO_DISTRIBUTION_NOTE = (
    "t2v: no distribution criterion (the suite names no metrics.video_features and "
    "data.reference: dataset): the candidate's videos are compared with the float's pair by pair"
)
# The record column of the reference videos (data.reference: dataset).
VIDEO_COLUMN = "video"


@dataclass(frozen=True)
class VideoPair:
    """One baseline/candidate video pair (same prompt and seed).

    Attributes:
        index: Position of the pair in the outputs.
        frames: Frames of each video.
        psnr_db: Mean of the per-frame PSNRs, dB, each at most :data:`FRAME_PSNR_CAP_DB`
            (an identical frame's included); ``inf`` when every frame is identical.
        ssim: Mean of the per-frame SSIMs.
        mae: Mean absolute pixel difference (0..255) over every frame.
        max_abs: Largest absolute pixel difference over every frame.
        change_baseline, change_candidate: Each video's :func:`temporal_change` (grey levels;
            None: a single frame).
        temporal_psnr_db: :func:`temporal_psnr` of the pair (None: a single frame).
    """

    index: int
    frames: int
    psnr_db: float
    ssim: float
    mae: float
    max_abs: int
    change_baseline: float | None
    change_candidate: float | None
    temporal_psnr_db: float | None


def _no_motions() -> tuple[list[Motion | None], list[Motion | None]]:
    return [], []


@dataclass(frozen=True)
class VideoComparison(Compared):
    """Both models' videos compared once: what the t2v metrics read.

    Attributes:
        pairs: each candidate video against the baseline video at its index.
        clip: each model's CLIP score per video, the mean over its frames (``per_image``: one
            per video; None: no CLIP). t2i's ``clip_score_delta`` reads it as it reads images'.
        clip_temp: each model's CLIP-Temp per video (None: no CLIP, or single frames).
        motions: the motion :func:`.motion.detect_motion` finds in each model's videos.
        labels: the motion each video's record asks for (None: the records have none).
    """

    pairs: list[VideoPair]
    clip: tuple[ClipScoreResult, ClipScoreResult] | None = None
    clip_temp: tuple[list[float], list[float]] | None = None
    motions: tuple[list[Motion | None], list[Motion | None]] = field(default_factory=_no_motions)
    labels: list[str] | None = None
    kvd: KidDelta | None = None


@dataclass(frozen=True)
class VideoReference:
    """What the distribution criterion reads: the suite's video encoder and its label, and the
    reference videos (one per prompt)."""

    encoder: nn.Module
    label: str
    videos: list[np.ndarray]


@dataclass(frozen=True)
class VideoModels:
    """What a t2v suite loads once for its metrics (:attr:`TaskInputs.clip` of a t2v suite)."""

    clip: VideoClip | None = None
    reference: VideoReference | None = None


@dataclass(frozen=True)
class VideoClip:
    """What a t2v suite's CLIP gives its metrics: a scorer against the prompts and its image
    embeddings (:class:`~.fid.ClipImageFeatures`) for CLIP-Temp."""

    scorer: ClipScorer
    features: nn.Module


# --- the figures of one video and of a pair ----------------------------------------------------


def as_video(video: Any) -> np.ndarray:
    """A video as ``uint8`` frames ``[F, H, W, 3]`` (from uint8 or ``[0, 1]`` float frames, NHWC
    or NCHW, as :func:`~.images.as_uint8_nhwc` takes an image batch).

    Raises:
        ShapeError: not a stack of RGB frames.
    """
    arr = np.asarray(video)
    if arr.ndim != 4:
        raise ShapeError(f"expected video frames [F, H, W, 3], got shape {arr.shape}")
    return as_uint8_nhwc(arr)


def frame_differences(video: np.ndarray) -> np.ndarray:
    """``frame[t+1] - frame[t]`` of a ``uint8`` video, as int16 ``[F-1, H, W, 3]``."""
    frames = video.astype(np.int16)
    return np.asarray(frames[1:] - frames[:-1])


def temporal_change(video: np.ndarray) -> float | None:
    """The mean over frame steps of the mean ``|frame[t+1] - frame[t]|`` (grey levels 0..255,
    every pixel and channel): how much a video changes from frame to frame, flicker included.
    None for a single frame."""
    if video.shape[0] < 2:
        return None
    return float(np.abs(frame_differences(video)).mean())


def temporal_psnr(baseline: np.ndarray, candidate: np.ndarray) -> float | None:
    """PSNR of the candidate's frame differences against the baseline's, over every frame step
    at once (peak 255, as the frames'), dB; ``inf`` when they are identical, None for a single
    frame."""
    if baseline.shape[0] < 2:
        return None
    error = frame_differences(candidate).astype(np.float64) - frame_differences(baseline)
    mse = float(np.mean(error**2))
    return math.inf if mse == 0 else 10.0 * math.log10(DATA_RANGE**2 / mse)


def video_pair(index: int, baseline: np.ndarray, candidate: np.ndarray) -> VideoPair:
    """The figures of one pair of ``uint8`` videos, frame ``t`` against frame ``t``
    (:func:`~.image_similarity.pair_similarities`) and across frames.

    Raises:
        ShapeError: the videos differ in frames or frame size.
    """
    if baseline.shape != candidate.shape:
        raise ShapeError(f"video {index}: baseline {baseline.shape} and candidate "
                         f"{candidate.shape} differ")  # fmt: skip
    frames = pair_similarities(baseline, candidate)
    psnrs = [p.psnr_db for p in frames]
    psnr = (math.inf if all(math.isinf(p) for p in psnrs)
            else float(np.mean([min(p, FRAME_PSNR_CAP_DB) for p in psnrs])))  # fmt: skip
    return VideoPair(
        index=index, frames=len(frames), psnr_db=psnr,
        ssim=float(np.mean([p.ssim for p in frames])),
        mae=float(np.mean([p.mae for p in frames])), max_abs=max(p.max_abs for p in frames),
        change_baseline=temporal_change(baseline), change_candidate=temporal_change(candidate),
        temporal_psnr_db=temporal_psnr(baseline, candidate),
    )  # fmt: skip


def clip_temp(video: np.ndarray, features: nn.Module) -> float | None:
    """CLIP-Temp of a video: the mean cosine similarity of consecutive frames' embeddings in
    ``features`` (CLIP image embeddings); None for a single frame."""
    if video.shape[0] < 2:
        return None
    emb = torch.nn.functional.normalize(extract_features(video, features, FEATURE_BATCH), dim=1)
    return float((emb[1:] * emb[:-1]).sum(dim=1).mean())


def _clip_scores(scorer: ClipScorer, videos: list[np.ndarray], prompts: Sequence[str]
                 ) -> ClipScoreResult:  # fmt: skip
    """Each video's CLIP score: the mean of its frames' scores against its prompt."""
    per_video = [float(np.mean(scorer.score(v, [str(p)] * v.shape[0]).per_image))
                 for v, p in zip(videos, prompts, strict=True)]  # fmt: skip
    return ClipScoreResult(mean=float(np.mean(per_video)), per_image=per_video,
                           model=scorer.label)  # fmt: skip


# --- the comparison ----------------------------------------------------------------------------


def t2v_quality(
    baseline_videos: Sequence[Any],
    candidate_videos: Sequence[Any],
    prompts: Sequence[str],
    *,
    seeds: Sequence[int] | None = None,
    motions: Sequence[str] | None = None,
    clip: VideoClip | None = None,
    reference: VideoReference | None = None,
    confidence: float | None = None,
    prompts_count: int | None = None,
) -> QualityResult:
    """Quality of candidate videos against baseline videos (same prompts and seeds): the
    comparison's tables and notes (:func:`compare_videos`) and every t2v metric's figure.

    Args:
        baseline_videos, candidate_videos: N videos each (``[F, H, W, 3]``), pair ``i`` from
            prompt ``i``.
        prompts: The N prompts.
        seeds: The N seeds (shown with the pairs).
        motions: The motion each of the N videos' records asks for (one of
            :data:`~.motion.MOTIONS`); None: no motion criterion.
        clip: The suite's CLIP (scorer and image embeddings); None skips the CLIP figures.
        reference: The video encoder and the reference videos (one per prompt) of the
            distribution criterion; None skips it.
        confidence: Also each figure's paired bootstrap interval at this level; None: none.
        prompts_count: Distinct prompts, each with one video per seed in seed-major order
            (the resampling unit); default: every video its own prompt.

    Raises:
        InputError: Counts of videos, prompts, seeds and motions disagree.
        ShapeError: A pair of videos differs in shape, or an output is not a video.
    """
    out = QualityResult()
    compared = compare_videos(
        out, baseline_videos, candidate_videos, prompts, seeds=seeds, motions=motions,
        clip=clip, prompts_count=prompts_count,
    )  # fmt: skip
    if reference is not None:
        compared = _kvd_rows(out, compared, reference, confidence)
    else:
        out.notes.append(NO_DISTRIBUTION_NOTE)
    measure_metrics(TASK, compared, out, confidence)
    return out


def _kvd_rows(
    out: QualityResult, compared: VideoComparison, ref: VideoReference, confidence: float | None
) -> VideoComparison:
    """KVD of each model's videos against the reference videos, their delta and interval."""
    prompts = compared.units
    if prompts < 2 or len(ref.videos) < 2:
        out.notes.append("KVD not computed: it needs at least 2 prompts and 2 reference videos")
        return compared
    fb = video_features(ref.encoder, list(compared.baseline))
    fc = video_features(ref.encoder, list(compared.candidate))
    fr = video_features(ref.encoder, ref.videos)
    result = kid_delta(fb, fc, fr, prompts, confidence)
    out.measured.update(kvd_baseline_vs_reference=result.baseline,
                        kvd_candidate_vs_reference=result.candidate)  # fmt: skip
    pairing = ("paired by prompt" if result.paired
               else f"vs {result.references} reference videos, unpaired")  # fmt: skip
    out.quality.append(QualityRow(metric=f"KVD vs reference [{ref.label}]", baseline=result.baseline,
                                  candidate=result.candidate, delta=result.delta,
                                  note=f"n={prompts} prompts, {pairing}"))  # fmt: skip
    out.notes.append(
        f"KVD: KID's unbiased MMD² under the kernel (x·y/d + 1)^3 in the features of the video "
        f"encoder {ref.label} (comparable only with KVDs in the same features)"
    )
    return dataclasses.replace(compared, kvd=result)


def compare_videos(
    out: QualityResult,
    baseline_videos: Sequence[Any],
    candidate_videos: Sequence[Any],
    prompts: Sequence[str],
    *,
    seeds: Sequence[int] | None = None,
    motions: Sequence[str] | None = None,
    clip: VideoClip | None = None,
    prompts_count: int | None = None,
) -> VideoComparison:
    """Compare both video sets once (arguments as :func:`t2v_quality`'s): the comparison the
    metrics read; ``out`` gets the tables, the video pairs (worst PSNR first), the notes and
    the figures beside the metrics' (the worst video's PSNR, each model's temporal change,
    CLIP score, CLIP-Temp and motion accuracy)."""
    base = [as_video(v) for v in baseline_videos]
    cand = [as_video(v) for v in candidate_videos]
    counts = {len(base), len(cand), len(prompts)} | ({len(seeds)} if seeds is not None else set())
    if motions is not None:
        counts.add(len(motions))
    if len(counts) != 1 or not base:
        raise InputError(f"{len(base)} baseline and {len(cand)} candidate videos, {len(prompts)} "
                         f"prompts, {'no' if seeds is None else len(seeds)} seeds, "
                         f"{'no' if motions is None else len(motions)} motions")  # fmt: skip
    pairs = [video_pair(i, b, c) for i, (b, c) in enumerate(zip(base, cand, strict=True))]
    compared = VideoComparison(base, cand, prompts_count or len(pairs), pairs)
    _frame_rows(out, pairs, base)
    _temporal_rows(out, pairs)
    if clip is not None:
        compared = _clip_rows(out, compared, clip, prompts)
    compared = _motion_rows(out, compared, motions)
    clip_b, clip_c = compared.clip or (None, None)
    order = sorted(range(len(pairs)), key=lambda i: (pairs[i].psnr_db, pairs[i].ssim, i))
    out.image_pairs = [
        ImagePairRow(index=i, prompt=str(prompts[i]), seed=None if seeds is None else int(seeds[i]),
                     psnr_db=pairs[i].psnr_db, ssim=pairs[i].ssim, mae=pairs[i].mae,
                     max_abs=pairs[i].max_abs, frames=pairs[i].frames,
                     clip_baseline=None if clip_b is None else clip_b.per_image[i],
                     clip_candidate=None if clip_c is None else clip_c.per_image[i])
        for i in order
    ]  # fmt: skip
    return compared


def _frame_rows(out: QualityResult, pairs: list[VideoPair], base: list[np.ndarray]) -> None:
    """Frame-by-frame figures: PSNR and SSIM per video, the baseline's health."""
    psnrs, ssims = [p.psnr_db for p in pairs], [p.ssim for p in pairs]
    out.measured.update(video_psnr_min_db=min(psnrs), video_ssim_min=min(ssims),
                        baseline_broken_share=share(flat(v) for v in base))  # fmt: skip
    frames = f"{pairs[0].frames} frames per video"
    out.quality += [
        QualityRow(metric="PSNR vs baseline, mean over frames (median video)",
                   candidate=float(np.median(psnrs)), unit="dB", note=frames),
        QualityRow(metric="PSNR vs baseline, mean over frames (worst video)",
                   candidate=min(psnrs), unit="dB"),
        QualityRow(metric="SSIM vs baseline, mean over frames (mean)", candidate=float(np.mean(ssims))),
        QualityRow(metric="SSIM vs baseline, mean over frames (worst video)", candidate=min(ssims)),
    ]  # fmt: skip


def _temporal_rows(out: QualityResult, pairs: list[VideoPair]) -> None:
    """Across-frame figures: each model's temporal change, the frame-difference PSNR."""
    if any(p.change_baseline is None for p in pairs):
        out.notes.append("single-frame videos: no temporal figure (flicker, frame differences)")
        return
    cb = float(np.mean([p.change_baseline or 0.0 for p in pairs]))
    cc = float(np.mean([p.change_candidate or 0.0 for p in pairs]))
    out.measured.update(temporal_change_baseline=cb, temporal_change_candidate=cc)
    temporal = [p.temporal_psnr_db or 0.0 for p in pairs]
    out.quality += [
        QualityRow(metric="temporal change |frame t+1 - frame t| (mean)", baseline=cb,
                   candidate=cc, delta=cc - cb, unit="grey levels"),
        QualityRow(metric="frame-difference PSNR vs baseline (median video)",
                   candidate=float(np.median(temporal)), unit="dB"),
    ]  # fmt: skip


def _clip_rows(
    out: QualityResult, compared: VideoComparison, clip: VideoClip, prompts: Sequence[str]
) -> VideoComparison:
    """Each model's CLIP score (mean over frames) and CLIP-Temp."""
    base, cand = compared.baseline, compared.candidate
    rb, rc = _clip_scores(clip.scorer, base, prompts), _clip_scores(clip.scorer, cand, prompts)
    out.measured.update(clip_score_baseline=rb.mean, clip_score_candidate=rc.mean)
    out.quality.append(QualityRow(metric=f"CLIP score, mean over frames [{clip.scorer.label}]",
                                  baseline=rb.mean, candidate=rc.mean, delta=rc.mean - rb.mean))  # fmt: skip
    compared = dataclasses.replace(compared, clip=(rb, rc))
    tb = [clip_temp(v, clip.features) for v in base]
    tc = [clip_temp(v, clip.features) for v in cand]
    if any(t is None for t in tb + tc):
        return compared
    temp = ([t or 0.0 for t in tb], [t or 0.0 for t in tc])
    mb, mc = float(np.mean(temp[0])), float(np.mean(temp[1]))
    out.measured.update(clip_temp_baseline=mb, clip_temp_candidate=mc)
    out.quality.append(QualityRow(metric=f"CLIP-Temp, consecutive frames' cosine [{clip.scorer.label}]",
                                  baseline=mb, candidate=mc, delta=mc - mb))  # fmt: skip
    return dataclasses.replace(compared, clip_temp=temp)


def _motion_rows(
    out: QualityResult, compared: VideoComparison, motions: Sequence[str] | None
) -> VideoComparison:
    """The motion found in every video; with the records' labels, each model's accuracy."""
    found = ([detect_motion(v) for v in compared.baseline],
             [detect_motion(v) for v in compared.candidate])  # fmt: skip
    compared = dataclasses.replace(compared, motions=found)
    if motions is None:
        return compared
    labels = [str(m).strip().lower() for m in motions]
    ab, ac = (float(np.mean([f == lab for f, lab in zip(m, labels, strict=True)])) for m in found)
    out.measured.update(motion_accuracy_baseline=ab, motion_accuracy_candidate=ac)
    out.quality.append(QualityRow(metric="motion accuracy (detected motion = prompt's)",
                                  baseline=ab, candidate=ac, delta=ac - ab,
                                  note="detector: opsnn_quant.evaluation.motion"))  # fmt: skip
    return dataclasses.replace(compared, labels=labels)


# --- what a t2v suite's metrics read beside the videos ----------------------------------------


def _prepare(inputs: TaskInputs, adapter: ModelAdapter, allow_pickle: bool) -> TaskInputs:
    """The suite's CLIP (scorer and image embeddings) and its video encoder with the reference
    videos, loaded once (:class:`VideoModels`, in ``clip``); no image FD features."""
    suite = inputs.suite
    loaded = suite_clip(suite.metrics.clip, allow_pickle)
    clip = None
    if loaded is not None:
        model, processor, label = loaded
        clip = VideoClip(ClipScorer(model, processor, label),
                         ClipImageFeatures.from_processor(model, processor, label))  # fmt: skip
    reference = None
    encoder = suite_video_encoder(suite.metrics.video_features)
    if encoder is not None and suite.data.reference == "dataset":
        videos = [as_video(np.asarray(r[VIDEO_COLUMN], dtype=np.uint8)) for r in inputs.records]
        reference = VideoReference(encoder[0], encoder[1], videos)
    return dataclasses.replace(inputs, clip=VideoModels(clip, reference), features=None)


def _compare(
    inputs: TaskInputs,
    baseline: list[Any],
    candidate: list[Any],
    extracted: tuple[torch.Tensor, torch.Tensor] | None,
    confidence: float | None,
) -> QualityResult:
    """:func:`t2v_quality` of the videos of every prompt and suite seed (seed-major), with the
    records' motion labels where every record has one."""
    suite, n = inputs.suite, len(inputs.inputs)
    labels = [r.get(MOTION_COLUMN) for r in inputs.records]
    motions = None if any(not lab for lab in labels) else [str(x) for x in labels]
    models = inputs.clip if isinstance(inputs.clip, VideoModels) else VideoModels()
    return t2v_quality(
        baseline, candidate, inputs.inputs * len(suite.seeds),
        seeds=[seed + i for seed in suite.seeds for i in range(n)],
        motions=None if motions is None else motions * len(suite.seeds), clip=models.clip,
        reference=models.reference, confidence=confidence, prompts_count=n,
    )  # fmt: skip


# --- the metrics -------------------------------------------------------------------------------

_T2V = frozenset({TASK})


def _needs_motion_labels(suite: SuiteSpec) -> str | None:
    """A folder's ``prompts.txt`` has prompts only: no record can carry a motion label."""
    if suite.data.folder is None:
        return None
    return (
        f"{{names}} needs records with a {MOTION_COLUMN!r} label, but data.folder's "
        f"{T2V.inputs_file} holds prompts only: name a data.dataset whose records have a "
        f"{MOTION_COLUMN!r} column (e.g. shapes-video)"
    )


def _motion_records(records: Sequence[dict[str, Any]]) -> str | None:
    """Every record must say its motion, one the detector knows."""
    for i, record in enumerate(records):
        label = record.get(MOTION_COLUMN)
        if not label:
            return (f"{{names}} needs a {MOTION_COLUMN!r} label in every record; record {i} has "
                    f"none (its columns: {', '.join(record) or 'none'})")  # fmt: skip
        if str(label).strip().lower() not in MOTIONS:
            return (f"{{names}}: record {i}'s {MOTION_COLUMN} {label!r} is not one the detector "
                    f"finds ({', '.join(MOTIONS)})")  # fmt: skip
    return None


def _needs_reference_videos(suite: SuiteSpec) -> str | None:
    """KVD needs the encoder's features and the dataset's own videos as the reference."""
    missing = []
    if suite.metrics.video_features is None:
        missing.append("metrics.video_features (a video encoder: shapes-video-encoder or a dir)")
    if suite.data.reference != "dataset":
        missing.append("data.reference: dataset (the records' own videos, one per prompt)")
    return None if not missing else "{names} needs " + " and ".join(missing)


def _reference_records(records: Sequence[dict[str, Any]]) -> str | None:
    """Every record must hold its reference video."""
    for i, record in enumerate(records):
        if VIDEO_COLUMN not in record:
            return (f"{{names}} needs a {VIDEO_COLUMN!r} (the reference video) in every record; "
                    f"record {i} has none (its columns: {', '.join(record) or 'none'})")  # fmt: skip
    return None


def _per_video(field: str) -> Any:
    """A figure of each pair, in the outputs' order (None: not measured, single frames)."""

    def per_sample(c: VideoComparison) -> list[float] | None:
        values = [getattr(p, field) for p in c.pairs]
        return None if any(v is None for v in values) else values

    return per_sample


def _flicker(c: VideoComparison) -> list[float] | None:
    if any(p.change_baseline is None or p.change_candidate is None for p in c.pairs):
        return None
    return [(p.change_candidate or 0.0) - (p.change_baseline or 0.0) for p in c.pairs]


def _clip_temp_differences(c: VideoComparison) -> list[float] | None:
    if c.clip_temp is None:
        return None
    tb, tc = c.clip_temp
    return [b_ - a_ for a_, b_ in zip(tb, tc, strict=True)]


def _motion_differences(c: VideoComparison) -> list[float] | None:
    """Per video: candidate correct - baseline correct (-1, 0 or 1)."""
    if c.labels is None:
        return None
    fb, fc = c.motions
    return [float(m_c == lab) - float(m_b == lab) for m_b, m_c, lab in zip(fb, fc, c.labels,
                                                                            strict=True)]  # fmt: skip


def _median(drawn: np.ndarray) -> np.ndarray:
    return np.median(drawn, axis=1)


VIDEO_PSNR_MEDIAN = register_metric(Metric(
    key="video_psnr_median_db", tasks=_T2V, comparator=">=", bound="video_psnr_min",
    default_bound=18.0, bound_range=Range(0.0),
    label="median over videos of the mean per-frame PSNR vs baseline (dB)",
    per_sample=_per_video("psnr_db"), statistic=_median,
))  # fmt: skip
VIDEO_SSIM_MEAN = register_metric(Metric(
    key="video_ssim_mean", tasks=_T2V, comparator=">=", bound="video_ssim_min",
    default_bound=0.6, bound_range=Range(-1.0, 1.0),
    label="mean over videos of the mean per-frame SSIM vs baseline",
    per_sample=_per_video("ssim"),
))  # fmt: skip
FLICKER_DELTA = register_metric(Metric(
    key="flicker_delta", tasks=_T2V, comparator="<=", default_bound=1.0, bound_range=Range(0.0),
    signed=True, per_sample=_flicker,
    label="temporal change |frame t+1 - frame t|, candidate - baseline (grey levels)",
))  # fmt: skip
# 3 dB under the per-frame bound: independent per-frame errors lose 3 dB in frame differences
TEMPORAL_PSNR_MEDIAN = register_metric(Metric(
    key="temporal_psnr_median_db", tasks=_T2V, comparator=">=", bound="temporal_psnr_min",
    default_bound=15.0, bound_range=Range(0.0),
    label="median frame-difference PSNR vs baseline (dB)",
    per_sample=_per_video("temporal_psnr_db"), statistic=_median,
))  # fmt: skip
CLIP_TEMP_DELTA = register_metric(Metric(
    key="clip_temp_delta", tasks=_T2V, comparator=">=", default_bound=-0.01,
    bound_range=Range(-2.0, 2.0), signed=True, per_sample=_clip_temp_differences,
    label="CLIP-Temp (consecutive frames' cosine), candidate - baseline",
    requires=CLIP_SCORE_DELTA.requires,  # the same problem: one message names both bounds
))  # fmt: skip
MOTION_ACCURACY_DELTA = register_metric(Metric(
    key="motion_accuracy_delta", tasks=_T2V, comparator=">=", default_bound=-0.05,
    bound_range=Range(-1.0, 1.0), signed=True, per_sample=_motion_differences,
    label="motion accuracy (detected = prompt's), candidate - baseline",
    requires=_needs_motion_labels, requires_records=_motion_records,
))  # fmt: skip

KVD_DELTA = register_metric(Metric(
    key="kvd_delta", tasks=_T2V, comparator="<=", default_bound=0.02, signed=True,
    label="KVD vs reference, candidate - baseline",
    compute=lambda c: None if c.kvd is None else c.kvd.delta,
    interval=lambda c, level: None if c.kvd is None else c.kvd.interval,  # kid.py's U-statistic
    requires=_needs_reference_videos, requires_records=_reference_records,
))  # fmt: skip

T2V = register_task(Task(
    name=TASK, outputs="videos", unit="prompts", doing="generating {count} videos", seeded=True,
    inputs_file="prompts.txt", reference_images=True, prepare=_prepare, compare=_compare,
    fidelity=lambda suite: VIDEO_PSNR_MEDIAN.key,
))  # fmt: skip
