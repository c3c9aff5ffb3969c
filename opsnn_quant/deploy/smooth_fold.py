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
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from opsnn_quant.deploy.fold_check import ANY_STEP, Fold, check_calls, fold_errors
from opsnn_quant.memory import trim_heap
from opsnn_quant.quant.modules import no_weight_copies
from opsnn_quant.recording import Call, replay, sample_subset

log = logging.getLogger(__name__)
FOLD_TOLERANCE = 1e-4
# Samples of each root's first call that the trace and the fold checks run: a fold is an identity
# or it is not, on any sample. A whole batch of a Whisper model (its encoder's attention scores at
# batch 4) was the AscendV1 export's and the whole calibrate's peak memory.
FOLD_CHECK_SAMPLES = 1


def is_norm(module: nn.Module) -> bool:
    """LayerNorm with an affine weight, or an RMSNorm-like module (class name ``*RMSNorm``) with a
    1-D weight: a per-last-dim-channel gain a factor can be divided into."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return False
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    # A view (reshape/flatten of the batch dims) of the producer's output keeps its channels.
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.numel() == b.numel()
        and a.shape[-1] == b.shape[-1]
        and a.is_contiguous()
        and b.is_contiguous()
    )


def _same_tensor_alive(out: torch.Tensor | weakref.ref[torch.Tensor], x: torch.Tensor) -> bool:
    t = out if isinstance(out, torch.Tensor) else out()
    return t is not None and _same_tensor(t, x)


def trace_producers(
    model: nn.Module, roots: Mapping[str, Sequence[Call]]
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Run one call per root with hooks; returns (module -> producers of its input, producer ->
    modules fed by its output). Names are those of ``model``."""
    outputs: list[tuple[str, torch.Tensor | weakref.ref[torch.Tensor]]] = []
    producers: dict[str, set[str]] = defaultdict(set)
    fed: dict[str, set[str]] = defaultdict(set)

    def pre(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else next(iter(kwargs.values()), None)
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                return
            found = [p for p, out in reversed(outputs) if _same_tensor_alive(out, x)]
            producers[name].add(found[0] if found else "")
            if found:
                fed[found[0]].add(name)

        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if isinstance(output, torch.Tensor):
                # Only a norm's or float Linear's output can take a fold: those are kept; the
                # others (a UNet's whole activations) are weakly referenced, to still be seen
                # as the producer of the tensors they return while those live.
                keep = is_norm(module) or type(module) is nn.Linear
                outputs.append((name, output if keep else weakref.ref(output)))

        return hook

    named = dict(model.named_modules())
    handles = []
    for name, module in named.items():
        if name:
            handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post(name)))
    try:
        with torch.no_grad():
            for root, calls in roots.items():
                if calls and root in named:
                    replay(named[root], calls[0], ANY_STEP)
                outputs.clear()
    finally:
        for h in handles:
            h.remove()

    # A container fed by P hands the tensor on to a descendant, which is seen itself; any other
    # use it makes is an op the numerical check sees.
    def inner(ms: set[str]) -> set[str]:
        return {m for m in ms if not any(o.startswith(f"{m}.") for o in ms)}

    return dict(producers), {p: inner(ms) for p, ms in fed.items()}


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


__all__ = ["is_norm", "plan_folds", "trace_producers"]
