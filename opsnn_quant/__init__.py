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
    "QuantSpec": "opsnn_quant.quant.spec",
    "quantize": "opsnn_quant.quant.api",
    "save_quantized": "opsnn_quant.quant.checkpoint",
    "load_quantized": "opsnn_quant.quant.checkpoint",
    "probe": "opsnn_quant.probe.api",
    "ProbeConfig": "opsnn_quant.probe.api",
    "SensitivityReport": "opsnn_quant.probe.report",
    "PrecisionPolicy": "opsnn_quant.policy.schema",
    "build_policy": "opsnn_quant.policy.search",
    "Budget": "opsnn_quant.policy.budget",
    "get_target": "opsnn_quant.policy.targets",
    "load_adapter": "opsnn_quant.models",
    "set_reproducible": "opsnn_quant.determinism",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'opsnn_quant' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
