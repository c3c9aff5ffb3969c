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
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.quant.modules import QuantConv2d, QuantModule, no_weight_copies, set_submodule
from opsnn_quant.recording import Call, detached_copy, replay

log = logging.getLogger(__name__)
FOLD_TOLERANCE = 1e-4
# The denoising step the structure trace and the fold captures run the quantized model at: it
# picks the scales of per-step (w8a8_timestep) modules only, which neither depends on (and which
# AscendV1 writes float); without a step those modules refuse to run.
ANY_STEP = 0


@dataclass(frozen=True)
class Fold:
    """``producer``'s output channels are divided by ``factor``; ``consumers`` are the smoothed
    Linears that then see ``x / factor``; ``compensated`` the float Linears whose weight
    columns are multiplied by ``factor`` to keep their output."""

    producer: str
    factor: torch.Tensor
    consumers: tuple[str, ...]
    compensated: tuple[str, ...]


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
    one-line reason). ``scope`` maps a module name to its component: a fold never crosses one."""
    with no_weight_copies(model):
        return _plan_folds(model, smooth, roots, scope)


def _plan_folds(
    model: nn.Module,
    smooth: Mapping[str, torch.Tensor],
    roots: Mapping[str, Sequence[Call]],
    scope: Callable[[str], str],
) -> tuple[list[Fold], dict[str, str]]:
    producers, fed = trace_producers(model, roots)
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
    errors = fold_errors(model, folds, _check_calls(model, folds, roots))
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


@torch.no_grad()
def dequantized_weight(module: QuantModule[Any]) -> torch.Tensor:
    """The fp32 weight a frozen module's int8 weight means (its layout), SmoothQuant undone."""
    w = module.weight.to(torch.float32) * module.weight_quantizer.scale.reshape(
        -1, *[1] * (module.weight.dim() - 1)
    )
    smooth = getattr(module.input_quantizer, "smooth", None)
    return w if smooth is None else w / smooth.reshape(1, -1)


