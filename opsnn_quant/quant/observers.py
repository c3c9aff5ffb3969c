"""Streaming activation observers: ``collect`` batches, ``compute`` int8 quant params, ``reset``.

No observer stores activations: min/max is two numbers; the others keep one fixed-size signed
histogram whose range doubles (merging bin pairs) when a batch exceeds it.

Every observer merges (:meth:`Observer.merge`): the statistics of two shares of the data give
those of one pass over both, bit for bit. For the histograms that takes a grid that does not
depend on the data's order: the radius is a power of two (the smallest above every |x| seen),
a value's bin is ``floor(x * 2^s)`` computed exactly (no rounding of ``x + R`` as
``torch.histc`` has), so a histogram of radius ``R`` doubled is the histogram of radius ``2R`` of
the same values; and counts are whole numbers of elements (a subsampled batch's count is its
stride), summed exactly in float64.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np
import torch

from opsnn_quant.errors import CalibrationError

QMIN, QMAX = -128, 127
# Scales below this would make 1/scale overflow fp16 (where torch_npu takes it in the input dtype).
MIN_SCALE = 2.0**-15


class QParams(NamedTuple):
    """Per-tensor int8 parameters: ``q = rint(x / scale + offset)``, ``x ~ (q - offset) * scale``."""

    scale: float
    offset: float


def qparams_from_range(lo: float, hi: float, symmetric: bool) -> QParams:
    """int8 scale/offset covering [lo, hi] (the range always includes 0).

    Symmetric: ``scale = max(|lo|, |hi|) / 127``, offset 0. Asymmetric: ``scale = (hi - lo) / 255``
    and the integer offset that maps ``lo`` to -128 (clamped to the int8 range).
    """
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if symmetric:
        return QParams(max(max(-lo, hi) / QMAX, MIN_SCALE), 0.0)
    scale = max((hi - lo) / (QMAX - QMIN), MIN_SCALE)
    offset = float(np.clip(np.rint(QMIN - lo / scale), QMIN, QMAX))
    return QParams(scale, offset)


@torch.no_grad()
def observed_span(x: torch.Tensor) -> tuple[float, float]:
    """``(min, max)`` of a non-empty ``x``.

    Raises:
        CalibrationError: ``x`` holds NaN or Inf.
    """
    lo, hi = torch.aminmax(x.detach())
    lo_f, hi_f = float(lo), float(hi)
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
        raise CalibrationError("activations contain NaN or Inf")
    return lo_f, hi_f


class Observer(ABC):
    """Collects activation statistics and turns them into :class:`QParams`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything collected."""
        self.count = 0
        self.min = math.inf
        self.max = -math.inf

    @torch.no_grad()
    def collect(self, x: torch.Tensor, span: tuple[float, float] | None = None) -> None:
        """Add one batch of activations.

        Args:
            x: the batch.
            span: its :func:`observed_span`, when the caller has it already (several
                observers of one input share one reduction).

        Raises:
            CalibrationError: The batch holds NaN or Inf (the caller adds the module name).
        """
        if x.numel() == 0:
            return
        xf = x.detach().to(torch.float32)
        lo_f, hi_f = observed_span(xf) if span is None else span
        self.count += x.numel()
        self.min, self.max = min(self.min, lo_f), max(self.max, hi_f)
        self._collect(xf, max(-lo_f, hi_f))

    def _collect(self, x: torch.Tensor, absmax: float) -> None:  # noqa: B027 - optional hook
        """Subclass hook, called with finite fp32 data."""

    def merge(self, other: Observer) -> None:
        """Add what ``other`` (an observer of the same kind) collected."""
        self.count += other.count
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)

    def compute(self, symmetric: bool = True) -> QParams:
        """Quant params from everything collected so far.

        Raises:
            CalibrationError: Nothing was collected.
        """
        if self.count == 0:
            raise CalibrationError("the observer saw no data")
        lo, hi = self._range(symmetric)
        return qparams_from_range(lo, hi, symmetric)

    @abstractmethod
    def _range(self, symmetric: bool) -> tuple[float, float]:
        """The clipping range [lo, hi]."""


class MinMaxObserver(Observer):
    """The full observed range."""

    def _range(self, symmetric: bool) -> tuple[float, float]:
        return self.min, self.max


class HistogramObserver(Observer):
    """Base of the histogram observers: a signed histogram over [-R, R] that grows by doubling.

    Batches larger than ``max_samples`` elements are histogrammed on an evenly strided subset
    (deterministic; every ``step``-th element, counted ``step`` times); the observed min/max
    stay exact. Binning is the cost of these observers on CPU, and a 64k-element sample pins
    down a 2048-bin shape well. The radius is a power of two (see the module docstring).
    """

    bins = 2048
    max_samples = 65536

    def reset(self) -> None:
        """Forget everything collected."""
        super().reset()
        self.radius = 0.0
        self.hist = np.zeros(self.bins, dtype=np.float64)

    @torch.no_grad()
    def collect_abs(self, x: torch.Tensor, absmax: float) -> None:
        """:meth:`collect` of ``|x|`` (``absmax``: its finite max, known to the caller) without
        an ``|x|`` copy of the whole batch: the histogram is of the same strided subset, made
        absolute. The observed minimum is taken as 0 (a symmetric range does not read it)."""
        if x.numel() == 0:
            return
        self.count += x.numel()
        self.min, self.max = min(self.min, 0.0), max(self.max, absmax)
        self._collect(x.detach().to(torch.float32), absmax, absolute=True)

    def _collect(self, x: torch.Tensor, absmax: float, absolute: bool = False) -> None:
        self._cover(absmax)
        flat = x.reshape(-1)
        # An evenly strided subset of a big batch; each element sampled stands for ``step``.
        step = -(-flat.numel() // self.max_samples)
        if step > 1:
            flat = flat[::step]
        if absolute:
            flat = flat.abs()
        self.hist += step * bin_counts(flat, self.radius, self.bins)

    def merge(self, other: Observer) -> None:
        """Add what ``other`` (a histogram observer) collected: both histograms on the larger
        one's grid (a power-of-two radius: the smaller one's bins merge exactly)."""
        assert isinstance(other, HistogramObserver)
        super().merge(other)
        if other.radius == 0.0:
            return
        theirs = other.hist.copy()
        radius = other.radius
        while radius < self.radius:
            theirs, radius = _doubled(theirs), radius * 2.0
        self._cover(other.radius / 2.0)  # grows to the other's radius (absmax < radius)
        self.hist += theirs

    def _cover(self, absmax: float) -> None:
        """Grow the radius until it is above ``absmax`` (the first batch: the smallest power
        of two above it)."""
        if self.radius == 0.0:
            self.radius = 2.0 ** math.frexp(absmax)[1] if absmax > 0 else 2.0**-27
        while absmax >= self.radius:
            # Double the range: old bin pairs merge into the middle half of the new histogram.
            self.hist, self.radius = _doubled(self.hist), self.radius * 2.0

    @property
    def bin_width(self) -> float:
        """Width of one bin of the signed histogram."""
        return 2.0 * self.radius / self.bins

    def centers(self) -> np.ndarray:
        """Centres of the signed histogram's bins."""
        return -self.radius + (np.arange(self.bins) + 0.5) * self.bin_width

    def abs_hist(self) -> np.ndarray:
        """Histogram of |x| over [0, R] with ``bins/2`` bins."""
        half = self.bins // 2
        return self.hist[half:] + self.hist[:half][::-1]


