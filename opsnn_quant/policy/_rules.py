"""Turn search decisions into ordered, explained policy rules.

Order: fp32/bf16 pins, then float fallbacks (budget, target or missing estimates), then int8
rules for single modules, then one glob per modality prefix for the bulk of uniform int8 modules.
Everything is in model order, so the same report gives the same rules.
"""

from __future__ import annotations

import fnmatch
from collections import Counter

from opsnn_quant.numerics import fmt_db
from opsnn_quant.policy._plan import ModalityPlan
from opsnn_quant.policy._schemes import Choice, describe_scheme
from opsnn_quant.policy.rule import QuantFields, Rule
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.report import FP16_MAX, Fp16Stats, ModuleSensitivity, SensitivityReport
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision, match_prefix


def exact(name: str) -> str:
    """A glob that matches ``name`` only (fnmatch metacharacters bracketed)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _evidence(s: Fp16Stats) -> str:
    parts = []
    if s.output_absmax > FP16_MAX:
        room = f" (headroom {s.headroom_out:.2f})" if s.headroom_out is not None else ""
        parts.append(f"output absmax {s.output_absmax:.1e} > 65504{room}")
    if s.input_absmax > FP16_MAX:
        room = f" (headroom {s.headroom_in:.2f})" if s.headroom_in is not None else ""
        parts.append(f"input absmax {s.input_absmax:.1e} > 65504{room}")
    if s.sumsq_absmax is not None and s.sumsq_absmax > FP16_MAX:
        parts.append(f"sum of squares {s.sumsq_absmax:.1e} > 65504")
    if s.inf_nan_count:
        parts.append(f"inf/nan in {s.inf_nan_count} outputs")
    if not parts:  # within the safety margin, or evidence of another check (softmax scores)
        parts.extend(s.reasons)
    return "; ".join(parts) or "flagged by the probe"


def pin_for(
    m: ModuleSensitivity, target: Target, bf16_tolerance: float
) -> tuple[Precision, str] | None:
    """fp32/bf16 pin of a module the fp16 overflow probe flagged, or whose every int8 candidate
    overflowed its fp16 output (None when neither)."""
    s = m.fp16
    flagged = s is not None and s.overflow
    infeasible = [e.infeasible for e in m.w8a8.values() if e.infeasible]
    all_infeasible = bool(infeasible) and len(infeasible) == len(m.w8a8)
    if not flagged and not all_infeasible:
        return None
    parts = [f"fp16 overflow: {_evidence(s)}"] if s is not None and flagged else []
    if all_infeasible:
        parts.append(f"int8 output overflows fp16 under every scheme ({infeasible[0]})")
    reason = "; ".join(parts)
    s = s or Fp16Stats()
    if target.fp16_overflow_mode == "saturate":
        reason += f"; on {target.name} fp16 saturates to ±65504 without inf/nan"
    bf16_ok, _ = target.can_run(m.type, Precision.BF16)
    err = s.rel_error_bf16
    if bf16_ok and err is not None and err < bf16_tolerance:
        return Precision.BF16, f"{reason} -> bf16 (bf16 rel. error {err:.1e} < {bf16_tolerance:g})"
    if not target.has_bf16:
        why = f"{target.name} has no bf16"
    elif err is None:
        why = "no bf16 measurement"
    else:
        why = f"bf16 rel. error {err:.1e} >= {bf16_tolerance:g}"
    return Precision.FP32, f"{reason} -> fp32 ({why})"


def _spec_key(ch: Choice) -> QuantSpec:
    return ch.spec


def _int8_rule(match: str, ch: Choice, reason: str) -> Rule:
    return Rule(
        match=match, precision=ch.precision, quant=QuantFields.from_spec(ch.spec), reason=reason
    )


def _single_reason(ch: Choice) -> str:
    if ch.by_e2e:
        return (
            f"int8 {describe_scheme(ch)}: smallest est. end-to-end contribution "
            f"{ch.contribution:.2e} among the schemes the target runs (local SQNR "
            f"{fmt_db(ch.sqnr_db)})"
        )
    scaled = " (rescaled from the probe's estimate, first order)" if ch.scaled else ""
    return (
        f"int8 {describe_scheme(ch)}: best local SQNR {fmt_db(ch.sqnr_db)} among the schemes "
        f"the target runs; est. contribution {ch.contribution:.2e}{scaled}"
    )


def _prefix_of(name: str, prefixes: dict[str, Modality]) -> str:
    return match_prefix(name, prefixes) or ""


def emit_rules(
    report: SensitivityReport,
    pins: dict[str, tuple[Precision, str]],
    plans: list[ModalityPlan],
    prefixes: dict[str, Modality],
    *,
    compact: bool = True,
) -> list[Rule]:
    """The ordered rules of a policy (see the module docstring)."""
    order = {m.name: i for i, m in enumerate(report.modules)}
    rules = [
        Rule(match=exact(n), precision=p, reason=r)
        for n, (p, r) in sorted(pins.items(), key=lambda kv: order[kv[0]])
    ]
    fallbacks = sorted(
        ((n, r) for plan in plans for n, r in plan.fallback.items()), key=lambda kv: order[kv[0]]
    )
    rules += [Rule(match=exact(n), precision=Precision.FP16, reason=r) for n, r in fallbacks]
    named = {n for n in pins} | {n for n, _ in fallbacks}
    quantizable = [m.name for m in report.modules if m.quantizable]
    singles: list[tuple[str, Rule]] = []
    globs: list[Rule] = []
    for plan in plans:
        by_prefix: dict[str, list[str]] = {}
        for name in plan.int8:
            by_prefix.setdefault(_prefix_of(name, prefixes), []).append(name)
        for prefix, members in by_prefix.items():
            if compact and len(members) >= 2:
                counts = Counter(_spec_key(plan.int8[n]) for n in members)
                top = max(counts.values())
                key = next(
                    _spec_key(plan.int8[n])
                    for n in members
                    if counts[_spec_key(plan.int8[n])] == top
                )
                major = [n for n in members if _spec_key(plan.int8[n]) == key]
                glob = "*" if prefix == "" else f"{exact(prefix)}.*"
                covered = {n for n in quantizable if fnmatch.fnmatchcase(n, glob)}
                others = set(members) - set(major)
                # Safe only if every other Linear/Conv2d the glob reaches is named earlier.
                if len(major) >= 2 and covered <= set(major) | others | named:
                    ch = plan.int8[major[0]]
                    dbs = [
                        c.sqnr_db for c in (plan.int8[n] for n in major) if c.sqnr_db is not None
                    ]
                    local = f"{min(dbs):.1f}..{max(dbs):.1f} dB" if dbs else "lossless"
                    where = f"under {prefix!r}" if prefix else "in the model"
                    reason = (
                        f"int8 {describe_scheme(ch)} for the {len(major)} probed Linear/Conv2d "
                        f"{where} not named above (local SQNR {local}, best scheme each); "
                        f"{plan.modality.value}: {plan.note}"
                    )
                    globs.append(_int8_rule(glob, ch, reason))
                    members = sorted(others, key=order.__getitem__)
            for n in members:
                singles.append(
                    (n, _int8_rule(exact(n), plan.int8[n], _single_reason(plan.int8[n])))
                )
    rules += [r for _, r in sorted(singles, key=lambda nr: order[nr[0]])]
    return rules + globs
