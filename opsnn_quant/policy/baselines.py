"""Reference policies to compare the searched one against (issue: is the search worth it?).

* ``all-w8a8-minmax``: every Linear/Conv2d that ran during probing and that the target can run in
  static W8A8 goes int8 with the
  plainest calibration (per-tensor min/max, no SmoothQuant), no fp32 pins, no fallbacks.
* ``all-w8a8-dynamic``: every Linear/Conv2d that ran and that the target runs in W8A8_DYNAMIC
  goes int8 with per-token dynamic activation scales (per-channel weights, no SmoothQuant); the
  rest stays fp16 (on 910B eager every Conv2d: torch_npu has no int8 conv op).
* ``all-w8a8-minmax-a8``, ``all-w8a8-dynamic-a8``: the same, and every attention module the
  target runs in int8 attention (``a8``, static per-tensor min/max scales) whose calls the fused
  op takes; on a target without int8 attention, the Linear-only baseline again.
* ``all-fp16``: nothing int8; every modality in fp16 (on CPU, evaluate the float model cast to
  fp16 to see fp16's own error).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, get_args

from opsnn_quant.policy.rule import QuantFields
from opsnn_quant.policy.schema import PrecisionPolicy, Rule, derive_prefixes
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision

Strategy = Literal[
    "search",
    "all-w8a8-minmax",
    "all-w8a8-dynamic",
    "all-w8a8-minmax-a8",
    "all-w8a8-dynamic-a8",
    "all-fp16",
]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
_A8 = "; every attention in int8 (a8, min/max)"
# The Linear/Conv2d precision, the reason, and whether attention goes int8 too, of each
# all-int8 baseline (measured in this order by a measured search).
NAIVE_INT8 = {
    "all-w8a8-minmax": (Precision.W8A8, "naive baseline: all W8A8, min/max", False),
    "all-w8a8-dynamic": (
        Precision.W8A8_DYNAMIC,
        "naive baseline: all W8A8 dynamic (per token)",
        False,
    ),
    "all-w8a8-minmax-a8": (Precision.W8A8, f"naive baseline: all W8A8, min/max{_A8}", True),
    "all-w8a8-dynamic-a8": (
        Precision.W8A8_DYNAMIC,
        f"naive baseline: all W8A8 dynamic (per token){_A8}",
        True,
    ),
}
# The probe's schemes each all-int8 baseline applies everywhere (what a recipe's probe.schemes
# must allow for the baseline to be one of its candidates).
NAIVE_SCHEMES: dict[str, tuple[str, ...]] = {
    "all-w8a8-minmax": ("w8a8",),
    "all-w8a8-dynamic": ("w8a8_dynamic",),
    "all-w8a8-minmax-a8": ("w8a8", "a8"),
    "all-w8a8-dynamic-a8": ("w8a8_dynamic", "a8"),
}


def probed_schemes(strategy: str, schemes: Sequence[str]) -> tuple[str, ...]:
    """The schemes among ``schemes`` a run deciding by ``strategy`` probes: all of them for the
    search; a naive baseline's own scheme alone (none for ``all-fp16``): it reads its own
    scheme's pass-1 statistics and nothing else, so no other scheme's observers are paid for
    (GPTQ's K x K moments per module, SmoothQuant's channel maxima)."""
    if strategy == "search":
        return tuple(schemes)
    naive = NAIVE_SCHEMES.get(strategy, ())
    return tuple(s for s in schemes if s in naive)


def baselines_first(config: ProbeConfig) -> ProbeConfig:
    """Pass 1 of a measured search that decides first: the statistics of the naive baselines'
    schemes only (the candidates measured before any estimate); the other schemes' observers
    (GPTQ's K x K moments per module above all) are paid for only if the estimators run."""
    schemes = config.schemes if config.schemes is not None else tuple(SCHEMES)
    naive = {s for used in NAIVE_SCHEMES.values() for s in used}
    return dataclasses.replace(config, schemes=tuple(s for s in schemes if s in naive))


def int8_runnable(report: SensitivityReport, target: Target) -> list[str]:
    """The modules a policy can put in int8 on ``target`` at all: quantizable, called while
    probing, not kept float by the engine (a head tied to an embedding on vLLM-Ascend), of a
    type and shape the target runs in some int8 precision. A policy with all of them int8 has
    full coverage: no candidate has more int8 MACs."""
    out = []
    for e in report.modules:
        if not e.quantizable or e.calls == 0 or target.tie_reason(e.tied_to) is not None:
            continue
        if e.modality == Modality.OTHER:  # kept float by its family (see naive_policy)
            continue
        if e.refused is not None:  # every scheme infeasible (a call the fused attention refuses)
            continue
        shape = e.weight_shape
        if any(
            target.can_run(e.type, p, weight_shape=shape)[0] for p in target.int8_precisions(e.type)
        ):
            out.append(e.name)
    return out


def naive_policy(report: SensitivityReport, target: Target, strategy: str) -> PrecisionPolicy:
    """The ``strategy`` policy for the modules of ``report`` (see module docstring)."""
    modalities = derive_prefixes((e.name, e.modality) for e in report.modules)
    defaults = {
        Modality(m): Precision.FP16 for m in sorted({e.modality.value for e in report.modules})
    }
    rules: list[Rule] = []
    if strategy in NAIVE_INT8:
        linear, reason, attention = NAIVE_INT8[strategy]
        for e in report.modules:
            if not e.quantizable or e.calls == 0:  # never run (e.g. a t2i pipeline's VAE encoder)
                continue
            # "other": no root, no estimate, never int8 in a searched policy either; a family
            # puts there what must stay float (Wan's time embedding: int8, its forward fails)
            if e.modality == Modality.OTHER:
                continue
            if (
                target.tie_reason(e.tied_to) is not None
            ):  # the engine runs it float, whatever we write
                continue
            if e.refused is not None:  # the op refuses it (an attention's decode calls)
                continue
            for precision in (linear, Precision.A8) if attention else (linear,):
                if target.can_run(e.type, precision)[0]:
                    quant = QuantFields.from_spec(target.spec_for(QuantSpec(precision)))
                    rules.append(
                        Rule(match=e.name, precision=precision, quant=quant, reason=reason)
                    )
    elif strategy != "all-fp16":
        raise ValueError(f"unknown baseline strategy {strategy!r}")
    return PrecisionPolicy(
        model=report.model,
        target=target.name,
        modalities=modalities,
        defaults=defaults,
        rules=rules,
        notes=[f"baseline strategy {strategy}: not searched"],
    )