def _doubled(hist: np.ndarray) -> np.ndarray:
    """A histogram over [-R, R] as the one over [-2R, 2R] (bin pairs merged, centred)."""
    merged = hist.reshape(-1, 2).sum(axis=1)
    out = np.zeros_like(hist)
    q = hist.size // 4
    out[q : q + merged.size] = merged
    return out


@torch.no_grad()
def bin_counts(flat: torch.Tensor, radius: float, bins: int) -> np.ndarray:
    """Counts of ``flat`` (|x| < ``radius``, a power of two) in ``bins`` equal bins of
    [-radius, radius): bin ``floor(x / width) + bins / 2``, the division an exact power-of-two
    scaling in float64 (so a value's bin is the same on any grid of this family)."""
    inverse = bins / (2.0 * radius)  # a power of two
    index = torch.floor(flat.to(torch.float64) * inverse).long() + bins // 2
    counts = torch.bincount(index.clamp_(0, bins - 1), minlength=bins)  # on x's device
    return counts.cpu().to(torch.float64).numpy()


class PercentileObserver(HistogramObserver):
    """Clips at a percentile of |x| (symmetric) or at both tails (asymmetric)."""

    def __init__(self, percentile: float = 99.99) -> None:
        self.percentile = percentile
        super().__init__()

    def _range(self, symmetric: bool) -> tuple[float, float]:
        p = self.percentile / 100.0
        if symmetric:
            cdf = np.cumsum(self.abs_hist())
            k = int(np.searchsorted(cdf, p * cdf[-1]))
            t = min((k + 1) * self.bin_width, max(-self.min, self.max))
            return -t, t
        cdf = np.cumsum(self.hist)
        lo_k = int(np.searchsorted(cdf, (1.0 - p) * cdf[-1]))
        hi_k = int(np.searchsorted(cdf, p * cdf[-1]))
        lo = max(-self.radius + lo_k * self.bin_width, self.min)
        hi = min(-self.radius + (hi_k + 1) * self.bin_width, self.max)
        return lo, hi


