"""Kernel Inception Distance (KID) of image sets, and its paired bootstrap interval by prompt.

KID (Bińkowski et al. 2018, "Demystifying MMD GANs") is the squared maximum mean discrepancy
between two feature distributions under the cubic polynomial kernel

    k(x, y) = (x·y / d + 1)³        (d: the feature size)

estimated without bias: unlike a Fréchet distance, whose plug-in estimate is biased upward by
an amount that depends on n, KID's expected value is the population value at any n, so a
delta measured on 512 prompts means what it means on 5000. The features are those of the
Fréchet distance (:mod:`.fid`: TF-Inception, or the shapes CLIP image space), extracted once.

The acceptance report judges ``kid_delta`` = KID(candidate, reference) − KID(baseline,
reference). Its reference set is the eval split's own images, one per prompt, so a candidate
image and the reference image of its own prompt are *paired* (they show the same scene) and
the pair is not an independent draw of the two distributions. :func:`paired_kid` therefore
uses the U-statistic over distinct prompts (Gretton et al. 2012, MMD²_u), which stays unbiased
under that pairing; :func:`unbiased_mmd2` is the two-sample form of independent sets
(torchmetrics' ``KernelInceptionDistance`` computes it on equal-size subsets), used when the
reference images are not one per prompt (:func:`unpaired_kid`).

The interval resamples prompts with replacement (:func:`kid_delta`), the baseline's,
the candidate's and the reference images of the drawn prompts together, and recomputes the
delta on each resample from the kernel matrices computed once; see :func:`weighted_mmd2` for
the estimator on a resample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.fid import FD_SUFFIX, INCEPTION_SPACE
from opsnn_quant.evaluation.intervals import (
    DEFAULT_CONFIDENCE,
    Interval,
    draw_groups,
    percentile_interval,
)
from opsnn_quant.evaluation.sequential import RESAMPLES

KID_DEGREE = 3  # the cubic kernel of the KID definition
# Resamples per block of the bootstrap: bounds the count matrices' memory for large n.
_BLOCK = 256
# The reference draws of an unpaired interval come from their own seeded stream.
_REFERENCE_STREAM = 1


def kid_space(feature_space: str) -> str:
    """The features a KID was computed in, for its label: ``"inception-v3-tf"`` (KID proper,
    comparable with published values) or the other space's name (e.g. ``"shapes-clip"``)."""
    if feature_space == INCEPTION_SPACE:
        return "inception-v3-tf"
    return feature_space.removesuffix(FD_SUFFIX)