def _dequantized(module: QuantModule[Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(float weight, bias) that ``module``'s int8 weights mean, SmoothQuant undone."""
    return dequantized_weight(module), effective_bias(module)


def _float_twin(module: QuantModule[Any]) -> nn.Module:
    """A float module computing what ``module``'s int8 weights mean (no activation rounding)."""
    w, bias = _dequantized(module)
    if isinstance(module, QuantConv2d):
        conv = nn.Conv2d(module.in_channels, module.out_channels, 1, bias=bias is not None,
                         device="meta")  # fmt: skip
        conv.kernel_size, conv.stride = module.kernel_size, module.stride
        conv.padding, conv.dilation = module.padding, module.dilation
        conv.weight = nn.Parameter(w, requires_grad=False)
        if bias is not None:
            conv.bias = nn.Parameter(bias, requires_grad=False)
        return conv
    lin = nn.Linear(module.in_k, module.out_n, bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(w.reshape(module.out_n, module.in_k), requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias, requires_grad=False)
    return lin


class DequantizedTwin(nn.Module):
    """What :func:`_float_twin` computes, with the float weight made at each call and dropped.

    The fold check swaps every quantized module of the model for its float twin; built all at
    once they were a float copy of every quantized weight (4.4 GB for an SD 1.5 UNet, the
    AscendV1 export's peak). Same ``F.linear`` / ``F.conv2d`` as the twin modules, same numbers.
    """

    def __init__(self, module: QuantModule[Any]) -> None:
        super().__init__()
        self.source = (module,)  # a tuple: not a submodule, so named_modules() stops here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The float module's output on ``x``."""
        module = self.source[0]
        w, bias = _dequantized(module)
        if isinstance(module, QuantConv2d):
            return F.conv2d(x, w, bias, module.stride, module.padding, module.dilation)
        return F.linear(x, w.reshape(module.out_n, module.in_k), bias)


def effective_bias(module: QuantModule[Any]) -> torch.Tensor | None:
    """The float bias a frozen module applies: static ``(quant_bias + offset * sum(w)) * deq``
    (the int32 fold undone), else its float bias."""
    if not module.spec.static_activations:
        return None if module.bias is None else module.bias.to(torch.float32)
    w_sum = module.weight.reshape(module.out_n, -1).to(torch.float64).sum(dim=1)
    offset, qbias, deq = module.input_quantizer.offset, module.quant_bias, module.deq_scale
    if qbias.dim() == 2:  # w8a8_timestep: one row per group of steps, each the same float bias
        offset, qbias, deq = offset.reshape(-1)[0], qbias[0], deq[0]
    b = qbias.to(torch.float64) + float(offset) * w_sum
    return (b * deq.to(torch.float64)).to(torch.float32)


def _scope(fold: Fold) -> str:
    """The innermost module holding the producer and every module it feeds (a transformer
    block, typically): where a fold's effect must vanish."""
    names = [fold.producer, *fold.consumers, *fold.compensated]
    parts = [n.split(".") for n in names]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    if len(common) == min(len(p) for p in parts):  # one name holds the others: its parent
        common = common[:-1]
    return ".".join(common)


@torch.no_grad()
def _check_calls(
    model: nn.Module, folds: Sequence[Fold], roots: Mapping[str, Sequence[Call]]
) -> list[dict[str, list[Call]]]:
    """Per fold, the module whose output checks it and a call of it: the fold's scope (its first
    call, captured in one replay of the roots), else the innermost root holding the producer."""
    named = dict(model.named_modules())
    scopes = {_scope(f) for f in folds}
    captured: dict[str, Call] = {}

    def hook(name: str) -> Callable[..., None]:
        def take(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if name not in captured:
                captured[name] = detached_copy((args, kwargs))

        return take

    handles = [named[n].register_forward_pre_hook(hook(n), with_kwargs=True)
               for n in scopes if n and n in named]  # fmt: skip
    try:
        for root, calls in roots.items():
            if (
                calls
                and root in named
                and any(not root or n.startswith(f"{root}.") for n in scopes)
            ):
                replay(named[root], calls[0], ANY_STEP)
    finally:
        for h in handles:
            h.remove()
    out: list[dict[str, list[Call]]] = []
    for fold in folds:
        scope = _scope(fold)
        if scope in captured:
            out.append({scope: [captured[scope]]})
        else:
            holder = _smallest_root(fold.producer, roots)
            out.append({} if holder is None else {holder: list(roots[holder])})
    return out


@torch.no_grad()
def fold_errors(
    model: nn.Module, folds: Sequence[Fold], checks: Sequence[Mapping[str, Sequence[Call]]]
) -> list[float | None]:
    """Relative change of each fold's check module output (``checks``: module -> calls, per fold)
    when the fold is applied (alone) to a float twin of ``model`` (its quantized modules as
    dequantized float ones); None when nothing ran."""
    if not folds:
        return []
    named = dict(model.named_modules())
    quant = {n: m for n, m in named.items() if isinstance(m, QuantModule)}
    for n, m in quant.items():
        set_submodule(model, n, DequantizedTwin(m))
    try:
        out: list[float | None] = []
        for fold, check in zip(folds, checks, strict=True):
            base = _run_roots(model, check)
            if not base:
                out.append(None)
                continue
            # the fold rescales its consumers' float weights: those few are real modules
            rescaled = [n for n in fold.consumers if n in quant]
            for n in rescaled:
                set_submodule(model, n, _float_twin(quant[n]))
            try:
                out.append(_apply_and_compare(model, fold, check, base))
            finally:
                for n in rescaled:
                    set_submodule(model, n, DequantizedTwin(quant[n]))
        return out
    finally:
        for n, q in quant.items():
            set_submodule(model, n, q)


def _apply_and_compare(
    model: nn.Module, fold: Fold, roots: Mapping[str, Sequence[Call]], base: list[torch.Tensor]
) -> float:
    twin_named = dict(model.named_modules())
    s = fold.factor.to(torch.float64)
    producer = twin_named[fold.producer]
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        for p in (producer.weight, getattr(producer, "bias", None)):
            if isinstance(p, torch.Tensor):
                saved.append((p, p.data.clone()))
                factor = s.reshape(-1, *[1] * (p.dim() - 1))  # norms: (k,); Linear rows: (k, in)
                p.data = (p.data.double() / factor).to(p.dtype)
        for name in (*fold.consumers, *fold.compensated):
            w = twin_named[name].weight
            saved.append((w, w.data.clone()))
            w.data = (w.data.double() * s.reshape(1, -1)).to(w.dtype)
        after = _run_roots(model, roots)
    finally:
        for p, data in saved:
            p.data = data
    # per root: a fold in the text encoder must not hide behind the image decoder's large output
    return max(
        float((a - b).double().norm() / max(float(b.double().norm()), 1e-30))
        for a, b in zip(after, base, strict=True)
    )


def _smallest_root(name: str, roots: Mapping[str, Sequence[Call]]) -> str | None:
    """The innermost recorded root holding module ``name``: a fold changes nothing outside it
    when it changes nothing in its output (one replay of an encoder, not of the whole model)."""
    holding = [r for r, calls in roots.items() if calls and (not r or name.startswith(f"{r}."))]
    return max(holding, key=len) if holding else None


def _run_roots(model: nn.Module, roots: Mapping[str, Sequence[Call]]) -> list[torch.Tensor]:
    named = dict(model.named_modules())
    return [
        replay(named[r], calls[0]).float() for r, calls in roots.items() if calls and r in named
    ]


__all__ = [
    "DequantizedTwin",
    "Fold",
    "dequantized_weight",
    "effective_bias",
    "fold_errors",
    "is_norm",
    "plan_folds",
    "trace_producers",
]
