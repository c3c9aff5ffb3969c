"""The model exports of a calibrate output: ``export/ascendv1/`` and ``export/atc/``.

The ``model`` entries of the exporter table (:mod:`opsnn_quant.formats.registry`) point at the
handlers here; :func:`write_model_exports` runs the wanted ones in the table's order. Shared by
``calibrate`` (its export phase) and ``opsnn-quant export-weights``. Each directory is
written atomically; its notes (modules not exported in their quantized form, graphs that could
not be exported) go to ``export/<name>.notes.txt`` and are returned.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from opsnn_quant.formats.ascendv1.export import export_ascendv1
from opsnn_quant.formats.atc.export import FloatGraphs, write_atc, write_float_graphs
from opsnn_quant.formats.mindie_sd.export import export_mindie_sd
from opsnn_quant.formats.registry import exporters
from opsnn_quant.io import atomic_dir, remove_output_file, write_output_file
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.offload import resident
from opsnn_quant.policy.schema import ResolvedPolicy
from opsnn_quant.quant.modules import QuantModule
from opsnn_quant.recording import Call

log = logging.getLogger(__name__)
MIXLIST = "atc_modify_mixlist.json"


def _mixlist(export_dir: Path) -> str | None:
    """``../atc_modify_mixlist.json`` when the policy export wrote one that adds OpTypes."""
    path = export_dir / MIXLIST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    adds = doc.get("black-list", {}).get("to-add", []) if isinstance(doc, dict) else []
    return f"../{MIXLIST}" if adds else None


def write_model_exports(
    adapter: ModelAdapter,
    policy: ResolvedPolicy,
    calls: Mapping[str, Sequence[Call]],
    export_dir: Path,
    wanted: Sequence[str],
    *,
    float_model: nn.Module | None = None,
    float_graphs: StagedGraphs | None = None,
    force: bool = False,
    say: Callable[[str], None] = log.info,
) -> ModelExports:
    """Write the ``wanted`` model exports (``ascendv1``, ``mindie-sd``, ``atc``) into
    ``export_dir``.

    Args:
        adapter: the adapter holding the quantized model.
        policy: its resolved policy (target, fp32 pins, module inventory).
        calls: recorded calls per root (SmoothQuant folding, ONNX shapes).
        export_dir: the ``export/`` directory.
        wanted: which exports.
        float_model: the float model (ATC's float graphs); None: only QDQ graphs (or those of
            ``float_graphs``).
        float_graphs: ATC's float graphs written before quantizing (:func:`stage_float_graphs`).
        force: replace existing directories that are not ours.
        say: progress callback.

    Returns:
        The notes, each prefixed by its export's name, and what each export wrote in int8.
    """
    ctx = ModelExportContext(
        adapter, policy, calls, export_dir, float_model, float_graphs, force, say
    )
    done = ModelExports()
    for entry in exporters("model"):  # in the table's order: ascendv1, mindie-sd, atc
        if entry.name in wanted:
            outcome: ExportOutcome = entry.load()(ctx, export_dir / entry.output)
            done.notes += _write_notes(export_dir, entry.name, outcome.notes, force)
            done.int8[entry.name] = outcome.int8
    return done


@dataclass(frozen=True)
class ExportOutcome:
    """What a model export's handler returns: its notes and the modules it wrote in int8
    (full names: what deploys quantized, whatever the policy asked)."""

    notes: list[str]
    int8: list[str]


@dataclass
class ModelExports:
    """What :func:`write_model_exports` wrote: the notes (prefixed by the export's name) and,
    per export, the modules written in int8."""

    notes: list[str] = field(default_factory=list)
    int8: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelExportContext:
    """What a model export's handler (``(ctx, directory) -> notes``, the exporter table's
    ``model`` kind) takes: see :func:`write_model_exports`' arguments."""

    adapter: ModelAdapter
    policy: ResolvedPolicy
    calls: Mapping[str, Sequence[Call]]
    export_dir: Path
    float_model: nn.Module | None
    float_graphs: StagedGraphs | None
    force: bool
    say: Callable[[str], None]


