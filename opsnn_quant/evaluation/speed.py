"""The speed metrics: the candidate's p99 latency and peak memory over the baseline's.

Measured by timing both models (:mod:`.timing`), not from their outputs, on every task; judged
only on the policy target's own backend (:mod:`.gate`), and never by a measured search's slice
of quality measurements.
"""

from __future__ import annotations

from opsnn_quant.evaluation.latency import LatencyResult
from opsnn_quant.evaluation.metrics import Metric, Range, register_metric

LATENCY_P99_RATIO = register_metric(Metric(
    key="latency_p99_ratio", tasks=None, comparator="<=", speed=True, default_bound=0.9,
    label="p99 latency candidate / baseline", bound_range=Range(0.0, low_excluded=True),
))  # fmt: skip
MEMORY_RATIO = register_metric(Metric(
    key="memory_ratio", tasks=None, comparator="<=", speed=True, default_bound=0.8,
    label="peak memory candidate / baseline", bound_range=Range(0.0, low_excluded=True),
))  # fmt: skip


def latency_measured(baseline: LatencyResult, candidate: LatencyResult) -> dict[str, float | None]:
    """The speed metrics' figures, candidate / baseline (None: unmeasured)."""
    p99 = candidate.p99_ms / baseline.p99_ms if baseline.p99_ms > 0 else None
    mb, mc = baseline.peak_memory_bytes, candidate.peak_memory_bytes
    mem = mc / mb if mb and mc is not None else None
    return {LATENCY_P99_RATIO.key: p99, MEMORY_RATIO.key: mem}
