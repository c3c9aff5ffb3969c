"""opsnn-quant: probe, decide, calibrate and evaluate precision for Ascend NPU deployment.

The whole workflow is here: ``probe`` -> ``build_policy`` -> ``quantize`` -> ``save_quantized``
-> ``export_policy`` -> ``evaluate``. Names are imported lazily, so ``import opsnn_quant`` stays
light (no torch_npu, transformers, diffusers or torchmetrics until a function that needs them is
called); the ``TYPE_CHECKING`` imports below show type checkers and IDEs the real objects.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opsnn_quant.core.determinism import set_reproducible
    from opsnn_quant.errors import InputError, OpsnnQuantError
    from opsnn_quant.evaluation.evaluate import evaluate
    from opsnn_quant.evaluation.render import write_report
    from opsnn_quant.evaluation.suite import load_suite
    from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
    from opsnn_quant.formats.policy_files import export_policy
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.models.family import Family, FamilySettings, register_family
    from opsnn_quant.policy.budget import Budget
    from opsnn_quant.policy.schema import PrecisionPolicy, ResolvedPolicy
    from opsnn_quant.policy.search import build_policy
    from opsnn_quant.policy.targets import get_target
    from opsnn_quant.probe.api import ProbeConfig, ProbeResult, probe, run_probe
    from opsnn_quant.probe.report import SensitivityReport
    from opsnn_quant.quant.api import quantize
    from opsnn_quant.quant.modules import QuantModule, register_quant_module
    from opsnn_quant.quant.spec import QuantSpec
    from opsnn_quant.types import ForwardLoop, Modality, Precision

from opsnn_quant.version import __version__ as __version__  # the package root names it too

# public name -> module that defines it (the TYPE_CHECKING imports above, for run time)
_EXPORTS: dict[str, str] = {
    "Precision": "opsnn_quant.types",
    "Modality": "opsnn_quant.types",
    "ForwardLoop": "opsnn_quant.types",
    "OpsnnQuantError": "opsnn_quant.errors",
    "InputError": "opsnn_quant.errors",
    "QuantSpec": "opsnn_quant.quant.spec",
    "QuantModule": "opsnn_quant.quant.modules",
    "register_quant_module": "opsnn_quant.quant.modules",
    "quantize": "opsnn_quant.quant.api",
    "save_quantized": "opsnn_quant.formats.checkpoint",
    "load_quantized": "opsnn_quant.formats.checkpoint",
    "probe": "opsnn_quant.probe.api",
    "ProbeConfig": "opsnn_quant.probe.api",
    "ProbeResult": "opsnn_quant.probe.api",
    "run_probe": "opsnn_quant.probe.api",
    "ResolvedPolicy": "opsnn_quant.policy.schema",
    "SensitivityReport": "opsnn_quant.probe.report",
    "PrecisionPolicy": "opsnn_quant.policy.schema",
    "build_policy": "opsnn_quant.policy.search",
    "export_policy": "opsnn_quant.formats.policy_files",
    "Budget": "opsnn_quant.policy.budget",
    "get_target": "opsnn_quant.policy.targets",
    "evaluate": "opsnn_quant.evaluation.evaluate",
    "load_suite": "opsnn_quant.evaluation.suite",
    "write_report": "opsnn_quant.evaluation.render",
    "load_adapter": "opsnn_quant.models",
    "ModelAdapter": "opsnn_quant.models.base",
    "Family": "opsnn_quant.models.family",
    "FamilySettings": "opsnn_quant.models.family",
    "register_family": "opsnn_quant.models.family",
    "load_records": "opsnn_quant.models.data",
    "set_reproducible": "opsnn_quant.core.determinism",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'opsnn_quant' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Budget",
    "Family",
    "FamilySettings",
    "ForwardLoop",
    "InputError",
    "Modality",
    "ModelAdapter",
    "OpsnnQuantError",
    "Precision",
    "PrecisionPolicy",
    "ProbeConfig",
    "ProbeResult",
    "QuantModule",
    "QuantSpec",
    "ResolvedPolicy",
    "SensitivityReport",
    "build_policy",
    "evaluate",
    "export_policy",
    "get_target",
    "load_adapter",
    "load_quantized",
    "load_records",
    "load_suite",
    "probe",
    "quantize",
    "register_family",
    "register_quant_module",
    "run_probe",
    "save_quantized",
    "set_reproducible",
    "write_report",
]
