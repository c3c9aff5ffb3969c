"""PNG figures for the report: criteria intervals, sensitivity bars, latency distributions,
image-pair strips, video-pair frame strips.

matplotlib's object API with the Agg canvas (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np

from opsnn_quant.evaluation.report_schema import (
    SENSITIVITY_UNIT,
    Criterion,
    LatencyRow,
    SensitivityRow,
)

_PAIR_MIN_SIDE = 160  # small demo images (32×32) are upscaled, nearest, to be seen
# A video pair's strip: at most this many frames (evenly spaced, first and last included), each
# shown between these heights (nearest up- or subsampling by a whole factor).
STRIP_FRAMES = 8
_FRAME_MIN_SIDE = 64
_FRAME_MAX_SIDE = 128


def _png(fig: object) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # type: ignore[arg-type]
    buf = io.BytesIO()
    canvas.print_png(buf)
    return buf.getvalue()


_STATUS_COLOR = {"PASS": "#2a8a3a", "FAIL": "#c62828", "INCONCLUSIVE": "#b26a00"}
_BOUND_COLOR = "#6a1b9a"  # the threshold line: a colour no status uses


def interval_span(c: Criterion, pad: float = 0.15) -> tuple[float, float]:
    """The x range of a criterion's panel: its interval, value and threshold, padded by ``pad``
    of their spread on each side (a panel always shows where the bound lies against the
    interval, which is what decides PASS / FAIL / INCONCLUSIVE). An infinite end (a PSNR of
    identical images) is left out of the range; the bar then runs to the panel's edge."""
    points = [c.threshold] + [
        v for v in (c.value, c.ci_low, c.ci_high) if v is not None and math.isfinite(v)
    ]
    lo, hi = min(points), max(points)
    width = hi - lo or max(abs(hi), 1.0) * 0.1  # all equal: a small window around them
    return lo - pad * width, hi + pad * width


def interval_chart(criteria: Sequence[Criterion]) -> bytes | None:
    """One panel per criterion with an interval: the value, its interval, the threshold and the
    failing side shaded; None when no criterion has an interval.

    Each panel has its own x axis (a WER delta in points and an SSIM do not share a unit).
    """
    from matplotlib.figure import Figure

    rows = [
        (c, c.ci_low, c.ci_high) for c in criteria if c.ci_low is not None and c.ci_high is not None
    ]
    if not rows:
        return None
    fig = Figure(figsize=(7, 0.9 * len(rows) + 0.6), dpi=100)
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    for ax, (c, ci_low, ci_high) in zip(axes, rows, strict=True):
        lo, hi = interval_span(c)
        color = _STATUS_COLOR.get(c.status, "#777")
        # the side of the threshold that fails: above it for "<=", below it for ">="
        fail_lo, fail_hi = (c.threshold, hi) if c.comparator == "<=" else (lo, c.threshold)
        ax.axvspan(fail_lo, fail_hi, color="#c62828", alpha=0.08, lw=0)
        ax.axvline(c.threshold, color=_BOUND_COLOR, ls="--", lw=2)
        ends = [min(max(v, lo), hi) for v in (ci_low, ci_high)]  # inf: to the edge
        ax.plot(ends, [0, 0], color=color, lw=3, solid_capstyle="butt")
        if c.value is not None and math.isfinite(c.value):
            ax.plot([c.value], [0], "o", color=color, ms=6)
        ax.set_xlim(lo, hi)
        ax.set_ylim(-1, 1)
        ax.set_yticks([])
        level = "" if c.ci_level is None else f" {100 * c.ci_level:g}%"
        n = "" if c.n is None else f", n={c.n}"
        value = "-" if c.value is None else f"{c.value:.4g}"
        ax.set_title(f"{c.key} {c.comparator} {c.threshold:g}: {c.status}; {value} "
                     f"[{ci_low:.4g}, {ci_high:.4g}]{level}{n}", fontsize=8, loc="left")  # fmt: skip
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    return _png(fig)


def sensitivity_bars(
    rows: Sequence[SensitivityRow], top: int = 20
) -> tuple[list[SensitivityRow], list[float], str]:
    """The chart's modules, bar values and axis label.

    The unit is the report table's (``SENSITIVITY_UNIT``, percent of noise energy): the
    estimated end-to-end noise (:meth:`~.report_schema.SensitivityRow.e2e_pct`) when the probe
    measured it, otherwise the local W8A8 noise (:meth:`~.report_schema.SensitivityRow.local_pct`).
    """
    e2e = [r for r in rows if r.contribution is not None]
    if e2e:
        picked = e2e[:top]
        return (
            picked,
            [r.e2e_pct() or 0.0 for r in picked],
            f"e2e noise {SENSITIVITY_UNIT} (of the model output's energy)",
        )
    picked = [r for r in rows if r.sqnr_db is not None][:top]
    return (
        picked,
        [r.local_pct() or 0.0 for r in picked],
        f"local W8A8 noise {SENSITIVITY_UNIT} (of the module output's energy)",
    )