class MSEObserver(HistogramObserver):
    """Searches the clipping range that minimises the int8 quantization MSE on the histogram.

    In the spirit of AMCT's IFMR: candidate ranges ``ratio * observed range`` for ratios in
    [``start``, ``end``] with ``step``. The error of a candidate is modelled per bin: values
    inside the range carry uniform rounding noise ``scale**2 / 12``; values outside it the
    squared clipping distance from the bin centre. The noise model keeps the estimate valid when
    a quantization step is finer than a histogram bin (heavy tails stretch the histogram).
    """

    def __init__(self, start: float = 0.3, end: float = 1.0, step: float = 0.01) -> None:
        self.ratios = np.arange(start, end + step / 2, step)
        super().__init__()

    def _range(self, symmetric: bool) -> tuple[float, float]:
        v, c = self.centers(), self.hist
        keep = c > 0
        v, c = v[keep], c[keep]
        lo0, hi0 = min(self.min, 0.0), max(self.max, 0.0)
        # Every candidate ratio at once (one row each): the same float64 operations, in the same
        # order, as qparams_from_range and a per-ratio sum (a row's sum is numpy's pairwise sum of
        # that row, as of a 1-D array); the first smallest error wins, as a strict ``<`` scan.
        lo, hi = lo0 * self.ratios, hi0 * self.ratios
        if symmetric:
            hi = np.maximum(-lo, hi)
            lo = -hi
            scale = np.maximum(hi / QMAX, MIN_SCALE)
            offset = np.zeros_like(scale)
        else:
            scale = np.maximum((hi - lo) / (QMAX - QMIN), MIN_SCALE)
            offset = np.clip(np.rint(QMIN - lo / scale), QMIN, QMAX)
        qlo, qhi = (QMIN - offset) * scale, (QMAX - offset) * scale
        clip = np.clip(v[None, :], qlo[:, None], qhi[:, None])
        err = np.sum(c[None, :] * ((v[None, :] - clip) ** 2 + (scale**2 / 12.0)[:, None]), axis=1)
        best = int(np.argmin(err))
        return float(lo[best]), float(hi[best])


class KLObserver(HistogramObserver):
    """Entropy calibration (as TensorRT's): the |x| threshold minimising KL(P || Q) at 128 levels."""

    levels = 128
    stride = 8

    def _range(self, symmetric: bool) -> tuple[float, float]:
        hist = self.abs_hist()
        # Thresholds up to the observed |x| max (the radius is the power of two above it: the
        # bins past it are empty, and a threshold there only spreads the levels thinner).
        absmax = max(-self.min, self.max)
        n = int(min(hist.size, max(self.levels, math.ceil(absmax / self.bin_width))))
        best_i, best_kl = n, math.inf
        for i in range(self.levels, n + 1, self.stride):
            p = hist[:i].copy()
            p[-1] += hist[i:].sum()
            if p.sum() == 0:
                continue
            # Q: merge the i bins into `levels` groups, spread each group's mass over the bins
            # where P is not empty (MXNet's ``_get_optimal_threshold``: P's last bin holds the
            # clipped tail even where that bin of the histogram is empty, so a sparse tail does
            # not rule the threshold out).
            q = np.zeros(i)
            edges = np.linspace(0, i, self.levels + 1).astype(int)
            for a, b in itertools.pairwise(edges):
                seg = hist[a:b]
                nz = p[a:b] > 0
                if nz.any():
                    q[a:b][nz] = seg.sum() / nz.sum()
            ps, qs = p / p.sum(), q / max(q.sum(), 1e-30)
            m = ps > 0
            if (qs[m] == 0).any():
                continue
            kl = float(np.sum(ps[m] * np.log(ps[m] / qs[m])))
            if kl < best_kl:
                best_i, best_kl = i, kl
        t = min(best_i * self.bin_width, max(-self.min, self.max))
        if symmetric:
            return -t, t
        return max(self.min, -t), min(self.max, t)


def make_observer(name: str, percentile: float = 99.99) -> Observer:
    """Observer by name: ``minmax``, ``percentile``, ``mse`` or ``kl``."""
    if name == "minmax":
        return MinMaxObserver()
    if name == "percentile":
        return PercentileObserver(percentile)
    if name == "mse":
        return MSEObserver()
    if name == "kl":
        return KLObserver()
    raise CalibrationError(f"unknown observer {name!r}")
