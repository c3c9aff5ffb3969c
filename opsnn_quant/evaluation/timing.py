"""The latency part of an acceptance run, as :func:`~.gate.plan_latency` decided it.

Each model timed eagerly gets ``warmup`` + ``runs`` + one memory call (:func:`~.latency.measure`),
with its stage times taken from the timed calls themselves, then, if the suite asks for a
profile, exactly one profiled call (already warm, so no extra warmup). Before this module, the
stages and the profile cost three more calls per model, and every model was timed whether or
not a criterion read the figure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from opsnn_quant.distributed import World, current_world
from opsnn_quant.evaluation.gate import LatencyPlan
from opsnn_quant.evaluation.latency import LatencyResult, measure
from opsnn_quant.evaluation.ort_speed import OrtSpeedResult
from opsnn_quant.evaluation.profile import (
    ModuleTimeRow,
    StabilityResult,
    StageRow,
    StageTimer,
    stability_run,
    top_modules,
)
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.models.base import ModelAdapter

log = logging.getLogger(__name__)
Work = Callable[[ModelAdapter], Callable[[], Any]]


@dataclass
class LatencyFigures:
    """What was measured (None / empty: not measured)."""

    baseline: LatencyResult | None = None
    candidate: LatencyResult | None = None
    stages: dict[str, list[StageRow]] = field(default_factory=dict)
    top_modules: dict[str, list[ModuleTimeRow]] = field(default_factory=dict)
    stability: dict[str, StabilityResult] = field(default_factory=dict)
    onnxruntime: OrtSpeedResult | None = None


def stage_modules(adapter: ModelAdapter) -> dict[str, torch.nn.Module]:
    """Stage name -> the module whose forward runs that stage (:meth:`ModelAdapter.stages`)."""
    named = dict(adapter.model.named_modules())
    return {stage: named[n] for stage, n in adapter.stages().items() if n in named}


def run_latency(
    plan: LatencyPlan,
    suite: Suite,
    baseline: ModelAdapter,
    candidate: ModelAdapter,
    *,
    work: Work,
    items: int,
    baseline_backend: str,
    candidate_backend: str,
    onnx: Callable[[], OrtSpeedResult | None],
    say: Callable[[str], None],
) -> LatencyFigures:
    """Run the measurements ``plan`` asks for.

    Args:
        plan: What to time.
        suite: Warmup, runs, profile rows, stability calls.
        baseline, candidate: The two models.
        work: Adapter -> the call to time (one generation of the latency batch).
        items: Inputs per call (for throughput).
        baseline_backend, candidate_backend: Labels of the eager timings.
        onnx: Produces the ONNX Runtime figure (None when the export is not possible).
        say: Progress callback.
    """
    lat = suite.latency
    out = LatencyFigures()
    if plan.eager:
        for label, adapter, backend in (
            ("baseline", baseline, baseline_backend),
            ("candidate", candidate, candidate_backend),
        ):
            say(f"latency ({label}, {backend})")
            picks = stage_modules(adapter)
            timer = StageTimer(picks) if picks else None
            result = measure(
                work(adapter),
                warmup=lat.warmup,
                runs=lat.runs,
                backend=backend,
                items_per_call=items,
                timed=timer,
            )
            setattr(out, label, result)
            if timer is not None:
                out.stages[label] = timer.rows()
            if plan.profile:
                say(f"profiling top modules ({label})")
                # Warm from the timed calls: one profiled call is enough.
                out.top_modules[label] = top_modules(
                    adapter.model, work(adapter), top=lat.profile_top, warmup=0
                )
        if plan.stability:
            world = current_world()
            k = max(2, len(world.shard(lat.stability_k)))  # each rank its share of the soak
            say(f"stability run ({k} consecutive calls)")
            own = stability_run(work(candidate), k, backend=candidate_backend)
            out.stability = stability_by_rank(world, own)
    if plan.onnx:
        say("ONNX Runtime speed figure (QDQ vs fp32 export)")
        out.onnxruntime = onnx()
    for line in plan.skipped:
        log.info("latency skipped: %s", line)
    return out


def stability_by_rank(world: World, own: StabilityResult) -> dict[str, StabilityResult]:
    """The candidate's stability row; in a distributed run one per rank (its own device's
    drift and memory growth: a leaking or throttling card shows)."""
    if world.size == 1:
        return {"candidate": own}
    every = world.gather(lambda: [(world.rank, world.device, own)])
    return {f"candidate (rank {r}, {d})": res for r, d, res in every}
