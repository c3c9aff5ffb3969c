"""Where a SmoothQuant factor can go when the engine's formula has no place for it.

Our modules fold SmoothQuant's per-input-channel factor ``s`` into AscendQuantV2's per-channel
multiplier (static) or DynamicQuant's ``smooth_scales`` (dynamic). AscendV1 has neither: W8A8 has
one ``input_scale`` per tensor and W8A8_DYNAMIC calls ``npu_dynamic_quant(x)`` without smooth
scales (vLLM-Ascend ``w8a8_static.py``/``w8a8_dynamic.py``). So ``x / s`` must come out of the op
before the Linear, as msModelSlim's anti-outlier processors do (``subgraph_fusion.py``
``apply_smooth_scale_shift``: ``norm-linear`` divides the norm's weight and bias by ``s``,
``linear-linear`` divides the producer Linear's rows).

How the producer is found: one recorded call per root runs with hooks on every module; a module
whose input tensor is another module's output (the same tensor, or a view of its storage with the
same last dim) has that module as producer. A fold of producer ``P`` is possible when ``P`` is a
LayerNorm/RMSNorm with a weight over the last dim, or a float ``nn.Linear``, and every module fed
by ``P``'s output is either a smoothed Linear with exactly the same factor, or a float
``nn.Linear`` (its weight columns absorb ``s``). Hooks cannot see tensor uses outside modules (a
residual sum of the norm's output), so each fold is also checked numerically: the root, its
quantized modules replaced by float Linears/Convs of the dequantized weights, must give the same
output with the fold applied (relative error below :data:`FOLD_TOLERANCE`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from opsnn_quant.core.memory import trim_heap
from opsnn_quant.folding.fold_check import Fold, check_calls, fold_errors
from opsnn_quant.producers import is_norm, trace_producers
from opsnn_quant.quant.modules import no_weight_copies
from opsnn_quant.recording import Call, sample_subset

log = logging.getLogger(__name__)
FOLD_TOLERANCE = 1e-4
# Samples of each root's first call that the trace and the fold checks run: a fold is an identity
# or it is not, on any sample. A whole batch of a Whisper model (its encoder's attention scores at
# batch 4) was the AscendV1 export's and the whole calibrate's peak memory.
FOLD_CHECK_SAMPLES = 1


def plan_folds(
    model: nn.Module,
    smooth: Mapping[str, torch.Tensor],
    roots: Mapping[str, Sequence[Call]],
    scope: Callable[[str], str],
) -> tuple[list[Fold], dict[str, str]]:
    """Folds for the smoothed Linears ``smooth`` (name -> factor); returns (folds, refused name ->
    one-line reason). ``scope`` maps a module name to its component: a fold never crosses one.

    The trace and the checks run :data:`FOLD_CHECK_SAMPLES` samples of each root's first call
    (the whole call when it cannot be split by samples)."""
    roots = {
        r: [sample_subset(calls[0], FOLD_CHECK_SAMPLES)] for r, calls in roots.items() if calls
    }
    with no_weight_copies(model):  # one replay per root gains nothing from fp32 weight copies
        producers, fed = trace_producers(model, roots)
    trim_heap()  # the trace's freed activations, before the checks replay the model again
    named = dict(model.named_modules())
    refused: dict[str, str] = {}
    by_producer: dict[str, list[str]] = defaultdict(list)
    for name in smooth:
        found = producers.get(name, set())
        if not found:
            refused[name] = "not reached by the traced call, so its input's producer is unknown"
        elif len(found) != 1 or "" in found:
            refused[name] = "its input is not the output of one module (no op to fold into)"
        else:
            by_producer[next(iter(found))].append(name)
    folds: list[Fold] = []
    for producer, consumers in by_producer.items():
        reason = _fold_problem(named, producer, consumers, fed.get(producer, set()), smooth, scope)
        if reason is not None:
            refused.update(dict.fromkeys(consumers, reason))
            continue
        siblings = sorted(fed[producer] - set(consumers))
        folds.append(
            Fold(producer, smooth[consumers[0]], tuple(sorted(consumers)), tuple(siblings))
        )
    checked = []
    with no_weight_copies(model):
        errors = fold_errors(model, folds, check_calls(model, folds, roots))
    for fold, err in zip(folds, errors, strict=True):
        if err is None or err <= FOLD_TOLERANCE:
            checked.append(fold)
        else:
            reason = f"folding into {fold.producer} changes the model's output ({err:.1e} rel.)"
            refused.update(dict.fromkeys(fold.consumers, reason))
    return checked, refused


def _fold_problem(
    named: Mapping[str, nn.Module],
    producer: str,
    consumers: list[str],
    fed: set[str],
    smooth: Mapping[str, torch.Tensor],
    scope: Callable[[str], str],
) -> str | None:
    module = named[producer]
    if scope(producer) != scope(consumers[0]):
        return f"its input comes from another component ({producer})"
    if not (is_norm(module) or type(module) is nn.Linear):
        kind = type(module).__name__
        return f"its input comes from {producer} ({kind}), not a norm or float Linear to fold into"
    factor = smooth[consumers[0]]
    for other in sorted(fed):
        mod = named[other]
        if other in smooth:
            if not torch.equal(smooth[other], factor):
                return (
                    f"{producer} feeds {consumers[0]} and {other}, smoothed with different "
                    "factors (one norm cannot divide by both)"
                )
        elif type(mod) is not nn.Linear:
            return (
                f"{producer} also feeds {other} ({type(mod).__name__}), which needs its input as is"
            )
    return None


__all__ = ["plan_folds"]
