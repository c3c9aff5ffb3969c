"""Which backend a latency criterion is judged on, and what an acceptance run times.

A latency or memory ratio says something about a deployment only when it was measured on that
deployment's own hardware. The policy's target (``policy.yaml``) decides which backends count:

=====================================  ==========================================================
target                                 judged backends
=====================================  ==========================================================
Ascend (``ascend910b-eager``,          ``npu``: torch_npu on the Ascend device itself
``ascend910b-atc``, ``ascend310p``)
``cpu-reference`` (a CPU deployment)   ``cpu-onnxruntime`` (the int8 QDQ graph on ONNX Runtime)
                                       and ``cpu`` (a float candidate in PyTorch eager)
no target known                        none: the run cannot tell what it should be fast on
=====================================  ==========================================================

``cpu-reference`` timing (the quantized eager model on a CPU) is never judged: it emulates the
Ascend integer arithmetic exactly and is a correctness reference, not a speed figure. ``cuda``
is never judged either: no target deploys on it. Elsewhere a latency criterion is reported with
its backend and the status ``NOT JUDGED``; the verdict counts only judged criteria. A suite's
``latency.enforce_backends`` can narrow the judged set further, never widen it.

:func:`plan_latency` decides what to time (``--latency none|target|all``): ``target`` (the
default) times only the figure the suite's latency criteria use, and only where it is judged
(an NPU target's criteria on a CPU are NOT JUDGED: nothing is timed for them), ``all`` every
measurement the suite configures, ``none`` nothing; what is left out is listed for the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.ort_speed import BACKEND as ORT_BACKEND
from opsnn_quant.evaluation.registry import metrics
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.policy.targets import Target

LatencyMode = Literal["none", "target", "all"]
LATENCY_MODES: tuple[LatencyMode, ...] = ("none", "target", "all")
Source = Literal["eager", "onnxruntime"]

NPU_BACKENDS = frozenset({"npu"})
CPU_BACKENDS = frozenset({"cpu", ORT_BACKEND})


def check_latency_mode(mode: str) -> LatencyMode:
    """``mode`` if it is one of :data:`LATENCY_MODES`.

    Raises:
        ConfigError: Any other value; the message lists the valid ones.
    """
    for m in LATENCY_MODES:
        if mode == m:
            return m
    raise ConfigError(f"--latency must be one of {', '.join(LATENCY_MODES)}, got {mode!r}")


def judged_backends(
    target: Target | None, narrow_to: Iterable[str] | None = None
) -> frozenset[str]:
    """Backends whose latency/memory ratios are pass/fail criteria for ``target``.

    Args:
        target: The deployment target (``policy.yaml``'s); None: unknown, nothing is judged.
        narrow_to: The suite's ``latency.enforce_backends``; None keeps the target's set.
    """
    if target is None:
        return frozenset()
    own = CPU_BACKENDS if target.route == "reference" else NPU_BACKENDS
    return own if narrow_to is None else own & frozenset(narrow_to)


def latency_note(backend: str | None, target: Target | None, judged: frozenset[str]) -> str:
    """The criterion row's explanation of why a latency figure is (not) judged."""
    where = backend or "no backend"
    if target is None:
        return (
            f"not judged on {where}: no deployment target is known "
            "(the candidate has no policy.yaml; pass --target)"
        )
    if backend is not None and backend in judged:
        return f"judged on {backend}: the policy targets {target.name}"
    on = ", ".join(sorted(judged)) or "no backend (the suite's enforce_backends excludes them)"
    return f"not judged on {where}: the policy targets {target.name} (judged on {on})"


def pick_source(available: Sequence[tuple[Source, str]], judged: frozenset[str]) -> int | None:
    """Index of the (source, backend) pair the latency criteria use; None if none is available.

    A judged backend wins; otherwise ONNX Runtime (the deployable int8 graph) is a better
    stand-in than eager timing, which on a CPU is the emulated reference.
    """
    if not available:
        return None

    def rank(i: int) -> tuple[int, int, int]:
        source, backend = available[i]
        return (backend not in judged, source != "onnxruntime", i)

    return min(range(len(available)), key=rank)


@dataclass(frozen=True)
class LatencyPlan:
    """What an acceptance run times, and why the rest is skipped.

    Attributes:
        mode: ``none``, ``target`` or ``all``.
        target: The policy's target (None: unknown).
        judged: Backends whose ratios are pass/fail criteria.
        source: What the latency criteria read: ``eager`` (both models timed in PyTorch),
            ``onnxruntime`` (the ONNX export timed on ORT), or None (the suite has no latency
            criterion, or nothing can measure it).
        backend: The backend of ``source`` (also set under ``--latency none``, so the criterion
            still says where it would have been measured).
        eager, onnx, profile, stability: Which measurements run (profile = stages + top modules,
            one profiled call per model).
        skipped: One line per measurement the suite configures but this run leaves out.
    """

    mode: LatencyMode
    target: Target | None
    judged: frozenset[str]
    source: Source | None
    backend: str | None
    eager: bool
    onnx: bool
    profile: bool
    stability: bool
    skipped: tuple[str, ...] = ()


def plan_latency(
    suite: Suite,
    mode: LatencyMode,
    *,
    target: Target | None,
    baseline_backend: str,
    candidate_backend: str,
    onnx_possible: bool,
) -> LatencyPlan:
    """Decide what to time.

    Args:
        suite: The suite (thresholds and ``latency`` settings).
        mode: ``target`` times only the figure the latency criteria use, where it is judged
            (and, when that is the eager timing, the profile and stability run of those same
            models); ``all`` every
            measurement the suite configures; ``none`` nothing.
        target: The policy's target; None: unknown.
        baseline_backend, candidate_backend: Backends of the eager timing.
        onnx_possible: The candidate has int8 modules (an ONNX QDQ export differs from fp32).
    """
    lat = suite.latency
    judged = judged_backends(target, lat.enforce_backends)
    available: list[tuple[Source, str]] = []
    if lat.onnx_speed and onnx_possible:
        available.append(("onnxruntime", ORT_BACKEND))
    available.append(("eager", candidate_backend))
    set_names = suite.metrics.thresholds.set_names()
    wanted = any(m.bound in set_names for m in metrics() if m.speed)
    pick = pick_source(available, judged) if wanted else None
    source, backend = available[pick] if pick is not None else (None, None)
    onnx_asked = lat.onnx_speed and onnx_possible
    if mode == "all":
        eager, onnx = True, onnx_asked
    elif mode == "target" and backend in judged:
        eager, onnx = source == "eager", source == "onnxruntime"
    else:  # none; or target, and no criterion is judged where it would be measured
        eager = onnx = False
    profile = eager and lat.profile_top > 0
    stability = eager and lat.stability_k > 0
    why = {
        "none": "--latency none",
        "target": "no criterion uses it (--latency target; --latency all measures it)",
        "all": "",
    }[mode]
    if mode == "target" and source is not None and backend not in judged:
        # A figure NOT JUDGED costs as much as one judged (on Whisper a CPU timing, profiles
        # and the stability run took longer than the transcription): time it only when asked.
        why = f"{latency_note(backend, target, judged)} (--latency all measures it)"
    skipped = []
    if not eager:
        skipped.append(
            f"eager timing of baseline ({baseline_backend}) and candidate ({candidate_backend}): "
            + why
        )
        if lat.profile_top:
            skipped.append(f"stages and top-{lat.profile_top} module profile: {why}")
        if lat.stability_k:
            skipped.append(f"stability run ({lat.stability_k} calls): {why}")
    if onnx_asked and not onnx:
        skipped.append(f"ONNX Runtime speed figure ({ORT_BACKEND}): {why}")
    return LatencyPlan(
        mode=mode,
        target=target,
        judged=judged,
        source=source,
        backend=backend,
        eager=eager,
        onnx=onnx,
        profile=profile,
        stability=stability,
        skipped=tuple(skipped),
    )
