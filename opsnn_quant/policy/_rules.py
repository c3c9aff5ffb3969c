"""Turn search decisions into ordered, explained policy rules.

Order: fp32/bf16 pins (one exact rule each: each carries its own overflow evidence), then exact
fp16 rules, then exact int8 rules, then subtree globs, deepest first
(:mod:`~opsnn_quant.policy._compress` picks the fewest). Everything is in model order, so
the same report gives the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping

from opsnn_quant.core.numerics import fmt_db
from opsnn_quant.errors import ConfigError
from opsnn_quant.policy._compress import exact, plan_rules
from opsnn_quant.policy._plan import ModalityPlan
from opsnn_quant.policy._schemes import Choice
from opsnn_quant.policy.rule import QuantFields, Rule
from opsnn_quant.policy.schema import MAX_RULES, PrecisionPolicy
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.report import FP16_MAX, Fp16Stats, ModuleSensitivity, SensitivityReport
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision, match_prefix


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


def int8_rule(match: str, ch: Choice, reason: str) -> Rule:
    return Rule(
        match=match, precision=ch.precision, quant=QuantFields.from_spec(ch.spec), reason=reason
    )


def single_reason(ch: Choice) -> str:
    """Why one module takes its scheme (the rule's preset names the scheme itself)."""
    if ch.reason:  # decided by a measurement, not by the probe's figures
        return ch.reason
    if ch.by_e2e:
        return (
            f"least est. end-to-end noise of the schemes the target runs: "
            f"{ch.contribution:.2e} (local SQNR {fmt_db(ch.sqnr_db)})"
        )
    scaled = ", rescaled first order" if ch.scaled else ""
    return (
        f"best local SQNR of the schemes the target runs: {fmt_db(ch.sqnr_db)} (est. "
        f"end-to-end {ch.contribution:.2e}{scaled})"
    )


def one_rule_per_module(
    report: SensitivityReport, pins: dict[str, tuple[Precision, str]], plans: list[ModalityPlan]
) -> list[Rule]:
    """Every decision as an exact rule: pins, then fp16 fallbacks, then int8 (model order each)."""
    order = {m.name: i for i, m in enumerate(report.modules)}
    rules = [
        Rule(match=exact(n), precision=p, reason=r)
        for n, (p, r) in sorted(pins.items(), key=lambda kv: order[kv[0]])
    ]
    fallbacks = sorted(
        ((n, r) for plan in plans for n, r in plan.fallback.items()), key=lambda kv: order[kv[0]]
    )
    rules += [Rule(match=exact(n), precision=Precision.FP16, reason=r) for n, r in fallbacks]
    int8 = sorted(
        ((n, ch) for plan in plans for n, ch in plan.int8.items()), key=lambda nc: order[nc[0]]
    )
    return rules + [int8_rule(exact(n), ch, single_reason(ch)) for n, ch in int8]


def emit_rules(
    report: SensitivityReport,
    pins: dict[str, tuple[Precision, str]],
    plans: list[ModalityPlan],
    prefixes: dict[str, Modality],
    defaults: Mapping[Modality, Precision],
    *,
    compact: bool = True,
) -> list[Rule]:
    """The ordered rules of a policy (see the module docstring).

    Args:
        report: the probe report (module inventory, model order).
        pins: module -> (fp32/bf16, reason) of the overflow pins.
        plans: the search's decision per modality.
        prefixes: module-name prefix -> modality (the policy's ``modalities``).
        defaults: modality -> default precision (the policy's ``defaults``).
        compact: the fewest rules (see :mod:`opsnn_quant.policy._compress`); else one exact
            rule per decided module.

    Raises:
        ConfigError: more rules than a policy may hold (:data:`~.schema.MAX_RULES`).
        RuntimeError: the compact rules would resolve a module otherwise than one rule per
            module does (a bug: it is checked on every call).
    """
    singles = one_rule_per_module(report, pins, plans)
    rules = singles
    if compact:
        rules = compact_rules(report, pins, plans, prefixes, defaults)
        check_same_resolution(report, prefixes, defaults, singles, rules)
    if len(rules) > MAX_RULES:
        hint = "" if compact else "; build it compact"
        raise ConfigError(
            f"the policy of {report.model} would hold {len(rules)} rules, more than the "
            f"{MAX_RULES} a policy may hold{hint}"
        )
    return rules


def _uniform_modality(node: str, prefixes: Mapping[str, Modality]) -> Modality | None:
    """The modality of every name under ``node`` (``""`` = the whole model), even of modules the
    report does not list; None when names under it can belong to different modalities or none."""
    cover = match_prefix(node, prefixes)
    if cover is None:
        return None
    modality = prefixes[cover]
    inner = [m for p, m in prefixes.items() if p != "" and (node == "" or p.startswith(node + "."))]
    return modality if all(m == modality for m in inner) else None


def compact_rules(
    report: SensitivityReport,
    pins: dict[str, tuple[Precision, str]],
    plans: list[ModalityPlan],
    prefixes: dict[str, Modality],
    defaults: Mapping[Modality, Precision],
) -> list[Rule]:
    """The fewest rules giving every module the precision and spec of :func:`one_rule_per_module`.

    Pins stay one exact rule each. Every other decided Linear/Conv2d is a target: an int8 one
    labelled by its QuantSpec, an fp16 one by its reason too (a merged fp16 rule says the one
    reason all its modules share, with their count). A glob stays within one modality (the
    modality's decision is in the policy's figures); an fp16 glob only where fp16 is the default (so
    the other modules it reaches, containers and norms, keep their precision); an int8 glob
    never reaches a Linear/Conv2d without a rule of its own.
    """
    order = {m.name: i for i, m in enumerate(report.modules)}
    choices = {n: ch for plan in plans for n, ch in plan.int8.items()}
    targets: dict[str, tuple[object, ...]] = {}
    reasons: dict[str, str] = {}
    for plan in plans:
        for n, reason in plan.fallback.items():
            targets[n], reasons[n] = ("float", Precision.FP16, reason), reason
        for n, ch in plan.int8.items():
            targets[n], reasons[n] = ("int8", ch.spec), single_reason(ch)
    free = [
        m.name
        for m in report.modules
        if m.quantizable and m.name not in targets and m.name not in pins
    ]

    def glob_ok(node: str, label: object) -> bool:
        modality = _uniform_modality(node, prefixes)
        if modality is None:
            return False
        assert isinstance(label, tuple)
        if label[0] == "float":
            return defaults.get(modality) == label[1]
        inside = node + "."
        return not any(node == "" or n.startswith(inside) for n in free)

    names = [m.name for m in report.modules]
    placements = plan_rules(names, targets, glob_ok)
    rules = [
        Rule(match=exact(n), precision=p, reason=r)
        for n, (p, r) in sorted(pins.items(), key=lambda kv: order[kv[0]])
    ]
    exact_float, exact_int8, globs = [], [], []
    for pl in placements:
        label = pl.label
        assert isinstance(label, tuple)
        if not pl.glob:
            (n,) = pl.decides
            if label[0] == "float":
                exact_float.append(Rule(match=pl.match, precision=label[1], reason=reasons[n]))
            else:
                exact_int8.append(int8_rule(pl.match, choices[n], reasons[n]))
        elif label[0] == "float":
            count = len(pl.decides)
            reason = reasons[pl.decides[0]] + (f" ({count} modules)" if count > 1 else "")
            globs.append(Rule(match=pl.match, precision=label[1], reason=reason))
        else:
            group = [choices[n] for n in pl.decides]
            dbs = [c.sqnr_db for c in group if c.sqnr_db is not None]
            local = f"{min(dbs):.1f}..{max(dbs):.1f} dB" if dbs else "lossless"
            where = f"under {pl.node}" if pl.node else "in the model"
            kind = "attention modules" if group[0].precision.is_attention else "Linear/Conv2d"
            reason = (
                f"the {len(group)} probed {kind} {where} not named above, best scheme "
                f"each (local SQNR {local})"
            )
            if group[0].reason:  # a modality decided first: the measurement that decided it
                reason = f"{group[0].reason} ({len(group)} {kind} {where} not named above)"
            globs.append(int8_rule(pl.match, group[0], reason))
    return rules + exact_float + exact_int8 + globs


def check_same_resolution(
    report: SensitivityReport,
    prefixes: dict[str, Modality],
    defaults: Mapping[Modality, Precision],
    expected: list[Rule],
    rules: list[Rule],
) -> None:
    """Raise RuntimeError unless ``rules`` resolve every report module like ``expected``
    (precision, QuantSpec, and whether a modality default applies at all)."""
    names = [m.name for m in report.modules]
    types = {m.name: m.type for m in report.modules}

    def resolution(rule_list: list[Rule]) -> list[tuple[str, QuantSpec | Precision, bool]]:
        # built unvalidated: the rules are, and one per module may be more than a file holds
        policy = PrecisionPolicy.model_construct(
            model=report.model, target="cpu-reference", modalities=prefixes,
            defaults=dict(defaults), rules=rule_list,
        )  # fmt: skip
        out = []
        for name, res in policy.resolve(names, types).items():
            out.append((name, policy.spec_of(res), res.rule == "unassigned"))
        return out

    for want, got in zip(resolution(expected), resolution(rules), strict=True):
        if want != got:
            raise RuntimeError(f"compact rules resolve {want[0]} to {got[1:]}, not {want[1:]}")
