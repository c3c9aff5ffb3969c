"""Which module produces each module's input: one recorded call per root, traced with hooks.

A module whose input tensor is another module's output (the same tensor, or a view of its storage
with the same last dim) has that module as producer. Used where a SmoothQuant factor must go
into the op before a Linear (a norm's gain or a float Linear's rows): by the AscendV1 writer's
folds (:mod:`opsnn_quant.folding.smooth_fold`) and by the policy of a target whose engine takes
its smoothing folded (:func:`fold_groups`). Hooks see module calls only; a fold is also checked
numerically where it is written.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from opsnn_quant.recording import Call, replay

# The denoising step the traces run a model at: it picks the scales of per-step (w8a8_timestep)
# modules only, which no trace depends on; without a step those modules refuse to run.
ANY_STEP = 0


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


def fold_groups(model: nn.Module, roots: Mapping[str, Sequence[Call]]) -> dict[str, list[str]]:
    """The Linears that can share one folded SmoothQuant factor: producer -> consumers (sorted),
    for each norm (LayerNorm/RMSNorm with a gain over the last dim) whose output feeds only
    ``nn.Linear`` modules whose input is that norm's output alone; traced on one call per root
    of the float ``model`` (the calls as given: a caller passes one small sample of each)."""
    producers, fed = trace_producers(model, roots)
    named = dict(model.named_modules())
    groups = {}
    for producer, consumers in sorted(fed.items()):
        if not producer or not is_norm(named[producer]) or not consumers:
            continue
        if all(type(named[c]) is nn.Linear and producers.get(c) == {producer} for c in consumers):
            groups[producer] = sorted(consumers)
    return groups
