"""The multiply-accumulates that no Linear/Conv2d makes, per modality: what the int8 share of
*all* MACs is measured against (issue 46: Whisper's encoder convolutions are Conv1d, and
attention's score and value products are matmuls; both stay float on a target without int8
attention, so a "100 % int8" of the Linear/Conv2d MACs is not 100 % of the model's; where the
target runs int8 attention, the probe moves the SDPA MACs of the attention modules it measured
to the measured share, :mod:`.attention`).

Pass 1 counts them beside its hooks: while it runs, the matmul-like torch functions
(scaled-dot-product attention, ``matmul``/``bmm``/``baddbmm`` and ``@``, Conv1d/Conv3d and
transposed convolutions; :data:`COUNTED`) are wrapped where models look them up at call time
(``torch``, ``torch.nn.functional``, ``torch.Tensor``'s methods), and each call outside the
Linear/Conv2d modules adds its MACs to the modality of the innermost model root it runs in
(:meth:`ModelAdapter.roots`). Calls the probe's own hooks make (statistics, the fp16 re-runs)
are not the model's and are not counted. (A ``TorchFunctionMode`` saw the same calls, but it
also put every other torch call and tensor attribute of the forward through Python: 0.4-1.2 s
of a 2-3 s pass 1 on shapes-t2v.)
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.probe.hooks import in_rerun
from opsnn_quant.types import Modality

log = logging.getLogger(__name__)

_PAUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("opsnn_quant_macs", default=False)

# torch calls -> how their MACs are read from (args, output). Linear and Conv2d are counted by
# the probe's module hooks (``macs_of``); F.linear and F.conv2d are theirs and not listed here.
_PRODUCTS = frozenset({"matmul", "__matmul__", "__rmatmul__", "bmm", "mm"})
_ADD_PRODUCTS = frozenset({"baddbmm", "addbmm", "addmm"})  # (input, a, b): a @ b
_CONVS = frozenset({"conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})


def _tensor(x: Any) -> torch.Tensor | None:
    return x if isinstance(x, torch.Tensor) else None


def call_macs(name: str, args: tuple, kwargs: dict, out: Any) -> int:
    """MACs of one torch call ``name`` (0 for a call that is not matmul-like).

    * ``scaled_dot_product_attention(q, k, v)``: ``batch * L * S * (E + Ev)`` (the scores and
      their weighted sum of the values);
    * ``matmul``/``bmm``/``mm`` and ``@``: ``out.numel() * K``; ``baddbmm``/``addmm``: the same
      for their two factors;
    * convolutions: ``out.numel() * in_channels/groups * kernel`` (a transposed one: ``input
      .numel() * out_channels/groups * kernel``).
    """
    o = _tensor(out)
    if name == "scaled_dot_product_attention":
        q, k, v = (_tensor(kwargs.get(n, args[i] if len(args) > i else None))
                   for i, n in enumerate(("query", "key", "value")))  # fmt: skip
        if q is None or k is None or v is None or o is None or q.dim() < 2:
            return 0
        batch = math.prod(o.shape[:-2])
        return batch * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    if o is None:
        return 0
    if name in _PRODUCTS or name in _ADD_PRODUCTS:
        a = _tensor(args[1] if name in _ADD_PRODUCTS else args[0]) if args else None
        if name == "__rmatmul__" and len(args) > 1:
            a = _tensor(args[1])
        if a is None or a.dim() == 0:
            return 0
        return o.numel() * a.shape[-1]
    if name in _CONVS:
        x = _tensor(args[0] if args else kwargs.get("input"))
        w = _tensor(args[1] if len(args) > 1 else kwargs.get("weight"))
        if x is None or w is None:
            return 0
        if name.startswith("conv_transpose"):
            return x.numel() * w[0].numel()
        return o.numel() * w[0].numel()
    return 0


# (where a model looks a counted function up, its attribute there, the name call_macs reads)
COUNTED: tuple[tuple[Any, str, str], ...] = (
    (F, "scaled_dot_product_attention", "scaled_dot_product_attention"),
    *(
        (torch, n, n)
        for n in (*sorted(_PRODUCTS - {"__matmul__", "__rmatmul__"}), *sorted(_ADD_PRODUCTS))
    ),
    *((torch.Tensor, n, n) for n in (*sorted(_PRODUCTS), *sorted(_ADD_PRODUCTS))),
    *((owner, n, n) for n in sorted(_CONVS) for owner in (F, torch)),
)
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "opsnn_quant_in_counted", default=False
)


class OtherMacs:
    """Counts, while :meth:`counting`, the MACs of the matmul-like torch calls of a model's
    forward that its Linear/Conv2d modules do not make, per modality (:attr:`macs`)."""

    def __init__(self, roots: dict[str, Modality], named: dict[str, nn.Module]) -> None:
        self.macs: dict[Modality, int] = {}
        self.unplaced = 0  # MACs outside every root (no modality to put them in)
        self._stack: list[Modality] = []
        self._roots = {named[r]: m for r, m in roots.items() if r in named}
        self._handles: list[Any] = []

    def _counted(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``original`` counting its calls: the outermost counted call only (a ``@`` that
        calls ``torch.matmul`` is one product), not while paused or in an fp16 re-run."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            if _INSIDE.get():
                return original(*args, **kwargs)
            token = _INSIDE.set(True)
            try:
                out = original(*args, **kwargs)
            finally:
                _INSIDE.reset(token)
            if not (_PAUSED.get() or in_rerun()):
                self._add(call_macs(name, args, kwargs, out))
            return out

        return counted

    def _add(self, macs: int) -> None:
        if self._stack:
            modality = self._stack[-1]
            self.macs[modality] = self.macs.get(modality, 0) + macs
        else:
            self.unplaced += macs

    @contextmanager
    def counting(self) -> Iterator[OtherMacs]:
        """Wrap the counted functions, with the roots' hooks that say which modality a call
        runs in; every one restored on the way out."""
        for module, modality in self._roots.items():
            self._handles.append(
                module.register_forward_pre_hook(lambda *_, m=modality: self._stack.append(m))
            )
            self._handles.append(module.register_forward_hook(lambda *_: self._pop()))
        restore: list[tuple[Any, str, Any]] = []
        try:
            for owner, attr, name in COUNTED:
                own = owner.__dict__.get(attr, _ABSENT) if isinstance(owner, type) else _ABSENT
                original = getattr(owner, attr)
                restore.append((owner, attr, own if isinstance(owner, type) else original))
                setattr(owner, attr, self._counted(original, name))
            yield self
        finally:
            for owner, attr, before in reversed(restore):
                if before is _ABSENT:
                    delattr(owner, attr)  # a class's inherited method: its own entry goes
                else:
                    setattr(owner, attr, before)
            for h in self._handles:
                h.remove()
            self._handles.clear()
            self._stack.clear()
            if self.unplaced:
                log.debug("%d MACs ran outside every model root: not counted", self.unplaced)

    def _pop(self) -> None:
        if self._stack:
            self._stack.pop()


_ABSENT = object()  # a class attribute that was inherited, not its own


def paused(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` with the counting paused while it runs (the probe's own work is not the
    model's)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        token = _PAUSED.set(True)
        try:
            return hook(*args, **kwargs)
        finally:
            _PAUSED.reset(token)

    return run
