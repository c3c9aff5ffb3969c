"""The ``ascendv1`` entry's writer: ``export/ascendv1/``, AscendV1 weights (vLLM-Ascend /
SGLang), from the quantized model."""

from __future__ import annotations

from pathlib import Path

from opsnn_quant.formats.ascendv1.export import export_ascendv1
from opsnn_quant.formats.model_writers import ExportOutcome, ModelExportContext, full_name


def write(ctx: ModelExportContext, directory: Path) -> ExportOutcome:
    """``export/ascendv1/``: AscendV1 weights (vLLM-Ascend / SGLang)."""
    ctx.say("exporting AscendV1 weights (vLLM-Ascend / SGLang)")
    # an offloaded model (--max-memory): block by block (with SmoothQuant folds: resident)
    done = export_ascendv1(ctx.adapter, directory, calls=ctx.calls)
    int8 = [full_name(c, n) for c, e in done.components.items() for n in e.int8]
    return ExportOutcome(done.notes, int8)