def ascendv1(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/ascendv1/``: AscendV1 weights (vLLM-Ascend / SGLang)."""
    ctx.say("exporting AscendV1 weights (vLLM-Ascend / SGLang)")
    # an offloaded model (--max-memory): block by block (with SmoothQuant folds: resident)
    done = export_ascendv1(ctx.adapter, directory, calls=ctx.calls, force=ctx.force)
    int8 = [_full(c, n) for c, e in done.components.items() for n in e.int8]
    return ExportOutcome(done.notes, int8)


def mindie_sd(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/mindie-sd/``: per component, the files ``mindiesd.quantize`` loads."""
    ctx.say("exporting MindIE-SD weights (mindiesd.quantize)")
    done = export_mindie_sd(ctx.adapter, directory, force=ctx.force)  # offloaded: block by block
    int8 = [_full(c, n) for c, f in done.components.items() for n in f.int8]
    return ExportOutcome(done.notes, int8)


def _full(component: str, name: str) -> str:
    return f"{component}.{name}" if component else name


def atc_graphs(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/atc/``: ONNX graphs and ATC/AOE commands (the float graphs staged before
    quantizing moved in). Its int8 modules: the quantized ones under each root whose QDQ graph
    was written."""
    # an offloaded model (--max-memory): every block loaded while the QDQ graphs are traced
    with atomic_dir(directory, "atc", force=ctx.force) as tmp, resident(ctx.adapter.model):
        staged = None
        if ctx.float_graphs is not None:
            for f in sorted(ctx.float_graphs.directory.iterdir()):
                os.replace(f, tmp / f.name)
            ctx.float_graphs.directory.rmdir()
            staged = ctx.float_graphs.graphs
        notes = write_atc(
            ctx.adapter.model, ctx.float_model, list(ctx.adapter.roots()), ctx.calls, ctx.policy,
            tmp, mixlist=_mixlist(ctx.export_dir), say=ctx.say, float_graphs=staged,
        )  # fmt: skip
    if ctx.float_graphs is not None:
        notes = ctx.float_graphs.graphs.notes + notes
    return ExportOutcome(notes, _qdq_int8(ctx, directory))


def _qdq_int8(ctx: ModelExportContext, directory: Path) -> list[str]:
    """The quantized modules under the roots whose ``<root>.qdq.onnx`` is in ``directory``."""
    roots = [r for r in ctx.adapter.roots() if (directory / f"{r or 'model'}.qdq.onnx").is_file()]
    return [
        n
        for n, m in ctx.adapter.model.named_modules()
        if isinstance(m, QuantModule) and any(r == "" or n.startswith(f"{r}.") for r in roots)
    ]


@dataclass(frozen=True)
class StagedGraphs:
    """ATC's float graphs, exported from the float model before it was quantized.

    Attributes:
        directory: where their files wait (moved into ``export/atc/`` with the QDQ graphs).
        graphs: what was written (graph entries, notes, the traces the QDQ graphs reuse).
    """

    directory: Path
    graphs: FloatGraphs


def stage_float_graphs(
    adapter: ModelAdapter,
    policy: ResolvedPolicy,
    calls: Mapping[str, Sequence[Call]],
    export_dir: Path,
    *,
    say: Callable[[str], None] = log.info,
) -> StagedGraphs:
    """Export each root's float ATC graph from ``adapter.model`` while it is still float, into
    ``export_dir/.atc-float/`` (calibrate's export phase moves them into ``export/atc/``): no
    second float copy of the model is loaded for them. Needs the policy exports written (the
    ``--modify_mixlist`` file)."""
    directory = export_dir / ".atc-float"
    graphs = write_float_graphs(
        adapter.model, list(adapter.roots()), calls, policy, directory,
        mixlist=_mixlist(export_dir), say=say, int8=list(policy.int8()),
    )  # fmt: skip
    return StagedGraphs(directory, graphs)


def notes_file(export_dir: Path, name: str) -> tuple[Path, str]:
    """The notes file of export ``name`` in ``export_dir`` and its output kind."""
    return export_dir / f"{name}.notes.txt", f"{name}.notes"


def _write_notes(export_dir: Path, name: str, lines: list[str], force: bool) -> list[str]:
    path, kind = notes_file(export_dir, name)
    if lines:
        write_output_file(path, "\n".join(lines) + "\n", kind, force=force)
    else:
        remove_output_file(path, kind)  # an earlier run's notes; a user's file stays
    for line in lines:
        log.info("%s: %s", name, line)
    return [f"{name}: {line}" for line in lines]
