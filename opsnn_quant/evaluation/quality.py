"""Quality figures of candidate vs baseline outputs, as a :class:`QualityResult` for
:func:`~opsnn_quant.evaluation.runner.build_report`.

A task's module compares both models' outputs once (:mod:`.t2i`: images; :mod:`.t2v`: videos;
:mod:`.asr`: transcripts) into its :class:`~.metrics.Compared` and the tables and notes the
report shows; :func:`measure_metrics` then measures every metric of the task's on it
(:mod:`.metrics`), with its interval when one is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from pydantic import BaseModel, Field
from torch import nn

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.fid import InceptionFeatures
from opsnn_quant.evaluation.intervals import Interval
from opsnn_quant.evaluation.metrics import TABLE, Compared
from opsnn_quant.evaluation.report_schema import ImagePairRow, QualityRow, TranscriptRow


class QualityResult(BaseModel):
    """Quality measurements ready for :func:`verdict` and :func:`build_report`.

    Attributes:
        measured: Flat figure name -> value: every metric's (its key, :mod:`.metrics`) and the
            task's own figures (e.g. the worst pair's PSNR, each model's WER).
        labels: Measured key -> label for criteria rows (e.g. FD rather than FID).
        quality: Table rows.
        image_pairs / transcripts: Worst first.
        notes: Caveats to print (sample counts, feature spaces).
        intervals: Measured key -> its paired bootstrap interval (:mod:`.intervals`), when
            asked for (``confidence``; None: not asked); a set statistic (FD) has none.
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


def measure_metrics(
    task: str, compared: Compared, out: QualityResult, confidence: float | None
) -> None:
    """Every metric of ``task`` that is measurable on ``compared`` into ``out``: its value,
    its label for this comparison and, at ``confidence`` (None: none), its interval."""
    intervals: dict[str, Interval] = {}
    for metric in TABLE.values():
        if not metric.applies_to(task):
            continue
        value = metric.value(compared)
        if value is None:
            continue
        out.measured[metric.key] = value
        if metric.label_of is not None:
            out.labels[metric.key] = metric.label_of(compared)
        interval = None if confidence is None else metric.interval_at(compared, confidence)
        if interval is not None:
            intervals[metric.key] = interval
    if confidence is not None:
        out.intervals = intervals
    out.samples = compared.units


# A baseline output that says nothing: an image flatter than this (std of its uint8 values) or
# holding NaN/Inf; a transcript that is empty or one token repeated, or of a silent input. A
# broken float model makes every comparison with it pass.
FLAT_STD = 2.0


def flat(image: object) -> bool:
    """Whether an image (or video: frames x H x W x 3) is flat, in uint8 steps, or holds
    NaN/Inf (no pixel value at all)."""
    arr = np.asarray(image, dtype=np.float64)
    if not np.isfinite(arr).all():
        return True
    if arr.size and arr.max() <= 1.0 and np.asarray(image).dtype.kind == "f":
        arr = arr * 255.0  # float images in [0, 1]
    return float(arr.std()) < FLAT_STD


def share(flags: Iterable[bool]) -> float:
    """The share of true ``flags`` (0 when there are none)."""
    values = list(flags)
    return sum(values) / len(values) if values else 0.0


FEATURE_BATCH = 16  # images per feature-extraction batch (FD / FID)


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
