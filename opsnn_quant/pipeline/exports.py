"""Calibrate's export steps, in the order :func:`~opsnn_quant.pipeline.calibrate.run_calibrate`
takes them.

The policy's own files (AMCT/ATC configs, msModelSlim YAML) come with the policy phase; which
model exports the target gets (:class:`ExportPlan`), the one call per root they trace and what
they make of the float model (ATC's float graphs) come while the model is still float (quantize swaps its modules in place, and no
second float copy is loaded for them); the model exports themselves
(:mod:`opsnn_quant.pipeline.model_exports`) after quantizing. Every format is an entry of the
exporter table (:mod:`opsnn_quant.formats.registry`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsnn_quant.formats.policy_files import export_policy
from opsnn_quant.formats.registry import exporter
from opsnn_quant.formats.result import write_export
from opsnn_quant.models.offload import resident
from opsnn_quant.pipeline.context import RunContext
from opsnn_quant.pipeline.model_exports import ModelExports, write_model_exports
from opsnn_quant.policy.schema import ResolvedPolicy
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.recording import Call, RecordedRoots, record_roots


def write_policy_exports(ctx: RunContext, resolved: ResolvedPolicy) -> list[str]:
    """The policy's own exports of ``recipe.exports`` into ``export/``; returns their notes."""
    ctx.say("exporting AMCT/ATC configs")
    notes: list[str] = []
    for fmt in ctx.recipe.exports:
        entry = exporter(fmt)
        if entry.kind == "model":
            continue  # written from the quantized model: write_exports
        result = export_policy(resolved, fmt)
        write_export(result, ctx.out.export / entry.output)
        notes.extend(f"{fmt}: {n}" for n in result.notes)
    return notes


@dataclass(frozen=True)
class ExportPlan:
    """The model exports ``recipe.exports`` asks of this target, and why others are left out.

    Attributes:
        wanted: the model export formats to write, in the exporter table's order.
        notes: the formats left out, and why.
        calls: one recorded call per root, the inputs the exports trace.
        staged: per format that reads the float model, what it made of it before quantizing
            (:meth:`~opsnn_quant.formats.base.Format.stage`: ATC's float graphs).
    """

    wanted: list[str]
    notes: list[str]
    calls: Mapping[str, Sequence[Call]]
    staged: Mapping[str, Any]


def plan_model_exports(
    ctx: RunContext,
    resolved: ResolvedPolicy,
    calibration: Sequence[Any],
    root_calls: Mapping[str, Sequence[Call]],
    holdout: RecordedRoots | None,
) -> ExportPlan:
    """What the model exports need while the model is still float: the formats the target
    gets (none but with our engine: AMCT writes its own model), the root calls they read and
    what they make of the float model (each format declares both)."""
    wanted, notes = _wanted(ctx, resolved)
    entries = [exporter(f) for f in wanted]
    smoothed = any(isinstance(s, QuantSpec) and s.smoothquant for s in resolved.specs.values())
    traced = any(e.needs_root_calls(smoothed) for e in entries)
    calls = _export_calls(ctx, calibration, root_calls, holdout) if traced else {}
    staged: dict[str, Any] = {}
    if any(e.float_model for e in entries):
        with resident(ctx.adapter.model):  # an offloaded model: all its blocks, to trace
            for e in entries:
                if e.float_model:
                    staged[e.name] = e.stage(ctx.adapter, resolved, calls, ctx.out.export, ctx.say)
    return ExportPlan(wanted, notes, calls, staged)


def _wanted(ctx: RunContext, resolved: ResolvedPolicy) -> tuple[list[str], list[str]]:
    """The recipe's model exports this run writes, and a note for each the target's route
    leaves out (:meth:`~opsnn_quant.formats.base.Format.left_out`)."""
    if not ctx.quantizer.ours:  # AMCT writes its own model
        return [], []
    wanted, notes = [], []
    for f in ctx.recipe.exports:
        entry = exporter(f)
        if entry.kind != "model":
            continue
        why = entry.left_out(resolved.target)
        if why is None:
            wanted.append(f)
        else:
            notes.append(f"{f}: {why}")
    return wanted, notes


def _export_calls(
    ctx: RunContext,
    calibration: Sequence[Any],
    root_calls: Mapping[str, Sequence[Call]],
    holdout: RecordedRoots | None,
) -> Mapping[str, Sequence[Call]]:
    """The root calls the exports trace, from the one place that has them: the held-out
    recording's, else the probe's; none: one calibration batch is recorded, on the float model."""
    calls = holdout.calls if holdout is not None else root_calls
    if not calls:
        ctx.say("recording one call per root for the exports")
        batch = calibration[: max(1, int(ctx.recipe.settings_dict().get("batch_size", 1)))]
        calls = record_roots(ctx.adapter, ctx.adapter.forward_loop(batch), 1, seed=ctx.seed).calls
    return calls


def write_exports(ctx: RunContext, resolved: ResolvedPolicy, plan: ExportPlan) -> ModelExports:
    """The planned model exports from the quantized model (ATC's float graphs staged before
    quantizing move in), each with its notes in ``<dir>.notes.txt``; returns the plan's notes
    and theirs, and what each wrote in int8."""
    if not plan.wanted:
        return ModelExports(list(plan.notes))
    done = write_model_exports(
        ctx.adapter, resolved, plan.calls, ctx.out.export, plan.wanted,
        staged=plan.staged, say=ctx.say,
    )  # fmt: skip
    return ModelExports(plan.notes + done.notes, done.int8)
