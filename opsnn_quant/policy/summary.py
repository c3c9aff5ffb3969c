"""Per-modality summary of a policy (the rows of the CLI table)."""

from __future__ import annotations

from dataclasses import dataclass

from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.probe.report import SensitivityReport
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
        int8_mac_share: share of the modality's MACs in int8 (recomputed from the report).
    """

    modality: Modality
    chosen: str
    fp32: int
    bf16: int
    fp16: int
    int8: int
    predicted_sqnr_db: float | None
    int8_mac_share: float


def summarize(policy: PrecisionPolicy, report: SensitivityReport) -> list[ModalitySummaryRow]:
    """Rows per modality present in ``report``, in Modality order."""
    names = [m.name for m in report.modules]
    types = {m.name: m.type for m in report.modules}
    resolved = policy.resolve(names, types)
    rows = []
    for modality in Modality:
        modules = report.by_modality(modality)
        if not modules:
            continue
        counts = dict.fromkeys(("fp32", "bf16", "fp16", "int8"), 0)
        int8_macs = total = 0
        for m in modules:
            p = resolved[m.name].precision
            key = "int8" if p.is_int8 else p.value
            counts[key] += 1
            total += max(m.macs, 0)
            if p.is_int8:
                int8_macs += max(m.macs, 0)
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
                **counts,
            )
        )
    return rows
