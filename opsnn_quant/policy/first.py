"""Decide first: a budget of floors (``budget.limits``) judged on measured naive baselines.

Before any estimator runs, ``calibrate`` measures the naive full-coverage baselines the target
runs (static W8A8 min/max first: no per-token quantization at run time; then W8A8 dynamic;
with int8 attention on a target that runs it) on held-out data: each modality's output SQNR
against the float model's (:func:`opsnn_quant.probe.measure.measure_modalities`, every root
replayed on float inputs, so a modality's figure does not depend on the others' precision).
A modality that one of them covers fully (every module the target runs in int8 is int8 in
it, overflow pins apart) and that meets its floor is *decided*: no policy has more int8 MACs
there, so no estimate could change the choice. The estimators run only when a modality is
left open; they decide the open ones, the decided ones keep their baseline
(:func:`~opsnn_quant.policy.search.build_policy`'s ``fixed``).

A modality without a floor takes the first baseline that covers it (the budget accepts any
error there); a recipe that wants the whole search anyway says ``search: full``.

Pure functions of the report, the budget and the measurements: the measuring itself is the
pipeline's (:mod:`opsnn_quant.pipeline.first`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opsnn_quant.core.numerics import fmt_db
from opsnn_quant.policy._plan import Fixed
from opsnn_quant.policy.baselines import NAIVE_INT8, NAIVE_SCHEMES, int8_runnable
from opsnn_quant.policy.budget import Budget, ModalityLimit
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision

# how the decision's note in policy.yaml begins (the summary repeats it)
DECIDED_FIRST = "decided first (budget.limits)"
PLACEHOLDER = "decided first: a naive baseline being measured"


@dataclass(frozen=True)
class FirstCandidate:
    """One naive baseline as ``calibrate`` would write it (overflow pins and
    ``min_int8_mac_share`` applied) and the modalities it covers fully.

    Attributes:
        strategy: the baseline's name (``all-w8a8-minmax``...).
        policy: the policy measured.
        full: the modalities in which every module the target runs in int8 is int8 (or pinned
            to fp32/bf16 by the overflow probe) under it.
    """

    strategy: str
    policy: PrecisionPolicy
    full: frozenset[Modality]


@dataclass(frozen=True)
class Measured:
    """A candidate's measured figures: modality -> ``sqnr_db``, ``cosine``, ``calls``."""

    candidate: FirstCandidate
    figures: Mapping[Modality, Mapping[str, float]]


@dataclass
class FirstDecision:
    """What the measurements decided.

    Attributes:
        fixed: the modalities decided, each with its baseline and why.
        open: the modalities no measured baseline decided: the estimators decide them.
        measured: the candidates measured, in order.
        where: what they were measured on, in words.
    """

    fixed: dict[Modality, Fixed] = field(default_factory=dict)
    open: list[Modality] = field(default_factory=list)
    measured: list[Measured] = field(default_factory=list)
    where: str = ""

    def note(self) -> str:
        """One line for ``policy.yaml``'s notes: what decided and what was not run."""
        figures = "; ".join(_figures(m) for m in self.measured)
        head = f"{DECIDED_FIRST}: measured on {self.where}: {figures}"
        if not self.open:
            return (
                f"{head}. Every modality decided by a naive baseline with full int8 coverage "
                f"(its floor met, or no floor: the most accurate): not run: {NOT_RUN}"
            )
        names = ", ".join(m.value for m in self.open)
        done = ", ".join(f"{m.value} ({f.strategy})" for m, f in self.fixed.items())
        return f"{head}. Decided: {done or 'none'}; the estimators ran for {names} only, and decided it"

    def skipped(self) -> str:
        """Why the probe's estimators did not run (the report's ``not_estimated``)."""
        labels = ", ".join(sorted({f.strategy for f in self.fixed.values()}))
        return (
            f"decided first: {labels} with full int8 coverage met budget.limits (or, without a "
            f"floor, measured the most accurate) on {self.where}; no estimate could change the "
            "choice"
        )


NOT_RUN = "the probe's estimators (SmoothQuant search, local errors, attribution, GPTQ moments)"


def _figures(m: Measured) -> str:
    parts = ", ".join(
        f"{mod.value} {fmt_db(f.get('sqnr_db'))}" for mod, f in m.figures.items()
    )  # fmt: skip
    return f"{m.candidate.strategy} {parts or 'no modality measured'}"


