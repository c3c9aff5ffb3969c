"""opsnn-quant: probe, decide, calibrate and evaluate precision for Ascend NPU deployment.

The public API is re-exported here lazily, so ``import opsnn_quant`` stays light (no torch_npu,
transformers, diffusers or torchmetrics until a function that needs them is called).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Precision": "opsnn_quant.types",
    "Modality": "opsnn_quant.types",
    "ForwardLoop": "opsnn_quant.types",
    "OpsnnQuantError": "opsnn_quant.errors",
    "InputError": "opsnn_quant.errors",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'opsnn_quant' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
