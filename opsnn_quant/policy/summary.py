"""What a decided policy comes to: per-modality rows (the CLI table), per-module rows, the share
of the MACs in int8 (per modality, per written artifact, overall and over all the model's MACs),
and the notes and summary an acceptance report shows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opsnn_quant.core.numerics import fmt_db
from opsnn_quant.policy.schema import PrecisionPolicy, ResolvedPolicy
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.quant.spec import ATTENTION_TYPE, QuantSpec
from opsnn_quant.types import Modality, Precision


@dataclass(frozen=True)
class ModalitySummaryRow:
    """One modality of a policy, counted over the probed modules.

    Attributes:
        modality: the modality.
        chosen: ``int8`` or ``fp16``: the policy's figures, or for a policy without figures (a
            baseline strategy) ``int8`` when any of the modality's modules is int8.
        fp32, bf16, fp16, int8: module counts per precision (int8 = every int8 scheme).
        predicted_sqnr_db: predicted output SQNR (None = no int8 noise).
        int8_mac_share: share of the modality's Linear/Conv2d MACs in int8 (recomputed from the
            report): what a target can run in int8, and what budgets and the search read.
        int8_share_of_all_macs: the int8 MACs over *all* the modality's MACs, attention's
            products and Conv1d/Conv3d included (float where the target runs them so); None where
            the probe did not count those (a probe.json from before it did).
        attention_int8_share: share of the modality's attention MACs (the SDPA calls the probe
            measured for int8 attention) in int8; None where none was (a target without int8
            attention).
    """

    modality: Modality
    chosen: str
    fp32: int
    bf16: int
    fp16: int
    int8: int
    predicted_sqnr_db: float | None
    int8_mac_share: float
    int8_share_of_all_macs: float | None = None
    attention_int8_share: float | None = None


def summarize(resolved: ResolvedPolicy, report: SensitivityReport) -> list[ModalitySummaryRow]:
    """Rows per modality present in ``report`` (the inventory ``resolved`` was resolved
    against), in Modality order."""
    policy = resolved.policy
    rows = []
    for modality in Modality:
        modules = report.by_modality(modality)
        if not modules:
            continue
        counts = dict.fromkeys(("fp32", "bf16", "fp16", "int8"), 0)
        int8_macs = total = 0
        attention = [0, 0]  # int8, all: the SDPA MACs
        for m in modules:
            p = resolved.resolution[m.name].precision
            key = "int8" if p.is_int8 else p.value
            counts[key] += 1
            total += max(m.macs, 0)
            if p.is_int8:
                int8_macs += max(m.macs, 0)
            if m.type == ATTENTION_TYPE:
                attention[1] += max(m.macs, 0)
                attention[0] += max(m.macs, 0) if p.is_int8 else 0
        info = report.modalities.get(modality.value)
        linear = info.linear_share if info is not None else None
        fig = policy.figures.get(modality)
        if fig is not None:
            chosen = fig.chosen
        else:
            chosen = "int8" if counts["int8"] else Precision.FP16.value
        rows.append(
            ModalitySummaryRow(
                modality=modality,
                chosen=chosen,
                predicted_sqnr_db=fig.predicted_sqnr_db if fig else None,
                int8_mac_share=int8_macs / total if total else 0.0,
                int8_share_of_all_macs=(
                    None if linear is None or not total else int8_macs / total * linear
                ),
                attention_int8_share=attention[0] / attention[1] if attention[1] else None,
                **counts,
            )
        )
    return rows


def report_rows(
    policy: PrecisionPolicy, report: SensitivityReport | None
) -> list[ModalitySummaryRow]:
    """:func:`summarize` of ``policy`` resolved against the probe ``report`` it was decided from
    (none without a report)."""
    if report is None:
        return []
    resolved = policy.resolved(report.inventory(), report.weight_shapes(), tied=report.tied())
    return summarize(resolved, report)


@dataclass(frozen=True)
class ModuleRow:
    """How one probed module resolves, with the probe's figures for its chosen scheme.

    Attributes:
        name: module name.
        modality: its modality (from the report).
        type: module class name.
        precision: resolved precision.
        spec: the QuantSpec of an int8 module (None for float).
        rule: the index of the rule that decided it, or ``default`` / ``unassigned``.
        match: that rule's glob ("" for a default).
        reason: that rule's reason (shared by every module a glob decides).
        local_sqnr_db: the probe's local SQNR of the chosen scheme (int8 modules, when measured;
            None also when the scheme adds no error).
        contribution: the probe's end-to-end contribution estimate, if any.
    """

    name: str
    modality: Modality
    type: str
    precision: Precision
    spec: QuantSpec | None
    rule: int | str
    match: str
    reason: str
    local_sqnr_db: float | None
    contribution: float | None


def module_rows(resolved: ResolvedPolicy, report: SensitivityReport) -> list[ModuleRow]:
    """Every module of ``report`` in model order: what the (compact) policy makes of it and the
    per-module figures behind it, for tables and for reading a policy module by module."""
    policy = resolved.policy
    rows = []
    for m in report.modules:
        res = resolved.resolution[m.name]
        spec = resolved.specs[m.name]
        qspec = spec if isinstance(spec, QuantSpec) else None
        scheme = None if qspec is None else _scheme_of(qspec)
        err = m.w8a8.get(scheme) if scheme is not None else None
        rows.append(
            ModuleRow(
                name=m.name,
                modality=m.modality,
                type=m.type,
                precision=res.precision,
                spec=qspec,
                rule=res.rule,
                match=policy.rules[res.rule].match if isinstance(res.rule, int) else "",
                reason=res.reason,
                local_sqnr_db=None if err is None else err.sqnr_db,
                contribution=None if m.e2e is None else m.e2e.contribution,
            )
        )
    return rows


def _scheme_of(spec: QuantSpec) -> str | None:
    """The probe scheme a QuantSpec stands for (SmoothQuant's alpha aside), if any."""
    for name, scheme in SCHEMES.items():
        if scheme.spec(spec.smoothquant_alpha) == spec:
            return name
    return None


def int8_mac_shares(report: SensitivityReport, int8: Iterable[str]) -> dict[str, float]:
    """The share of MACs in int8 when the modules ``int8`` are (what an artifact writes in int8),
    per modality present in ``report`` (Modality order) and ``overall``, by the report's MACs:
    the same count as :func:`summarize`'s for the policy."""
    chosen = set(int8)
    shares: dict[str, float] = {}
    total_int8 = total = 0
    for modality in Modality:
        modules = report.by_modality(modality)
        if not modules:
            continue
        macs = sum(max(m.macs, 0) for m in modules)
        done = sum(max(m.macs, 0) for m in modules if m.name in chosen)
        shares[modality.value] = done / macs if macs else 0.0
        total_int8, total = total_int8 + done, total + macs
    shares["overall"] = total_int8 / total if total else 0.0
    return shares


def measured_kinds(report: SensitivityReport) -> str:
    """What the int8 MAC shares of ``report`` count: ``Linear/Conv2d``, and ``SDPA`` too where
    the probe measured attention for int8 (a target that runs it)."""
    attention = any(m.type == ATTENTION_TYPE for m in report.modules)
    return "Linear/Conv2d/SDPA" if attention else "Linear/Conv2d"


def deployed_note(artifact: str, shares: Mapping[str, float], kinds: str = "Linear/Conv2d") -> str:
    """One line for the policy's notes: the int8 MAC share an artifact deploys (of the
    ``kinds`` MACs: :func:`measured_kinds`)."""
    parts = ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if k != "overall")
    return f"deployed by {artifact}: {shares['overall']:.1%} of the {kinds} MACs in int8 ({parts})"


