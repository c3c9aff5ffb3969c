"""Precision policy: schema (``policy.yaml``), targets, the search, exports to Ascend tools.

Public names are imported lazily so that ``import opsnn_quant.policy`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "PrecisionPolicy": "opsnn_quant.policy.schema",
    "Rule": "opsnn_quant.policy.rule",
    "QuantFields": "opsnn_quant.policy.rule",
    "Resolved": "opsnn_quant.policy.schema",
    "Target": "opsnn_quant.policy.targets",
    "get_target": "opsnn_quant.policy.targets",
    "TARGETS": "opsnn_quant.policy.targets",
    "Budget": "opsnn_quant.policy.budget",
    "ModalityLimit": "opsnn_quant.policy.budget",
    "FinalCheckSettings": "opsnn_quant.policy.budget",
    "FinalCheckResult": "opsnn_quant.policy.budget",
    "build_policy": "opsnn_quant.policy.search",
    "summarize": "opsnn_quant.policy.summary",
    "export_policy": "opsnn_quant.formats.policy_files",
    "FORMATS": "opsnn_quant.formats.policy_files",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'opsnn_quant.policy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
