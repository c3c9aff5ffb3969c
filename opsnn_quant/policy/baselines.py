"""Reference policies to compare the searched one against (issue: is the search worth it?).

* ``all-w8a8-minmax``: every Linear/Conv2d that ran during probing and that the target can run in
  static W8A8 goes int8 with the
  plainest calibration (per-tensor min/max, no SmoothQuant), no fp32 pins, no fallbacks.
* ``all-fp16``: nothing int8; every modality in fp16 (on CPU, evaluate the float model cast to
  fp16 to see fp16's own error).
"""

from __future__ import annotations

from opsnn_quant.policy.schema import PrecisionPolicy, Rule, derive_prefixes
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.types import Modality, Precision

STRATEGIES = ("search", "all-w8a8-minmax", "all-fp16")


def naive_policy(report: SensitivityReport, target: str, strategy: str) -> PrecisionPolicy:
    """The ``strategy`` policy for the modules of ``report`` (see module docstring)."""
    t = get_target(target)
    modalities = derive_prefixes((e.name, e.modality) for e in report.modules)
    defaults = {
        Modality(m): Precision.FP16 for m in sorted({e.modality.value for e in report.modules})
    }
    rules: list[Rule] = []
    if strategy == "all-w8a8-minmax":
        for e in report.modules:
            if not e.quantizable or e.calls == 0:  # never run (e.g. a t2i pipeline's VAE encoder)
                continue
            ok, _ = t.can_run(e.type, Precision.W8A8)
            if ok:
                rules.append(
                    Rule(
                        match=e.name,
                        precision=Precision.W8A8,
                        reason="naive baseline: all W8A8, min/max",
                    )
                )
    elif strategy != "all-fp16":
        raise ValueError(f"unknown baseline strategy {strategy!r}")
    return PrecisionPolicy(
        model=report.model,
        target=t.name,
        modalities=modalities,
        defaults=defaults,
        rules=rules,
        notes=[f"baseline strategy {strategy}: not searched"],
    )
