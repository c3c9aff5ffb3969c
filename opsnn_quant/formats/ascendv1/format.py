"""The AscendV1 format, both ways: written from the quantized model (``export/ascendv1/``), and
an AscendV1 directory (ours, or msModelSlim's) read as a candidate with the engines'
arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.calibrate_output import ExportedDirectory
from opsnn_quant.quant.engines import VLLM_ASCEND

if TYPE_CHECKING:
    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.probe.report import SensitivityReport


class AscendV1Format(ExportedDirectory):
    """AscendV1 weights (vLLM-Ascend, SGLang)."""

    name = "ascendv1"
    kind = "model"
    output = "ascendv1"
    handler = "opsnn_quant.formats.ascendv1.model_export:write"
    read_order = 20  # after MindIE-SD, whose files are quant_model_* too
    # SmoothQuant factors are folded into the producers: traced on one call per root
    root_calls = "smoothed"
    root_calls_for = "folding its SmoothQuant factors"
    attention = VLLM_ASCEND.attention_note

    @classmethod
    def recognises(cls, path: Path) -> bool:
        from opsnn_quant.formats.ascendv1.candidate import looks_ascendv1

        return looks_ascendv1(path)

    def float_source(self, path: Path, baseline: str | None) -> str:
        from opsnn_quant.formats.ascendv1.candidate import (
            check_ascendv1_candidate,
            recorded_source,
        )

        check_ascendv1_candidate(path)  # whole (every header, every tensor) before output
        return _known(path, baseline or recorded_source(path))

    def load_candidate(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        from opsnn_quant.formats.ascendv1.candidate import load_ascendv1_candidate, recorded_source

        source = _known(path, baseline or recorded_source(path))
        return load_ascendv1_candidate(path, source, family, **placement), None


def _known(path: Path, source: str | None) -> str:
    if not source:
        raise ConfigError(
            f"{path} is an AscendV1 directory: pass --baseline, the float model it was "
            "quantized from"
        )
    return str(source)