def sensitivity_chart(rows: Sequence[SensitivityRow], top: int = 20) -> bytes | None:
    """Horizontal bars of the ``top`` most sensitive modules (:func:`sensitivity_bars`); None
    when nothing to draw."""
    from matplotlib.figure import Figure

    picked, values, xlabel = sensitivity_bars(rows, top)
    if not picked:
        return None
    fig = Figure(figsize=(8, 0.32 * len(picked) + 1.2), dpi=100)
    ax = fig.add_subplot()
    y = np.arange(len(picked))[::-1]
    colors = ["#d62728" if r.fp16_overflow else "#1f77b4" for r in picked]
    ax.barh(y, values, color=colors)
    ax.set_yticks(y, [f"{r.name} ({r.type})" for r in picked], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_title("Per-module quantization sensitivity (red: fp16 overflow)")
    fig.tight_layout()
    return _png(fig)


def latency_chart(rows: Sequence[LatencyRow]) -> bytes | None:
    """Box plot with every sample of each latency measurement; None without samples."""
    from matplotlib.figure import Figure

    rows = [r for r in rows if r.result.samples_ms]
    if not rows:
        return None
    fig = Figure(figsize=(7, 3.6), dpi=100)
    ax = fig.add_subplot()
    data = [r.result.samples_ms for r in rows]
    try:
        ax.boxplot(data, orientation="horizontal", showfliers=False)  # matplotlib >= 3.10
    except TypeError:  # older matplotlib: the argument was ``vert``
        ax.boxplot(data, vert=False, showfliers=False)
    rng = np.random.default_rng(0)  # fixed jitter: the same report renders the same bytes
    for i, s in enumerate(data, start=1):
        ax.scatter(s, i + rng.uniform(-0.12, 0.12, len(s)), s=10, alpha=0.6, color="#444")
    ax.set_yticks(range(1, len(rows) + 1), [f"{r.label}\n[{r.result.backend}]" for r in rows])
    ax.set_xlabel("latency per call (ms)")
    ax.set_title("Latency distribution")
    fig.tight_layout()
    return _png(fig)


def pair_strip(baseline: np.ndarray, candidate: np.ndarray, diff_gain: float = 4.0) -> bytes:
    """PNG of ``baseline | candidate | |difference| x gain`` for two ``uint8`` HWC images."""
    from PIL import Image

    diff = np.abs(baseline.astype(np.int16) - candidate.astype(np.int16)) * diff_gain
    gap = np.full((baseline.shape[0], max(2, baseline.shape[1] // 16), 3), 255, np.uint8)
    strip = np.concatenate(
        [baseline, gap, candidate, gap, np.clip(diff, 0, 255).astype(np.uint8)], axis=1
    )
    scale = max(1, math.ceil(_PAIR_MIN_SIDE / baseline.shape[0]))
    img = Image.fromarray(strip)
    if scale > 1:
        img = img.resize((strip.shape[1] * scale, strip.shape[0] * scale), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _strip_frames(video: np.ndarray, max_frames: int) -> np.ndarray:
    """At most ``max_frames`` frames of a ``uint8`` video, evenly spaced, first and last
    included, subsampled by a whole factor to at most :data:`_FRAME_MAX_SIDE` rows."""
    count = min(video.shape[0], max_frames)
    picked = np.unique(np.round(np.linspace(0, video.shape[0] - 1, count)).astype(int))
    step = max(1, math.ceil(video.shape[1] / _FRAME_MAX_SIDE))
    return video[picked, ::step, ::step]


def frame_strip(
    baseline: np.ndarray, candidate: np.ndarray, max_frames: int = STRIP_FRAMES
) -> bytes:
    """PNG of a video pair: the baseline's frames side by side in a row above the candidate's
    (two ``uint8`` ``[F, H, W, 3]`` videos; at most ``max_frames`` frames, the same ones)."""
    from PIL import Image

    rows = []
    for video in (baseline, candidate):
        frames = _strip_frames(video, max_frames)
        gap = np.full((frames.shape[1], max(1, frames.shape[2] // 16), 3), 255, np.uint8)
        row = [part for f in frames for part in (f, gap)][:-1]  # a gap between frames
        rows.append(np.concatenate(row, axis=1))
    between = np.full((max(1, rows[0].shape[0] // 8), rows[0].shape[1], 3), 255, np.uint8)
    strip = np.concatenate([rows[0], between, rows[1]], axis=0)
    scale = max(1, math.ceil(_FRAME_MIN_SIDE / rows[0].shape[0]))
    img = Image.fromarray(strip)
    if scale > 1:
        img = img.resize((strip.shape[1] * scale, strip.shape[0] * scale), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
