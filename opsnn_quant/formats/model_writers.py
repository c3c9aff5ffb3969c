"""The model exports' writers: ``export/ascendv1/``, ``export/mindie-sd/`` and ``export/atc/``
written from the quantized model into a directory they are given.

The ``model`` entries of the format table (:mod:`opsnn_quant.formats.registry`) point at the
writers here (``(ctx, directory) -> ExportOutcome``); the commands run them
(:func:`opsnn_quant.pipeline.model_exports.write_model_exports`), each into its own output
directory, which they own.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from opsnn_quant.formats.ascendv1.export import export_ascendv1
from opsnn_quant.formats.atc.export import FloatGraphs, write_atc, write_float_graphs
from opsnn_quant.formats.mindie_sd.export import export_mindie_sd
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


@dataclass(frozen=True)
class ExportOutcome:
    """What a model export's handler returns: its notes and the modules it wrote in int8
    (full names: what deploys quantized, whatever the policy asked)."""

    notes: list[str]
    int8: list[str]


@dataclass(frozen=True)
class ModelExportContext:
    """What a model export's writer (``(ctx, directory) -> ExportOutcome``, the format table's
    ``model`` kind) takes: see :func:`opsnn_quant.pipeline.model_exports.write_model_exports`'
    arguments."""

    adapter: ModelAdapter
    policy: ResolvedPolicy
    calls: Mapping[str, Sequence[Call]]
    export_dir: Path
    float_model: nn.Module | None
    float_graphs: StagedGraphs | None
    say: Callable[[str], None]


def ascendv1(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/ascendv1/``: AscendV1 weights (vLLM-Ascend / SGLang)."""
    ctx.say("exporting AscendV1 weights (vLLM-Ascend / SGLang)")
    # an offloaded model (--max-memory): block by block (with SmoothQuant folds: resident)
    done = export_ascendv1(ctx.adapter, directory, calls=ctx.calls)
    int8 = [_full(c, n) for c, e in done.components.items() for n in e.int8]
    return ExportOutcome(done.notes, int8)


def mindie_sd(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/mindie-sd/``: per component, the files ``mindiesd.quantize`` loads."""
    ctx.say("exporting MindIE-SD weights (mindiesd.quantize)")
    done = export_mindie_sd(ctx.adapter, directory)  # offloaded: block by block
    int8 = [_full(c, n) for c, f in done.components.items() for n in f.int8]
    return ExportOutcome(done.notes, int8)


def _full(component: str, name: str) -> str:
    return f"{component}.{name}" if component else name


def atc_graphs(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/atc/``: ONNX graphs and ATC/AOE commands (the float graphs staged before
    quantizing moved in). Its int8 modules: the quantized ones under each root whose QDQ graph
    was written."""
    # an offloaded model (--max-memory): every block loaded while the QDQ graphs are traced
    with resident(ctx.adapter.model):
        staged = None
        if ctx.float_graphs is not None:
            for f in sorted(ctx.float_graphs.directory.iterdir()):
                os.replace(f, directory / f.name)
            ctx.float_graphs.directory.rmdir()
            staged = ctx.float_graphs.graphs
        notes = write_atc(
            ctx.adapter.model, ctx.float_model, list(ctx.adapter.roots()), ctx.calls, ctx.policy,
            directory, mixlist=_mixlist(ctx.export_dir), say=ctx.say, float_graphs=staged,
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
