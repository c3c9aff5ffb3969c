"""The ``mindie-sd`` entry's writer: ``export/mindie-sd/``, per component the files
``mindiesd.quantize`` loads, from the quantized model."""

from __future__ import annotations

from pathlib import Path

from opsnn_quant.formats.mindie_sd.export import export_mindie_sd
from opsnn_quant.formats.model_writers import ExportOutcome, ModelExportContext, full_name


def write(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/mindie-sd/``: per component, the files ``mindiesd.quantize`` loads."""
    ctx.say("exporting MindIE-SD weights (mindiesd.quantize)")
    done = export_mindie_sd(ctx.adapter, directory)  # offloaded: block by block
    int8 = [full_name(c, n) for c, f in done.components.items() for n in f.int8]
    return ExportOutcome(done.notes, int8)
