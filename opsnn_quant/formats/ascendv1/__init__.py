"""AscendV1: msModelSlim's weight format, loaded by vLLM-Ascend and SGLang.

* :func:`export_ascendv1` writes a quantized model into a directory in this layout
  (:mod:`.export`, one component's tensors in :mod:`.writer`);
* :func:`read_ascendv1` checks an AscendV1 directory (ours or msModelSlim's) against the tensor
  contract (:mod:`.contract`); :func:`apply_ascendv1` loads it into a float model, its quantized
  Linears as :class:`AscendV1Linear` (the engines' formulas, :mod:`.consumer`).

The names below are imported on first use (PEP 562): the format's own modules import
:mod:`.contract` through this package, and the shared safetensors reader imports it too, so an
eager import here would run in a circle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opsnn_quant.formats.ascendv1.consumer import AscendV1Linear, apply_ascendv1
    from opsnn_quant.formats.ascendv1.contract import AscendV1Error
    from opsnn_quant.formats.ascendv1.export import AscendV1Export, export_ascendv1
    from opsnn_quant.formats.ascendv1.reader import (
        AscendV1Checkpoint,
        is_ascendv1_dir,
        read_ascendv1,
    )

_LAZY = {
    "AscendV1Checkpoint": "reader",
    "AscendV1Error": "contract",
    "AscendV1Export": "export",
    "AscendV1Linear": "consumer",
    "apply_ascendv1": "consumer",
    "export_ascendv1": "export",
    "is_ascendv1_dir": "reader",
    "read_ascendv1": "reader",
}
__all__ = [
    "AscendV1Checkpoint",
    "AscendV1Error",
    "AscendV1Export",
    "AscendV1Linear",
    "apply_ascendv1",
    "export_ascendv1",
    "is_ascendv1_dir",
    "read_ascendv1",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
