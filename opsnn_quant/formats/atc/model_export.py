"""The ``atc`` entry's writer: ``export/atc/``, per root the float and QDQ ONNX graphs and the
ATC/AOE commands that compile them; and what it stages from the float model before it is
quantized (its float graphs: no second float copy of the model is loaded for them)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opsnn_quant.formats.atc.export import FloatGraphs, write_atc, write_float_graphs
from opsnn_quant.formats.model_writers import ExportOutcome, ModelExportContext
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
    ``export_dir/.atc-float/`` (the writer moves them into ``export/atc/``): no second float
    copy of the model is loaded for them. Needs the policy exports written (the
    ``--modify_mixlist`` file)."""
    directory = export_dir / ".atc-float"
    graphs = write_float_graphs(
        adapter.model, list(adapter.roots()), calls, policy, directory,
        mixlist=_mixlist(export_dir), say=say, int8=list(policy.int8()),
    )  # fmt: skip
    return StagedGraphs(directory, graphs)


def write(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/atc/``: ONNX graphs and ATC/AOE commands (the float graphs staged before
    quantizing, :class:`StagedGraphs` in ``ctx.staged``, moved in; else those of
    ``ctx.float_model``). Its int8 modules: the quantized ones under each root whose QDQ graph
    was written."""
    staged: StagedGraphs | None = ctx.staged
    # an offloaded model (--max-memory): every block loaded while the QDQ graphs are traced
    with resident(ctx.adapter.model):
        float_graphs = None
        if staged is not None:
            for f in sorted(staged.directory.iterdir()):
                os.replace(f, directory / f.name)
            staged.directory.rmdir()
            float_graphs = staged.graphs
        notes = write_atc(
            ctx.adapter.model, ctx.float_model, list(ctx.adapter.roots()), ctx.calls, ctx.policy,
            directory, mixlist=_mixlist(ctx.export_dir), say=ctx.say, float_graphs=float_graphs,
        )  # fmt: skip
    if staged is not None:
        notes = staged.graphs.notes + notes
    return ExportOutcome(notes, _qdq_int8(ctx, directory))


def _qdq_int8(ctx: ModelExportContext, directory: Path) -> list[str]:
    """The quantized modules under the roots whose ``<root>.qdq.onnx`` is in ``directory``."""
    roots = [r for r in ctx.adapter.roots() if (directory / f"{r or 'model'}.qdq.onnx").is_file()]
    return [
        n
        for n, m in ctx.adapter.model.named_modules()
        if isinstance(m, QuantModule) and any(r == "" or n.startswith(f"{r}.") for r in roots)
    ]
