"""The numerical check of a SmoothQuant fold, on a float twin of the quantized model.

Hooks cannot see every use of a producer's output (a residual sum of a norm's output), so
:func:`~opsnn_quant.folding.smooth_fold.plan_folds` checks each fold by running the model with
its quantized modules as float modules of their dequantized weights
(:class:`DequantizedTwin`, made per call) with and without the fold: its scope's output must not
move. Also here, what a frozen module's integers mean in float (:func:`dequantized_weight`,
:func:`effective_bias`), which the AscendV1 writer's FLOAT tensors use too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.producers import ANY_STEP
from opsnn_quant.quant.modules import QuantConv2d, QuantModule, set_submodule
from opsnn_quant.recording import Call, detached_copy, replay
from opsnn_quant.types import Precision


@dataclass(frozen=True)
class Fold:
    """``producer``'s output channels are divided by ``factor``; ``consumers`` are the smoothed
    Linears that then see ``x / factor``; ``compensated`` the float Linears whose weight
    columns are multiplied by ``factor`` to keep their output."""

    producer: str
    factor: torch.Tensor
    consumers: tuple[str, ...]
    compensated: tuple[str, ...]


@torch.no_grad()
def dequantized_weight(module: QuantModule[Any]) -> torch.Tensor:
    """The fp32 weight a frozen module's int8 weight means (its layout), SmoothQuant undone;
    a w4a16 module's int4 words unpacked, each group of ``group_size`` inputs times its scale."""
    if module.spec.precision == Precision.W4A16:
        from opsnn_quant.ascend import unpack_int4

        values = unpack_int4(module.weight).reshape(module.out_n, module.in_k).to(torch.float32)
        scale = module.weight_quantizer.scale.to(torch.float32)  # (groups, N)
        group = module.spec.group_size or module.in_k
        per_input = scale.t().repeat_interleave(group, dim=1)[:, : module.in_k]
        return values * per_input
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
def check_calls(
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
                p.data = p.data.double().div_(factor).to(p.dtype)
        for name in (*fold.consumers, *fold.compensated):
            w = twin_named[name].weight
            saved.append((w, w.data.clone()))
            # one float64 copy at a time (an LM head's 51864 x 512 weight: 212 MB each)
            w.data = w.data.double().mul_(s.reshape(1, -1)).to(w.dtype)
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
    "ANY_STEP",
    "DequantizedTwin",
    "Fold",
    "check_calls",
    "dequantized_weight",
    "effective_bias",
    "fold_errors",
]
