"""Decide first for a budget of floors: the naive baselines measured before any estimate.

:func:`decide_first` is the policy phase of a searched recipe without ``budget.metric`` (and
without ``search: full``): it measures each naive full-coverage baseline the target runs
(:func:`opsnn_quant.policy.first.first_candidates`), quantized as the quantize phase would
(same calibration data, pass 1's statistics), on the held-out data's recorded root calls
against the float model's outputs, and stops as soon as every modality is decided
(:func:`~opsnn_quant.policy.first.decide_modalities`). The probe's estimators run only when a
modality is left open, and then decide only the open ones. The held-out calls recorded here
are the ones the measure phase replays later (``RunContext.holdout_roots``): recorded once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opsnn_quant.core.determinism import set_reproducible
from opsnn_quant.core.memory import release_memory
from opsnn_quant.core.numerics import fmt_db
from opsnn_quant.pipeline.context import RunContext, measured_key
from opsnn_quant.pipeline.measured import float_copy
from opsnn_quant.policy.budget import Budget, FinalCheckResult
from opsnn_quant.policy.first import (
    DECIDED_FIRST,
    FirstDecision,
    Measured,
    decide_modalities,
    first_candidates,
    meets,
)
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.probe.api import ProbeResult
from opsnn_quant.probe.measure import measure_modalities
from opsnn_quant.probe.outcome import Probed
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.quant.api import SeedsAttention, SeedsCalibration, quantize
from opsnn_quant.recording import RecordedRoots, record_roots
from opsnn_quant.types import Modality

log = logging.getLogger(__name__)

NO_BASELINE = (
    "no naive baseline the target runs covers a modality fully with the schemes probed "
    "(probe.schemes): nothing to measure first"
)


def decides_first(ctx: RunContext) -> bool:
    """Whether the policy phase decides first on floors: a searched recipe without
    ``budget.metric`` (a measured search decides first its own way) and without
    ``search: full``."""
    recipe = ctx.recipe
    return recipe.strategy == "search" and recipe.search == "first" and ctx.run.metric_suite is None


def decide_first(
    ctx: RunContext,
    probe: Probed,
    calibration: Sequence[dict[str, Any]],
    probe_data: Sequence[dict[str, Any]],
    holdout: Sequence[dict[str, Any]] | None,
) -> tuple[ProbeResult, PrecisionPolicy]:
    """The policy, decided on measured baselines where they decide, on the estimates for the
    modalities they leave open; with the probe it was decided on (see the module docstring).

    Args:
        ctx: the run.
        probe: the staged probe (pass 1 at least).
        calibration: the records quantize runs on.
        probe_data: the records the probe ran on (``calibration`` or its first part): when
            they are ``calibration``, quantize seeds from pass 1's statistics, no pass.
        holdout: the held-out records the baselines are measured on (None: the calibration
            calls pass 1 kept, in-sample, said so in the notes).
    """
    budget, target = ctx.recipe.budget, ctx.target
    first = probe.first()
    report = first.report
    candidates = first_candidates(report, budget, target, ctx.recipe.probe.schemes)
    if not candidates:  # e.g. probe.schemes without a naive baseline's scheme
        ctx.say(f"decide first: {NO_BASELINE}; the estimators decide every modality")
        probed = probe.estimated()
        policy = build_policy(probed.report, budget, target)
        return probed, policy.with_notes(f"{DECIDED_FIRST}: {NO_BASELINE}")
    roots, where = _measured_on(ctx, probe, probe_data, holdout)
    stats = first.statistics if probe_data is calibration else None
    decision = FirstDecision(open=[m for m in Modality if report.by_modality(m)])
    measured: list[Measured] = []
    for i, cand in enumerate(candidates):
        ctx.say(f"decide first: {cand.strategy} measured on {where}")
        with ctx.timed("decide first"):
            figures = measure_policy(ctx, report, cand.policy, calibration, stats, roots)
        measured.append(Measured(cand, figures))
        complete = i == len(candidates) - 1
        decision = decide_modalities(report, budget, measured, where, complete=complete)
        if not decision.open:
            break
    if not decision.open:
        probed = probe.settle(decision.skipped())
        policy = build_policy(probed.report, budget, target, fixed=decision.fixed)
        return probed, policy.with_notes(decision.note())
    ctx.say(
        "decide first: open after the baselines: "
        f"{', '.join(m.value for m in decision.open)}; the estimators decide them"
    )
    probed = probe.estimated(decided=[m.value for m in decision.fixed])
    full_stats = probed.statistics if probe_data is calibration else None

    def measure_open(policy: PrecisionPolicy) -> FinalCheckResult:
        # the estimate's choice for the open modalities, measured as the baselines were: a
        # floor it misses tightens that modality's cap (build_policy's final check)
        with ctx.timed("decide first"):
            figures = measure_policy(ctx, probed.report, policy, calibration, full_stats, roots)
        return floors_check(budget, decision.open, figures, where)

    ctx.say("decide first: the estimate's choice for the open modalities measured as well")
    policy = build_policy(
        probed.report, budget, target, final_check=measure_open, fixed=decision.fixed
    )
    return probed, policy.with_notes(decision.note())


def floors_check(
    budget: Budget,
    modalities: Sequence[Modality],
    figures: Mapping[Modality, Mapping[str, float]],
    where: str,
) -> FinalCheckResult:
    """Whether the measured ``figures`` of ``modalities`` meet their floors; the modalities
    that miss theirs are blamed (a modality without a measurement is not)."""
    below = tuple(
        m for m in modalities if m in figures and not meets(budget.limit_for(m), figures[m])
    )
    detail = "; ".join(
        f"{m.value} measured {fmt_db(figures[m].get('sqnr_db'))} on {where} "
        f"({budget.limit_for(m).describe()})"
        for m in modalities
        if m in figures
    )
    return FinalCheckResult(
        passed=not below, metric="measured SQNR", modalities=below, detail=detail
    )


def _measured_on(
    ctx: RunContext,
    probe: Probed,
    probe_data: Sequence[dict[str, Any]],
    holdout: Sequence[dict[str, Any]] | None,
) -> tuple[RecordedRoots, str]:
    """The float root calls the baselines are measured on, and what they are in words."""
    max_calls = ctx.run.probe.max_root_calls
    if holdout is not None:
        ctx.say("recording float outputs on held-out data")
        with ctx.timed("decide first"):
            held = holdout_roots(ctx, holdout)
        calls = sum(len(c) for c in held.calls.values())
        return held, f"{calls} held-out root calls (data.holdout)"
    with ctx.timed("decide first"):
        roots = probe.recorded()
        if roots is None:  # a reused probe keeps no reservoir: record one
            loop = ctx.adapter.forward_loop(list(probe_data))
            roots = record_roots(ctx.adapter, loop, max_calls, ctx.seed, ctx.run.probe.replay_batch)
    calls = sum(len(c) for c in roots.calls.values())
    return roots, f"{calls} calibration root calls (in-sample: the recipe has no data.holdout)"


def holdout_roots(ctx: RunContext, holdout: Sequence[dict[str, Any]]) -> RecordedRoots:
    """The float model's recorded root calls on ``holdout`` (the run's seed + 1), once per run:
    the measure phase replays the same ones."""
    if ctx.holdout_roots is None:
        loop = ctx.adapter.forward_loop(list(holdout))
        max_calls = ctx.run.probe.max_root_calls
        batch = ctx.run.probe.replay_batch  # replayed as the estimator would
        ctx.holdout_roots = record_roots(ctx.adapter, loop, max_calls, ctx.seed + 1, batch)
    return ctx.holdout_roots


def measure_policy(
    ctx: RunContext,
    report: SensitivityReport,
    policy: PrecisionPolicy,
    calibration: Sequence[dict[str, Any]],
    statistics: Mapping[str, SeedsCalibration | SeedsAttention] | None,
    roots: RecordedRoots,
) -> dict[Modality, dict[str, float]]:
    """Quantize a float copy with ``policy`` as the quantize phase would; each modality's
    figures on ``roots`` (:func:`~opsnn_quant.probe.measure.measure_modalities`), kept for the
    measure phase when they are the held-out ones (``RunContext.holdout_figures``)."""
    adapter = float_copy(ctx)
    resolved = policy.resolved(report.inventory(), report.weight_shapes(), tied=report.tied())
    set_reproducible(seed=ctx.seed)
    loop = adapter.forward_loop(list(calibration))
    quantize(adapter.model, resolved, loop, statistics=statistics)
    figures = measure_modalities(adapter, roots)
    if roots is ctx.holdout_roots:  # what the measure phase would measure again
        ctx.holdout_figures[measured_key(resolved)] = figures
    del adapter, loop
    release_memory()  # one quantized copy at a time, its buffers given back
    return figures