def policy_summary(
    policy: PrecisionPolicy, rows: Iterable[ModalitySummaryRow] = ()
) -> dict[str, Any]:
    """A compact summary of ``policy`` for an acceptance report: model, target, rule count and
    each modality's decision (chosen, predicted SQNR, int8 MAC share); with the summary
    ``rows`` of the probe it was decided from, each modality's int8 share of all its MACs and
    of its attention MACs, where counted."""
    figures: dict[str, dict[str, Any]] = {
        m.value: {
            "chosen": f.chosen,
            "predicted_sqnr_db": f.predicted_sqnr_db,
            "int8_mac_share": f.int8_mac_share,
        }
        for m, f in policy.figures.items()
    }
    for row in rows:
        shares = {
            "int8_share_of_all_macs": row.int8_share_of_all_macs,
            "attention_int8_share": row.attention_int8_share,
        }
        # a baseline strategy's policy has no figures: its coverage from the rows all the same
        entry = figures.setdefault(
            row.modality.value,
            {
                "chosen": row.chosen,
                "predicted_sqnr_db": row.predicted_sqnr_db,
                "int8_mac_share": round(row.int8_mac_share, 4),
            },
        )
        entry |= {k: round(v, 4) for k, v in shares.items() if v is not None}
    return {
        "model": policy.model,
        "target": policy.target,
        "rules": len(policy.rules),
        "modalities": figures,
    }


