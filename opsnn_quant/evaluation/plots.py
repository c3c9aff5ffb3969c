"""PNG figures for the report: sensitivity bars, latency distributions, image-pair strips.

matplotlib's object API with the Agg canvas (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np

from opsnn_quant.evaluation.report_schema import SENSITIVITY_UNIT, LatencyRow, SensitivityRow

_PAIR_MIN_SIDE = 160  # small demo images (32×32) are upscaled, nearest, to be seen


def _png(fig: object) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # type: ignore[arg-type]
    buf = io.BytesIO()
    canvas.print_png(buf)
    return buf.getvalue()


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
