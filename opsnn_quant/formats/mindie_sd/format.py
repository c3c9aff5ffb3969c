"""The MindIE-SD format, both ways: written from the quantized model (``export/mindie-sd/``: a
``quant_model_description_<type>.json`` per component), and such a directory read as a
candidate through MindIE-SD's Linear, in the dtype the engine runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.calibrate_output import CalibrateOutput, ExportedDirectory
from opsnn_quant.quant.engines import MINDIE_SD

if TYPE_CHECKING:
    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.probe.report import SensitivityReport


class MindIESDFormat(ExportedDirectory):
    """MindIE-SD's quantized components (``mindiesd.quantize``)."""

    name = "mindie-sd"
    kind = "model"
    output = "mindie-sd"
    handler = "opsnn_quant.formats.mindie_sd.model_export:write"
    read_order = 10
    attention = MINDIE_SD.attention_note

    @classmethod
    def recognises(cls, path: Path) -> bool:
        from opsnn_quant.formats.mindie_sd.reader import is_mindie_sd_dir

        return is_mindie_sd_dir(path)

    def float_source(self, path: Path, baseline: str | None) -> str:
        from opsnn_quant.formats.checkpoint import read_description
        from opsnn_quant.formats.mindie_sd.reader import component_descriptions, read_mindie_sd

        for desc in component_descriptions(path).values():  # every file check, up front
            read_mindie_sd(desc)
        holder = CalibrateOutput.holding(path)
        recorded = read_description(holder.quant).get("source_model") if holder else None
        if not (baseline or recorded):
            raise ConfigError(
                f"{path} is a MindIE-SD directory: pass --baseline, the float model it was "
                "quantized from"
            )
        return str(baseline or recorded)

    def run_dtype(self, path: Path, dtype: str) -> str:
        from opsnn_quant.formats.mindie_sd.reader import engine_dtype

        return engine_dtype(path, dtype)

    def load_candidate(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        import torch

        from opsnn_quant.formats.mindie_sd.reader import apply_mindie_sd_dir
        from opsnn_quant.models import load_adapter

        adapter = load_adapter(family, baseline or self.float_source(path, None), **placement)
        # mindiesd.quantize per component, in the dtype the pipeline runs
        apply_mindie_sd_dir(adapter.model, path, dtype=getattr(torch, placement["dtype"]))
        return adapter, None
