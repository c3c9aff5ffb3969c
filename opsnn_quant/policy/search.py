"""``build_policy(report, budget, target)``: decide precisions from the probe's measurements.

How (per modality, deterministic for the same inputs):

1. Modules the fp16 overflow probe flagged are pinned: bf16 when the target has it and the
   probe's bf16 relative error is small, else fp32. The evidence goes into the reason.
2. Every other Linear/Conv2d the target can run in int8 gets, among the schemes the target
   allows, the one with the smallest end-to-end contribution when the probe scored every scheme
   end to end; for a probe that scored only the locally best scheme, the one with the best local
   SQNR, its contribution rescaled to that scheme (first order, see
   :func:`~opsnn_quant.policy._schemes.contribution_for`).
3. While the summed contributions exceed the modality's noise budget, the module with the largest
   contribution per MAC (MACs stand in for the latency int8 saves) falls back to fp16. Then fallen
   back modules are re-admitted, largest first, when they still fit.
4. If the int8 modules then cover less than ``budget.min_int8_mac_share`` of the modality's MACs,
   the whole modality stays fp16.
5. With a ``final_check`` hook, a failing check tightens the blamed modalities' noise caps by
   ``tighten_db`` and the search runs again, at most ``max_iterations`` times; after that the
   blamed modalities go fp16.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from functools import partial

from opsnn_quant.core.numerics import fmt_db
from opsnn_quant.policy._folded import plain_schemes, share_smoothing
from opsnn_quant.policy._fused import fuse_candidates, unfuse_fallbacks
from opsnn_quant.policy._plan import Fixed, ModalityPlan
from opsnn_quant.policy._rules import emit_rules, pin_for
from opsnn_quant.policy._schemes import Choice, best_choice, noise_to_db
from opsnn_quant.policy.budget import Budget, FinalCheckResult, FinalCheckSettings
from opsnn_quant.policy.schema import ModalityFigures, PrecisionPolicy, derive_prefixes
from opsnn_quant.policy.targets import CPU_REFERENCE, Target
from opsnn_quant.probe.report import ModuleSensitivity, SensitivityReport
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision

log = logging.getLogger(__name__)

FinalCheck = Callable[[PrecisionPolicy], FinalCheckResult]


def _r(x: float, digits: int = 6) -> float:
    # Figures go into YAML: a fixed number of significant digits keeps the bytes stable.
    return float(f"{x:.{digits}g}")


def _candidates(
    modules: list[ModuleSensitivity],
    pinned: set[str],
    target: Target,
    plan: ModalityPlan,
    smoothing_groups: Mapping[str, list[str]],
) -> dict[str, tuple[ModuleSensitivity, Choice]]:
    """Each int8 candidate with its best scheme among those ``target`` runs on it (SmoothQuant,
    on a target that folds it, only in the probe's smoothing groups, one per group); the
    modules that cannot be one go to ``plan.fallback`` with the reason."""
    groups = smoothing_groups if target.smoothing == "fold" else {}
    grouped = {n for members in groups.values() for n in members}

    def runs(m: ModuleSensitivity) -> tuple[str, ...]:
        schemes = target.schemes(m.type)
        folds = target.smoothing == "fold"
        return plain_schemes(schemes) if folds and m.name not in grouped else schemes

    cands: dict[str, tuple[ModuleSensitivity, Choice]] = {}
    for m in modules:
        if not m.quantizable or m.name in pinned:
            continue
        if m.calls == 0:
            plan.fallback[m.name] = "stays float: never ran in the calibration forward_loop"
            continue
        tie = target.tie_reason(m.tied_to)
        if tie is not None:
            plan.fallback[m.name] = f"stays float: {tie}"
            continue
        allowed = _allowed(m, target)
        if not allowed:
            _, why = target.can_run(m.type, Precision.W8A8, weight_shape=m.weight_shape)
            plan.fallback[m.name] = f"stays float: {why}"
            continue
        # only what the target's engine runs (a report probed for another target has more)
        choice = best_choice(m, allowed, target.timestep_scales, runs(m))
        if choice is None and m.refused is not None:  # every scheme infeasible: the reason
            plan.fallback[m.name] = f"stays float: {m.refused}"
            continue
        if choice is None:
            plan.fallback[m.name] = (
                "stays float: the probe has no end-to-end estimate for a scheme "
                f"{target.name} runs ({', '.join(p.value for p in sorted(allowed))})"
            )
            continue
        # the target's engine arithmetic and dtype: what the module computes is what deploys
        cands[m.name] = (m, dataclasses.replace(choice, spec=target.spec_for(choice.spec)))
    allowed_of = partial(_allowed, target=target)
    fused = target.fused_layers(m.name for m in modules)
    restrict = share_smoothing(cands, groups, allowed_of, runs, target, plan.fallback, fused)
    fuse_candidates(
        cands, fused, plan.fallback, allowed_of, target, lambda m: restrict.get(m.name, runs(m))
    )
    return cands


def _allowed(m: ModuleSensitivity, target: Target) -> set[Precision]:
    """The int8 precisions ``target`` runs on ``m`` (its type and weight shape)."""
    return {
        p
        for p in target.int8_precisions(m.type)
        if target.can_run(m.type, p, weight_shape=m.weight_shape)[0]
    }


def _fit_budget(
    cands: dict[str, tuple[ModuleSensitivity, Choice]], order: dict[str, int], cap: float
) -> tuple[list[str], list[str], float]:
    """(kept, removed, noise of the kept): the largest contributions per MAC fall back until
    the summed first-order noise fits ``cap``, then what still fits is re-admitted."""

    def ratio(name: str) -> tuple[float, float, int]:
        m, ch = cands[name]
        per_mac = ch.contribution / m.macs if m.macs > 0 else (math.inf if ch.contribution else 0.0)
        return -per_mac, -ch.contribution, order[name]

    def total(names: list[str]) -> float:
        # fsum in model order: exact enough for hand-checked budgets, same bytes on every run.
        return math.fsum(cands[n][1].contribution for n in sorted(names, key=order.__getitem__))

    keep = list(cands)
    removed: list[str] = []
    noise = total(keep)
    for name in sorted(cands, key=ratio):  # largest contribution per MAC first
        if noise <= cap:
            break
        keep.remove(name)
        removed.append(name)
        noise = total(keep)
    # Re-admit what still fits, biggest layers first: the greedy pass may have overshot.
    for name in sorted(removed, key=lambda n: (-cands[n][0].macs, order[n])):
        if total([*keep, name]) <= cap:
            keep.append(name)
            removed.remove(name)
            noise = total(keep)
    return keep, removed, noise


def _plan_modality(
    modality: Modality,
    modules: list[ModuleSensitivity],
    pinned: set[str],
    target: Target,
    cap: float,
    limit_text: str,
    min_share: float,
    force_fp16: str | None,
    smoothing_groups: Mapping[str, list[str]],
) -> ModalityPlan:
    plan = ModalityPlan(modality)
    total_macs = sum(max(m.macs, 0) for m in modules)
    cands = _candidates(modules, pinned, target, plan, smoothing_groups)
    if force_fp16 is not None:
        for name in cands:
            plan.fallback[name] = f"fp16: {force_fp16}"
        plan.note = force_fp16
        return plan
    order = {m.name: i for i, m in enumerate(modules)}
    keep, removed, noise = _fit_budget(cands, order, cap)
    groups = target.fused_layers(cands)
    if groups:  # a fused layer falls back whole
        keep, removed = unfuse_fallbacks(keep, removed, groups)
        noise = math.fsum(cands[n][1].contribution for n in sorted(keep, key=order.__getitem__))
    keep.sort(key=order.__getitem__)
    int8_macs = sum(cands[n][0].macs for n in keep)
    share = int8_macs / total_macs if total_macs > 0 else 0.0
    after = fmt_db(noise_to_db(noise))
    for name in sorted(removed, key=order.__getitem__):
        m, ch = cands[name]
        plan.fallback[name] = (
            f"fp16 fallback: est. contribution {ch.contribution:.2e} ({ch.scheme}, first order) "
            f"over {m.macs:.2e} MACs; with the fallbacks {modality.value} is predicted at "
            f"{after} ({limit_text})"
        )
    if not keep or share < min_share:
        what = "no module can be int8" if not keep else f"int8 would cover {share:.0%} of its MACs"
        plan.note = (
            f"whole modality fp16: {what} (< {min_share:.0%} min_int8_mac_share), "
            "not worth the accuracy risk"
        )
        for name in keep:
            plan.fallback[name] = f"fp16: {plan.note}"
        return plan
    plan.int8 = {n: cands[n][1] for n in keep}
    plan.noise, plan.mac_share, plan.chosen = noise, share, "int8"
    plan.note = (
        f"{len(keep)} of {len(cands)} int8 candidates kept; predicted {after} ({limit_text})"
    )
    return plan


def _plan_fixed(
    modality: Modality,
    modules: list[ModuleSensitivity],
    pinned: set[str],
    target: Target,
    fixed: Fixed,
    min_share: float,
) -> ModalityPlan:
    """A modality decided first (``fixed``): every module the target runs in the baseline's
    precision int8 with it, the overflow pins kept (they come from pass 1), a fused layer with
    a float member float whole, and the whole modality fp16 where full coverage is below
    ``min_share`` (as the search would: no policy can cover more)."""
    plan = ModalityPlan(modality)
    total_macs = sum(max(m.macs, 0) for m in modules)
    precisions = (fixed.precision, Precision.A8) if fixed.attention else (fixed.precision,)
    cands: dict[str, tuple[ModuleSensitivity, Choice]] = {}
    for m in modules:
        if not m.quantizable or m.name in pinned:
            continue
        tie = target.tie_reason(m.tied_to)
        why = (
            "stays float: never ran in the calibration forward_loop" if m.calls == 0
            else f"stays float: {tie}" if tie is not None
            else f"stays float: {m.refused}" if m.refused is not None
            else None
        )  # fmt: skip
        runs = [p for p in precisions if target.can_run(m.type, p, weight_shape=m.weight_shape)[0]]
        if why is None and not runs:
            _, refusal = target.can_run(m.type, fixed.precision, weight_shape=m.weight_shape)
            why = f"stays float: {refusal}"
        if why is not None:
            plan.fallback[m.name] = why
            continue
        spec = target.spec_for(QuantSpec(runs[0]))
        cands[m.name] = (m, Choice(fixed.strategy, spec, None, 0.0, False, reason=fixed.reason))
    for members in target.fused_layers(m.name for m in modules):
        floats = [n for n in members if n not in cands]
        for n in members if floats else ():
            if n in cands:
                del cands[n]
                plan.fallback[n] = f"stays float: fused with {', '.join(members)} ({floats[0]})"
    share = sum(m.macs for m, _ in cands.values()) / total_macs if total_macs > 0 else 0.0
    if not cands or share < min_share:
        what = "no module can be int8" if not cands else f"int8 would cover {share:.0%} of its MACs"
        plan.note = (
            f"whole modality fp16: {what} (< {min_share:.0%} min_int8_mac_share), "
            "not worth the accuracy risk"
        )
        plan.fallback.update({n: f"fp16: {plan.note}" for n in cands})
        return plan
    plan.int8 = {n: ch for n, (_, ch) in cands.items()}
    plan.mac_share, plan.chosen, plan.note = share, "int8", fixed.reason
    return plan


def _decide(
    report: SensitivityReport,
    budget: Budget,
    target: Target,
    caps: dict[Modality, float],
    forced: dict[Modality, str],
    bf16_tolerance: float,
    compact: bool,
    notes: list[str],
    fixed: Mapping[Modality, Fixed] | None = None,
) -> PrecisionPolicy:
    pins = {}
    for m in report.modules:
        pin = pin_for(m, target, bf16_tolerance)
        if pin is not None:
            pins[m.name] = pin
    modalities = [mod for mod in Modality if report.by_modality(mod)]
    plans, figures = [], {}
    for mod in modalities:
        limit = budget.limit_for(mod)
        first = (fixed or {}).get(mod)
        if first is not None:
            plan = _plan_fixed(
                mod, report.by_modality(mod), set(pins), target, first,
                budget.min_int8_mac_share,
            )  # fmt: skip
        else:
            plan = _plan_modality(
                mod, report.by_modality(mod), set(pins), target, caps[mod],
                limit.describe(), budget.min_int8_mac_share, forced.get(mod),
                report.smoothing_groups,
            )  # fmt: skip
        plans.append(plan)
        db = noise_to_db(plan.noise)
        predicted = plan.int8 and first is None  # a modality decided first has no prediction
        figures[mod] = ModalityFigures(
            chosen="int8" if plan.chosen == "int8" else "fp16",
            predicted_sqnr_db=None if db is None or first is not None else round(db, 3),
            predicted_cosine=round(1.0 / math.sqrt(1.0 + plan.noise), 6) if predicted else None,
            noise=_r(plan.noise),
            int8_mac_share=round(plan.mac_share, 4),
            limit=limit.describe(),
            note=plan.note,
        )
    prefixes = derive_prefixes((m.name, m.modality) for m in report.modules)
    defaults = {mod: Precision.FP16 for mod in modalities}
    rules = emit_rules(report, pins, plans, prefixes, defaults, compact=compact)
    return PrecisionPolicy(
        model=report.model,
        target=target.name,
        modalities=prefixes,
        defaults=defaults,
        rules=rules,
        smoothing_groups=_shared_factors(report.smoothing_groups, plans),
        budget=budget,
        figures=figures,
        notes=list(notes),
    )


def _shared_factors(
    groups: Mapping[str, list[str]], plans: list[ModalityPlan]
) -> dict[str, list[str]]:
    """The probe's smoothing groups with a smoothed int8 member in the plans (the others
    need no shared factor)."""
    smoothed = {n for p in plans for n, ch in p.int8.items() if ch.spec.smoothquant}
    return {p: list(ms) for p, ms in sorted(groups.items()) if smoothed.intersection(ms)}


def build_policy(
    report: SensitivityReport,
    budget: Budget | None = None,
    target: Target = CPU_REFERENCE,
    final_check: FinalCheck | None = None,
    *,
    bf16_tolerance: float = 1e-2,
    compact: bool = True,
    fixed: Mapping[Modality, Fixed] | None = None,
) -> PrecisionPolicy:
    """Decide a precision policy from a probe report.

    Args:
        report: the probe's SensitivityReport.
        budget: accuracy floors and the MAC-share threshold (defaults: no floors, 0.5).
        target: the deployment target (:func:`~opsnn_quant.policy.targets.get_target`);
            nothing it cannot run is assigned.
        final_check: optional end-to-end check of a candidate policy (e.g. the evaluator). A
            failing result makes the search fall back more modules and retry (bounded by
            ``budget.final_check.max_iterations``, 3 when unset).
        bf16_tolerance: an overflowing module goes bf16 (where the target has it) only when the
            probe's bf16 relative error is below this; otherwise fp32.
        compact: the fewest rules that resolve every module as one exact rule per module
            would (exact names and subtree globs within a modality; pins stay exact); False
            gives one exact rule per decided module.

    Returns:
        The policy; its YAML is byte-identical for the same inputs.
    """
    budget = budget or Budget()
    modalities = [mod for mod in Modality if report.by_modality(mod)]
    caps = {mod: budget.limit_for(mod).max_noise() for mod in modalities}
    forced: dict[Modality, str] = {}
    args = (bf16_tolerance, compact)
    policy = _decide(report, budget, target, caps, forced, *args, notes=[], fixed=fixed)
    if final_check is None:
        if budget.final_check is not None:
            log.info("budget.final_check is set but no final_check hook was given; skipped")
        return policy
    settings = budget.final_check or FinalCheckSettings(metric="", max_delta=0.0)
    notes: list[str] = []
    attempt = 0
    while True:
        attempt += 1
        result = final_check(policy)
        notes.append(_check_note(attempt, result))
        if result.passed or forced:
            break
        int8_now = [mod for mod, f in policy.figures.items() if f.chosen == "int8"]
        blamed = [mod for mod in (result.modalities or int8_now) if mod in int8_now]
        if not blamed:
            break  # nothing left to fall back
        for mod in blamed:
            if attempt >= settings.max_iterations:
                forced[mod] = f"final check still failing after {attempt} attempt(s)"
            else:
                tightened = min(caps[mod], policy.figures[mod].noise)
                caps[mod] = tightened * 10.0 ** (-settings.tighten_db / 10.0)
        policy = _decide(report, budget, target, caps, forced, *args, notes=[], fixed=fixed)
    if not result.passed:
        log.warning("final check did not pass; returning the most conservative policy tried")
    return policy.with_notes(*notes)


def _check_note(attempt: int, result: FinalCheckResult) -> str:
    verdict = "passed" if result.passed else "failed"
    delta = "" if result.delta is None else f", delta {result.delta:.4g}"
    detail = f": {result.detail}" if result.detail else ""
    return f"final check {attempt} {verdict} ({result.metric or 'metric'}{delta}){detail}"