def first_candidates(
    report: SensitivityReport,
    budget: Budget,
    target: Target,
    schemes: Sequence[str] | None = None,
) -> list[FirstCandidate]:
    """The naive baselines ``target`` runs that cover some modality fully, in the order they
    are measured (:data:`~opsnn_quant.policy.baselines.NAIVE_INT8`'s: static before dynamic,
    Linear-only before with attention), each once (a target without int8 attention runs the
    ``-a8`` ones as the Linear-only ones); with ``schemes``, only those whose schemes are
    among them (a recipe's ``probe.schemes``)."""
    runnable = set(int8_runnable(report, target))
    out: list[FirstCandidate] = []
    seen: set[tuple[tuple[str, object], ...]] = set()
    modalities = [m for m in Modality if report.by_modality(m) and m != Modality.OTHER]
    for strategy in NAIVE_INT8:
        if schemes is not None and not set(NAIVE_SCHEMES[strategy]) <= set(schemes):
            continue
        policy = baseline_policy(report, budget, target, strategy, PLACEHOLDER, modalities)
        key = _specs(report, policy)
        if key in seen:
            continue
        seen.add(key)
        # coverage before min_int8_mac_share: a modality it leaves fp16 whole stays so under
        # every policy (none covers more), so it is decided all the same
        bare = budget.model_copy(update={"min_int8_mac_share": 0.0})
        specs = dict(
            _specs(report, baseline_policy(report, bare, target, strategy, "", modalities))
        )
        done = {n for n, s in specs.items() if isinstance(s, QuantSpec)}
        done |= {n for n, s in specs.items() if s in (Precision.FP32, Precision.BF16)}
        full = frozenset(
            mod
            for mod in modalities
            if all(e.name in done for e in report.by_modality(mod) if e.name in runnable)
        )
        if full and any(isinstance(s, QuantSpec) for s in specs.values()):
            out.append(FirstCandidate(strategy, policy, full))
    return out


def _specs(report: SensitivityReport, policy: PrecisionPolicy) -> tuple[tuple[str, object], ...]:
    resolved = policy.resolved(report.inventory(), report.weight_shapes(), tied=report.tied())
    return tuple(resolved.specs.items())


def baseline_policy(
    report: SensitivityReport,
    budget: Budget,
    target: Target,
    strategy: str,
    reason: str,
    modalities: Sequence[Modality],
) -> PrecisionPolicy:
    """``strategy`` on every one of ``modalities`` as ``calibrate`` writes it: through
    :func:`~opsnn_quant.policy.search.build_policy` (pins, fused layers, min share)."""
    precision, _, attention = NAIVE_INT8[strategy]
    fixed = {m: Fixed(strategy, precision, attention, reason) for m in modalities}
    return build_policy(report, budget, target, fixed=fixed)


def meets(limit: ModalityLimit, figures: Mapping[str, float]) -> bool:
    """Whether a measured modality meets its floor (every limit it sets)."""
    sqnr, cosine = figures.get("sqnr_db"), figures.get("cosine")
    if limit.min_sqnr_db is not None and (sqnr is None or not sqnr >= limit.min_sqnr_db):
        return False
    return limit.min_cosine is None or (cosine is not None and cosine >= limit.min_cosine)


def decide_modalities(
    report: SensitivityReport,
    budget: Budget,
    measured: Sequence[Measured],
    where: str,
    *,
    complete: bool = True,
) -> FirstDecision:
    """Each modality (but ``other``, which no policy puts in int8) decided by the first
    measured baseline that covers it fully and meets its floor; without a floor, once every
    candidate is measured (``complete``), by the most accurate that covers it fully (the
    budget asks nothing of its accuracy; of equal coverage, the best measured: a naive
    baseline is never better); open when none does (or, without a floor, not yet)."""
    decision = FirstDecision(measured=list(measured), where=where)
    for mod in (m for m in Modality if report.by_modality(m) and m != Modality.OTHER):
        limit = budget.limit_for(mod)
        full = [m for m in measured if mod in m.candidate.full]
        if limit.min_sqnr_db is None and limit.min_cosine is None:
            best = _most_accurate(mod, full) if complete else None
            if best is None:
                decision.open.append(mod)
                continue
            runner = [m for m in full if m is not best]
            decision.fixed[mod] = _fixed(best, mod, limit, where, runner)
            continue
        met = [m for m in full if mod in m.figures and meets(limit, m.figures[mod])]
        if met:
            decision.fixed[mod] = _fixed(met[0], mod, limit, where, [])
        else:
            decision.open.append(mod)
    return decision


def _most_accurate(mod: Modality, measured: Sequence[Measured]) -> Measured | None:
    """The measurement with the highest SQNR of ``mod`` (the first of equals; an unmeasured
    modality: the first candidate)."""
    if not measured:
        return None

    def sqnr(m: Measured) -> float:
        value = m.figures.get(mod, {}).get("sqnr_db")
        return -math.inf if value is None or math.isnan(value) else value

    return max(measured, key=sqnr)  # max keeps the first of equals


def _fixed(
    m: Measured, mod: Modality, limit: ModalityLimit, where: str, others: Sequence[Measured]
) -> Fixed:
    strategy = m.candidate.strategy
    precision, _, attention = NAIVE_INT8[strategy]
    figures = m.figures.get(mod)
    sqnr = None if figures is None else figures.get("sqnr_db")
    got = "not measured" if figures is None else f"measured {fmt_db(sqnr)}"
    if limit.min_sqnr_db is not None or limit.min_cosine is not None:
        bound = f"floor {limit.describe()}"
    else:
        beside = ", ".join(
            f"{o.candidate.strategy} {fmt_db(o.figures.get(mod, {}).get('sqnr_db'))}"
            for o in others
        )
        bound = "no floor in the budget: the most accurate" + (
            f" (beside {beside})" if beside else ""
        )
    reason = (
        f"decided first: {strategy} with every module the target runs in int8, {got} on "
        f"{where} ({bound}): no policy has more int8 MACs here"
    )
    return Fixed(strategy, precision, attention, reason, sqnr)
