"""How far each quantized image moved from the fp32 one: PSNR and SSIM per image pair.

Both come from scikit-image on ``uint8`` pixels (``data_range=255``), the images a user sees.
Pairs share prompt and seed, so a large move is the quantization's doing, not sampling noise
(diffusion sampling is chaotic, though: a small numeric change can flip a detail; look at the
worst pairs in the report before blaming a layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from opsnn_quant.errors import ShapeError
from opsnn_quant.evaluation.images import ImageBatch, as_uint8_nhwc

DATA_RANGE = 255.0
_SSIM_WIN = 7  # scikit-image's default window (Wang et al. use 11 with a Gaussian; 7 is uniform)


@dataclass(frozen=True)
class PairSimilarity:
    """Similarity of one baseline/candidate image pair.

    Attributes:
        index: Position of the pair in the inputs.
        psnr_db: Peak signal-to-noise ratio in dB (``inf`` for identical images).
        ssim: Mean structural similarity over the image and channels (1 for identical images).
        mae: Mean absolute pixel difference (0..255).
        max_abs: Largest absolute pixel difference.
    """

    index: int
    psnr_db: float
    ssim: float
    mae: float
    max_abs: int


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two ``uint8`` images in dB; ``inf`` when they are identical."""
    from skimage.metrics import peak_signal_noise_ratio

    if np.array_equal(a, b):
        return math.inf  # skimage divides by zero here and warns
    return float(peak_signal_noise_ratio(a, b, data_range=DATA_RANGE))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of two ``uint8`` HWC images (scikit-image, ``channel_axis=-1``, data range 255)."""
    from skimage.metrics import structural_similarity

    side = min(a.shape[0], a.shape[1])
    # The window must fit the image and be odd: tiny images get a smaller one.
    win = min(_SSIM_WIN, side if side % 2 else side - 1)
    if win < 3:
        raise ShapeError(f"SSIM needs images of at least 3×3 pixels, got {a.shape[:2]}")
    return float(structural_similarity(a, b, data_range=DATA_RANGE, channel_axis=-1, win_size=win))


def pair_similarities(baseline: ImageBatch, candidate: ImageBatch) -> list[PairSimilarity]:
    """PSNR/SSIM of each candidate image against the baseline image at the same index.

    Raises:
        ShapeError: The batches differ in count or image size.
    """
    base = as_uint8_nhwc(baseline)
    cand = as_uint8_nhwc(candidate)
    if base.shape != cand.shape:
        raise ShapeError(f"baseline images {base.shape} and candidate images {cand.shape} differ")
    rows = []
    for i in range(base.shape[0]):
        diff = np.abs(base[i].astype(np.int16) - cand[i].astype(np.int16))
        rows.append(
            PairSimilarity(
                index=i,
                psnr_db=psnr(base[i], cand[i]),
                ssim=ssim(base[i], cand[i]),
                mae=float(diff.mean()),
                max_abs=int(diff.max()),
            )
        )
    return rows


@dataclass(frozen=True)
class PairSummary:
    """Set-level figures of the image pairs (dB for PSNR).

    The median is used for PSNR because identical pairs are ``inf`` and would make a mean
    meaningless; SSIM is bounded, so its mean is fine.
    """

    psnr_median: float
    psnr_worst: float
    ssim_mean: float
    ssim_worst: float


def summarize(pairs: list[PairSimilarity]) -> PairSummary:
    """Median and minimum PSNR, mean and minimum SSIM of the pairs.

    Raises:
        ShapeError: no pairs.
    """
    if not pairs:
        raise ShapeError("no image pairs to summarise")
    psnrs = [p.psnr_db for p in pairs]
    ssims = [p.ssim for p in pairs]
    return PairSummary(
        psnr_median=float(np.median(psnrs)),
        psnr_worst=float(min(psnrs)),
        ssim_mean=float(np.mean(ssims)),
        ssim_worst=float(min(ssims)),
    )