def deployed_shares(
    report: SensitivityReport, int8: Mapping[str, list[str]]
) -> dict[str, dict[str, float]]:
    """Per written artifact, the share of MACs it deploys in int8 (per modality, overall)."""
    return {fmt: int8_mac_shares(report, names) for fmt, names in int8.items()}


def int8_mac_share(report: SensitivityReport, rows: list[ModalitySummaryRow]) -> float | None:
    """Share of the measured (Linear/Conv2d, and SDPA where counted) MACs in int8, the
    modalities weighted by one forward call's MACs each: the weighting of the per-export shares
    (:func:`int8_mac_shares`) and of the measured search's coverage."""

    def macs(modality: Modality) -> float:
        summary = report.modalities.get(modality.value)
        return float(summary.macs) if summary is not None else 0.0

    int8 = sum(r.int8_mac_share * macs(r.modality) for r in rows)
    total = sum(macs(r.modality) for r in rows)
    return int8 / total if total else None


def int8_share_of_all_macs(
    report: SensitivityReport, rows: list[ModalitySummaryRow]
) -> float | None:
    """The int8 MACs over all the model's MACs **over the run** (pass 1: a denoiser counts once
    per step it runs), attention's products and Conv1d/Conv3d included; None where the probe
    did not count those. Not comparable with :func:`int8_mac_share`, which counts one forward
    call per modality: the summary line says which is which."""
    int8 = everything = 0.0
    for r in rows:
        summary = report.modalities.get(r.modality.value)
        if summary is None or summary.pass_macs is None or summary.other_macs is None:
            return None
        int8 += r.int8_mac_share * summary.pass_macs
        everything += summary.pass_macs + summary.other_macs
    return int8 / everything if everything else None


def position_note(modality: Modality, figures: Mapping[str, float], backend: str) -> str:
    """One line for the policy's notes: a modality's held-out SQNR per group of output positions
    on ``backend`` ("" when the adapter names none)."""
    groups = {k.split(":", 1)[1]: v for k, v in figures.items() if k.startswith("sqnr_db:")}
    if not groups:
        return ""
    parts = ", ".join(f"{name} {fmt_db(v)}" for name, v in groups.items())
    return (
        f"measured on held-out data ({backend}): {modality.value} {fmt_db(figures['sqnr_db'])}"
        f" overall; {parts}"
    )


def with_measured(
    summary: dict[str, Any], measured: Mapping[Modality, Mapping[str, float]]
) -> dict[str, Any]:
    """The policy summary with each modality's held-out SQNR beside its predicted one (the
    summary table's ``meas`` column), for the acceptance report."""
    modalities = summary.get("modalities", {})
    for modality, figures in measured.items():
        if modality.value in modalities and "sqnr_db" in figures:
            modalities[modality.value]["measured_sqnr_db"] = round(figures["sqnr_db"], 3)
    return summary
