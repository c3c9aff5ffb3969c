"""The calibrate workflow's export phases (:func:`opsnn_quant.workflow.run_calibrate`).

In order: the policy's own exports; which model exports the target gets (:class:`ExportPlan`);
the recorded calls they trace; ATC's float graphs, staged while the model is still float; and,
after quantize, the model exports themselves (:mod:`opsnn_quant.deploy.workflow_exports`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.models import ModelAdapter
from opsnn_quant.outputs import CalibrateOutput
from opsnn_quant.policy.export import export_policy, modules_from_report, write_export
from opsnn_quant.policy.exporters import exporter
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.api import ProbeKeep
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.recipe import Recipe
from opsnn_quant.recording import Call, RecordedRoots, record_roots
from opsnn_quant.types import Progress

if TYPE_CHECKING:
    from opsnn_quant.deploy.workflow_exports import StagedGraphs


def write_policy_exports(
    policy: PrecisionPolicy, report: SensitivityReport, recipe: Recipe, tmp: Path, say: Progress
) -> list[str]:
    """The policy's own exports (AMCT/ATC configs, msModelSlim) into ``tmp/export``; returns
    their notes."""
    say("exporting AMCT/ATC configs")
    modules = modules_from_report(report)
    notes: list[str] = []
    for fmt in recipe.exports:
        entry = exporter(fmt)
        if entry.kind == "model":
            continue  # written from the quantized model: model_exports
        result = export_policy(policy, fmt, modules)
        write_export(result, CalibrateOutput(tmp).export / entry.output)
        notes.extend(f"{fmt}: {n}" for n in result.notes)
    return notes


@dataclass
class ExportPlan:
    """The model exports ``recipe.exports`` asks of this target, and why others are left out."""

    wanted: list[str]
    notes: list[str]


def model_export_plan(policy: PrecisionPolicy, recipe: Recipe, engine: str) -> ExportPlan:
    """The model exports of ``recipe.exports`` written for ``policy``'s target (none but with
    our engine: AMCT writes its own model)."""
    if engine != "opsnn":
        return ExportPlan([], [])
    wanted = [f for f in recipe.exports if exporter(f).kind == "model"]
    notes = []
    if "atc" in wanted and get_target(policy.target).route != "atc":
        # ONNX exports cost ~25 s per demo UNet graph: only where ATC is the deployment route
        wanted.remove("atc")
        notes.append(
            f"atc: {policy.target} does not deploy through ATC; no graphs written "
            "(opsnn-quant export-weights OUT -f atc --data SRC writes them)"
        )
    return ExportPlan(wanted, notes)


def export_calls(
    adapter: ModelAdapter,
    recipe: Recipe,
    calibration: Sequence[Any],
    recorded: RecordedRoots | None,
    keep: ProbeKeep,
    plan: ExportPlan,
    say: Progress,
) -> Mapping[str, Sequence[Call]]:
    """The recorded root calls the exports trace (the held-out recording's, or the probe's;
    none: one calibration batch is recorded, on the float model)."""
    calls: Mapping[str, Sequence[Call]] = (
        recorded.calls if recorded is not None else keep.root_calls
    )
    if plan.wanted and not calls:
        say("recording one call per root for the exports")
        batch = calibration[: max(1, int(recipe.settings_dict().get("batch_size", 1)))]
        calls = record_roots(adapter, adapter.forward_loop(batch), 1, seed=recipe.seed).calls
    return calls


def stage_atc_float_graphs(
    adapter: ModelAdapter,
    policy: PrecisionPolicy,
    report: SensitivityReport,
    calls: Mapping[str, Sequence[Call]],
    plan: ExportPlan,
    tmp: Path,
    say: Progress,
) -> StagedGraphs | None:
    """ATC's float graphs, while the model is still float (no second copy is loaded for them)."""
    if "atc" not in plan.wanted:
        return None
    from opsnn_quant.deploy.workflow_exports import stage_float_graphs

    modules = modules_from_report(report)
    return stage_float_graphs(adapter, policy, modules, calls, CalibrateOutput(tmp).export, say=say)


def model_exports(
    adapter: ModelAdapter,
    policy: PrecisionPolicy,
    report: SensitivityReport,
    plan: ExportPlan,
    calls: Mapping[str, Sequence[Call]],
    staged: StagedGraphs | None,
    tmp: Path,
    say: Progress,
) -> list[str]:
    """``export/ascendv1/`` and ``export/atc/`` from the quantized model (as ``recipe.exports``
    asks; ATC's float graphs staged before quantizing), with their notes in
    ``<dir>.notes.txt``; returns the notes."""
    from opsnn_quant.deploy.workflow_exports import write_model_exports

    if not plan.wanted:
        return []
    return write_model_exports(
        adapter, policy, modules_from_report(report), calls, CalibrateOutput(tmp).export, plan.wanted,
        float_graphs=staged, say=say,
    )  # fmt: skip