def _array(feats: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = feats.detach().cpu().double().numpy() if isinstance(feats, torch.Tensor) else feats
    out = np.asarray(arr, dtype=np.float64)
    if out.ndim != 2:
        raise InputError(f"features must be [N, D], got shape {out.shape}")
    return out


def poly_kernel(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> np.ndarray:
    """The KID kernel matrix ``K[i, j] = (a_i·b_j / d + 1)³`` of two ``[N, d]`` feature sets.

    Raises:
        InputError: not two 2-D sets of the same feature size.
    """
    x, y = _array(a), _array(b)
    if x.shape[1] != y.shape[1]:
        raise InputError(f"feature sizes differ: {x.shape[1]} and {y.shape[1]}")
    # Always GEMM on a fresh copy of y's transpose: numpy computes x @ x.T with SYRK, whose
    # rounding differs from GEMM's, and a set's kernel with itself and with an exact copy of
    # itself must be the same bits (their KID is then exactly 0, see PairedKernels).
    gram = x @ np.array(y.T, order="C", copy=True)
    return np.asarray((gram / x.shape[1] + 1.0) ** KID_DEGREE)


def unbiased_mmd2(k_xx: np.ndarray, k_yy: np.ndarray, k_xy: np.ndarray) -> float:
    """Unbiased MMD² of two independent sets of sizes m and n from their kernel matrices::

        MMD²_u = Σ_{i≠j} k(x_i, x_j) / (m(m−1)) + Σ_{i≠j} k(y_i, y_j) / (n(n−1))
                 − 2 Σ_{i,j} k(x_i, y_j) / (mn)

    For m = n this is torchmetrics' ``maximum_mean_discrepancy`` (the KID of one subset).

    Raises:
        InputError: a set with fewer than 2 samples, or matrices of mismatched shapes.
    """
    m, n = k_xx.shape[0], k_yy.shape[0]
    if m < 2 or n < 2 or k_xx.shape != (m, m) or k_yy.shape != (n, n) or k_xy.shape != (m, n):
        raise InputError(
            f"MMD² needs >= 2 samples per set and matching kernels, got {k_xx.shape}, "
            f"{k_yy.shape}, {k_xy.shape}"
        )
    xx = (k_xx.sum() - np.trace(k_xx)) / (m * (m - 1))
    yy = (k_yy.sum() - np.trace(k_yy)) / (n * (n - 1))
    return float(xx + yy - 2.0 * k_xy.sum() / (m * n))


def _by_prompt(feats: np.ndarray, prompts: int) -> np.ndarray:
    """Seed-major rows (every prompt for the first seed, then the next) as
    ``seeds x prompts x d``."""
    if prompts <= 0 or feats.shape[0] % prompts:
        raise InputError(f"{feats.shape[0]} feature rows are not whole prompts of {prompts}")
    return feats.reshape(-1, prompts, feats.shape[1])


def _grouped(
    a: np.ndarray, b: np.ndarray, prompts_a: int | None, prompts_b: int | None
) -> np.ndarray:
    """The kernel matrix of two sets with every prompt's seeds averaged: entry ``[u, v]`` is
    the mean kernel of prompt ``u``'s images in ``a`` with prompt ``v``'s in ``b`` (a set
    with ``prompts`` None: one image each)."""
    ga = _by_prompt(a, prompts_a or a.shape[0])
    gb = _by_prompt(b, prompts_b or b.shape[0])
    total = np.zeros((ga.shape[1], gb.shape[1]))
    for sa in ga:
        for sb in gb:
            total += poly_kernel(sa, sb)
    return total / (ga.shape[0] * gb.shape[0])


@dataclass(frozen=True)
class PairedKernels:
    """The kernels of one image set against the reference, by prompt (``m x m``).

    ``h[u, v] = A[u, v] + B[u, v] − C[u, v] − C[v, u]`` with ``A`` the set's kernel matrix,
    ``B`` the reference's and ``C`` the cross one (each prompt's seeds averaged), made exactly
    symmetric: a set that is an exact copy of the reference gives ``h = 0`` to the bit.
    """

    h: np.ndarray

    @classmethod
    def of(cls, images: np.ndarray, reference: np.ndarray, prompts: int) -> PairedKernels:
        """From the set's features (``seeds x prompts`` rows, seed-major) and the reference's
        (one row per prompt)."""
        if reference.shape[0] != prompts:
            raise InputError(f"{reference.shape[0]} reference images for {prompts} prompts")
        a = _grouped(images, images, prompts, prompts)
        b = poly_kernel(reference, reference)
        c = _grouped(images, reference, prompts, None)
        h = a + b - c - c.T
        # a + b - c - c.T: for a copy of the reference (a = b = c bitwise) each entry is
        # c[u, v] - c[v, u], which the GEMM need not make antisymmetric to the bit; the
        # symmetric part of h is the same estimator (u and v enter in both orders) and its
        # entries are then exactly 0.
        return cls((h + h.T) / 2.0)

    @property
    def prompts(self) -> int:
        """The prompts (the matrix side)."""
        return int(self.h.shape[0])

    def value(self) -> float:
        """The paired KID of all prompts (:func:`weighted_mmd2` with every count 1)."""
        return float(weighted_mmd2(self.h, np.ones((1, self.prompts)))[0])


def weighted_mmd2(h: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The unbiased MMD² of each resample from the prompt kernel ``h`` (:class:`PairedKernels`).

    A resample draws prompts ``s_1 … s_m`` with replacement, so prompt ``u`` appears ``w_u``
    times (``counts[r, u]``). Its estimate is the mean of ``h`` over the pairs of draws that
    are *different original prompts*::

        MMD²(w) = Σ_{a,b: s_a ≠ s_b} h[s_a, s_b] / #{a, b: s_a ≠ s_b}
                = (wᵀ h w − Σ_u w_u² h[u, u]) / ((Σ_u w_u)² − Σ_u w_u²)

    A pair of draws that are copies of one original (``s_a = s_b``) would put a sample's kernel
    with itself, or with the reference image of its own prompt, into a U-statistic that must
    only hold independent pairs: it is left out, as the ``i = j`` terms are from the full-set
    estimate, which is this formula with every ``w_u = 1``::

        MMD²_u = Σ_{u≠v} h[u, v] / (m(m−1))

    Returns:
        One value per row of ``counts``; NaN for a resample of one prompt drawn m times (it
        holds no pair).
    """
    w = np.asarray(counts, dtype=np.float64)
    quad = np.einsum("ru,ru->r", w @ h, w) - (w * w) @ np.diag(h)
    pairs = w.sum(axis=1) ** 2 - (w * w).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, quad / np.where(pairs > 0, pairs, 1.0), np.nan)


def paired_kid(
    images: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray, prompts: int
) -> float:
    """KID of an image set against a reference of one image per prompt, paired by prompt.

    ``images``: ``seeds x prompts`` feature rows, seed-major (every prompt for the first
    seed, then the next); ``reference``: one row per prompt, in prompt order. The estimate is
    :func:`weighted_mmd2`'s U-statistic over pairs of distinct prompts: the pairs within one
    prompt (an image and its own prompt's reference, or two seeds of one prompt) are dependent
    and left out, so the estimate is unbiased under the pairing.

    Raises:
        InputError: fewer than 2 prompts, or counts that are not whole prompts.
    """
    if prompts < 2:
        raise InputError("KID needs at least 2 prompts")
    return PairedKernels.of(_array(images), _array(reference), prompts).value()


def unpaired_kid(images: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray) -> float:
    """KID of two independent sets (:func:`unbiased_mmd2` of their kernel matrices)."""
    x, y = _array(images), _array(reference)
    return unbiased_mmd2(poly_kernel(x, x), poly_kernel(y, y), poly_kernel(x, y))


def _counts(draws: np.ndarray, groups: int) -> np.ndarray:
    """Each resample's count per group (``resamples x groups``) from its drawn indices."""
    rows = np.arange(draws.shape[0])[:, None] * groups
    flat = np.bincount((draws + rows).ravel(), minlength=draws.shape[0] * groups)
    return flat.reshape(draws.shape[0], groups).astype(np.float64)


def _blocks(draws: np.ndarray, groups: int, stat: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``stat`` of the resamples' count matrices, :data:`_BLOCK` resamples at a time."""
    parts = [stat(_counts(draws[i : i + _BLOCK], groups)) for i in range(0, draws.shape[0], _BLOCK)]
    return np.concatenate(parts)


@dataclass(frozen=True)
class KidDelta:
    """KID of baseline and candidate against the reference, their difference and its interval.

    Attributes:
        baseline, candidate: KID(baseline, reference), KID(candidate, reference).
        delta: ``candidate - baseline``.
        paired: the reference is one image per prompt, paired with the prompts' images.
        interval: the paired bootstrap interval of ``delta`` (None: not asked for).
        prompts, references: the prompts and reference images the figures come from.
    """

    baseline: float
    candidate: float
    delta: float
    paired: bool
    interval: Interval | None
    prompts: int
    references: int


def kid_delta(
    baseline: torch.Tensor | np.ndarray,
    candidate: torch.Tensor | np.ndarray,
    reference: torch.Tensor | np.ndarray,
    prompts: int,
    level: float | None = DEFAULT_CONFIDENCE,
    *,
    resamples: int = RESAMPLES,
) -> KidDelta:
    """KID(candidate, reference) − KID(baseline, reference), with its bootstrap interval.

    With one reference image per prompt the KIDs are :func:`paired_kid` and the interval
    resamples prompts, each with its baseline and candidate images (every seed) and its
    reference image: the kernel matrices are computed once and each resample is
    :func:`weighted_mmd2` of ``h_candidate − h_baseline`` (the reference's own kernel cancels
    in the difference). Otherwise the reference is an independent set: the KIDs are
    :func:`unpaired_kid`'s (prompts' seeds averaged) and the interval resamples the
    reference images on their own, beside the prompts. The draws are seeded
    (:data:`~.sequential.SEED`; the prompts' draws are :func:`~.intervals.group_bootstrap`'s),
    so the same features give the same interval.

    Args:
        baseline, candidate: ``seeds x prompts`` feature rows each, seed-major.
        reference: The reference images' features.
        prompts: Distinct prompts (the resampling unit).
        level: The interval's confidence; None: no interval.
        resamples: Bootstrap resamples.

    Raises:
        InputError: fewer than 2 prompts or reference images, or mismatched counts.
    """
    fb, fc, fr = _array(baseline), _array(candidate), _array(reference)
    if fb.shape != fc.shape:
        raise InputError(f"baseline features {fb.shape} and candidate's {fc.shape} differ")
    if prompts < 2 or fr.shape[0] < 2:
        raise InputError("KID needs at least 2 prompts and 2 reference images")
    if fr.shape[0] == prompts:
        return _paired_delta(fb, fc, fr, prompts, level, resamples)
    return _unpaired_delta(fb, fc, fr, prompts, level, resamples)


def _paired_delta(
    fb: np.ndarray, fc: np.ndarray, fr: np.ndarray, prompts: int, level: float | None,
    resamples: int,
) -> KidDelta:  # fmt: skip
    kb, kc = PairedKernels.of(fb, fr, prompts), PairedKernels.of(fc, fr, prompts)
    base, cand = kb.value(), kc.value()
    interval = None
    if level is not None:
        diff = kc.h - kb.h
        stats = _blocks(draw_groups(prompts, resamples), prompts, lambda w: weighted_mmd2(diff, w))
        low, high = percentile_interval(stats, level)
        interval = Interval(low=low, high=high, level=level, n=prompts)
    return KidDelta(base, cand, cand - base, True, interval, prompts, prompts)


def _unpaired_parts(fx: np.ndarray, fr: np.ndarray, prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """(the set's kernel by prompt, its cross kernel with the reference by prompt)."""
    return _grouped(fx, fx, prompts, prompts), _grouped(fx, fr, prompts, None)


def _unpaired_delta(
    fb: np.ndarray, fc: np.ndarray, fr: np.ndarray, prompts: int, level: float | None,
    resamples: int,
) -> KidDelta:  # fmt: skip
    n = fr.shape[0]
    ab, cb = _unpaired_parts(fb, fr, prompts)
    ac, cc = _unpaired_parts(fc, fr, prompts)
    krr = poly_kernel(fr, fr)
    base = unbiased_mmd2(ab, krr, cb)
    cand = unbiased_mmd2(ac, krr, cc)
    interval = None
    if level is not None:
        # The reference's own term cancels in the delta; what remains is the difference of
        # the sets' within-set means (distinct prompts) and of their cross means.
        da, dc = ac - ab, cc - cb
        prompt_draws = draw_groups(prompts, resamples)
        ref_draws = draw_groups(n, resamples, stream=_REFERENCE_STREAM)
        parts = []
        for i in range(0, resamples, _BLOCK):
            wx = _counts(prompt_draws[i : i + _BLOCK], prompts)
            wy = _counts(ref_draws[i : i + _BLOCK], n)
            cross = np.einsum("ru,ru->r", wx @ dc, wy) / (wx.sum(1) * wy.sum(1))
            parts.append(weighted_mmd2(da, wx) - 2.0 * cross)
        low, high = percentile_interval(np.concatenate(parts), level)
        interval = Interval(low=low, high=high, level=level, n=prompts)
    return KidDelta(base, cand, cand - base, False, interval, prompts, n)
