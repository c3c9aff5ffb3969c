"""The structured estimator's projections of candidate noise on gradients, small calls batched.

At gradient time each candidate scheme's noise ``(y_q - y)`` of a module is projected on the
arriving gradient ``g`` and the per-sample projections are squared and summed
(:mod:`opsnn_quant.probe.attribution`). A candidate run on the 16 tokens of a text-encoder call
costs what one on 512 rows costs in per-call overhead (some 80 small torch ops), so the calls of
a Linear/Conv2d with fewer than :data:`~opsnn_quant.probe.pending.PENDING_ROWS` rows wait (input,
float output and gradient copied) and their candidates run on all of them at once, at the end of
the root's replay or when the batch is full. The projections are the same: the rows of a Linear
(the samples of a Conv2d) are independent under every candidate (per-tensor, per-token and
per-channel scales), and each call's per-sample sums are taken from its own rows of the batch.
Calls join a batch only where the candidate would see the same clock: a per-step scheme's calls
of one group of denoising steps (``StepKey``), the batch running at its first call's step.

Memory: the copies of every module's kept calls together stay under :data:`KEPT_BYTES`
(:class:`KeptCalls`: past it every module's batch runs), and a call bigger than an eighth of
it is projected at once (a decoder's logits: batching saves per-call overhead, which such a call
does not have).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from opsnn_quant.core.memory import TRIM
from opsnn_quant.core.timesteps import at_step, current_step
from opsnn_quant.probe.pending import PENDING_ROWS

# (name, scheme, step) -> which calls may share a candidate run (the same key: the same clock)
StepKey = Callable[[str, str, "int | None"], Hashable]
KEPT_BYTES = 64 << 20  # copies of kept calls, all modules of one attribution together


class NoiseFn(Protocol):
    """The module's output under a scheme, for its call ``args`` and float output ``y``.

    ``calls`` is how many recorded calls (or chunks) the rows of ``args`` come from: more than
    one when small calls run as one batch.
    """

    def __call__(
        self, name: str, scheme: str, args: tuple, y: torch.Tensor, calls: int = 1
    ) -> torch.Tensor: ...


class KeptCalls:
    """The bytes every module's :class:`Projector` keeps, together: past ``limit`` every
    projector runs what it kept (the same projections, sooner)."""

    def __init__(self, limit: int = KEPT_BYTES) -> None:
        self.limit = limit
        self.bytes = 0
        self.projectors: list[Projector] = []

    def grew(self) -> None:
        """Called after a projector kept a call: run every batch when over the limit."""
        if self.bytes > self.limit:
            for projector in self.projectors:
                projector.flush()


@dataclass
class _Kept:
    """One small call waiting: its rows (Linear: ``(rows, K)``; Conv2d: whole samples), the
    float output's and the gradient's rows, the clock, and how its projections split."""

    x: torch.Tensor
    y: torch.Tensor
    g: torch.Tensor
    step: int | None
    units: int  # leading rows of x/y/g (Linear: tokens; Conv2d: samples)
    samples: int | None  # the root's batch when the output leads with it (else one sum)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.x, self.y, self.g))


class Projector:
    """Per module, the squared per-sample projections of each scheme's noise, accumulated in
    ``acc[scheme]``; small calls are kept and projected in batches (module docstring)."""

    def __init__(
        self,
        name: str,
        module: nn.Module,
        schemes: tuple[str, ...],
        quantized_output: NoiseFn,
        acc: dict[str, float],
        step_key: StepKey | None = None,
        kept: KeptCalls | None = None,
    ) -> None:
        self.name, self.schemes, self.quantized_output = name, schemes, quantized_output
        self.acc = acc
        self.kept = KeptCalls() if kept is None else kept
        self.kept.projectors.append(self)
        self.conv = isinstance(module, nn.Conv2d)
        self.batchable = isinstance(module, nn.Linear | nn.Conv2d)
        # no key given: only calls at the same step share a run
        self.step_key = step_key or (lambda _name, _scheme, step: step)
        self._open: dict[tuple[int, ...], list[_Kept]] = {}

    @torch.no_grad()
    def add(self, args: tuple, y: torch.Tensor, g: torch.Tensor, batch: int | None) -> None:
        """One call's input, float output and the gradient of ``v . y`` at the output."""
        samples = batch if batch is not None and y.dim() > 0 and y.shape[0] == batch else None
        kept = self._kept(args, y, g, samples)
        if kept is None:
            self._project_whole(args, y, g, samples)
            return
        key = tuple(kept.x.shape[1:]) + tuple(kept.y.shape[1:])
        batch_ = self._open.setdefault(key, [])
        batch_.append(kept)
        self.kept.bytes += kept.nbytes
        if sum(k.x.numel() for k in batch_) // self._channels(kept.x) >= PENDING_ROWS:
            self._project_batch(self._open.pop(key))
        self.kept.grew()

    def flush(self) -> None:
        """Project the calls still kept (end of the root's replay)."""
        while self._open:
            self._project_batch(self._open.pop(next(iter(self._open))))

    def _channels(self, x: torch.Tensor) -> int:
        return max(int(x.shape[1] if self.conv else x.shape[-1]), 1)

    def _kept(
        self, args: tuple, y: torch.Tensor, g: torch.Tensor, samples: int | None
    ) -> _Kept | None:
        """A copy of a small single-input call in batchable form (None: project it now)."""
        x = args[0] if len(args) == 1 else None
        if (
            not self.batchable
            or not isinstance(x, torch.Tensor)
            or x.dim() < 2
            or y.dim() < 2
            or y.shape[0] != x.shape[0]
            or x.numel() // self._channels(x) >= PENDING_ROWS
            or (x.numel() + 2 * y.numel()) * 4 > self.kept.limit // 8
        ):
            return None
        if not self.conv:
            x, y, g = (t.reshape(-1, t.shape[-1]) for t in (x, y, g))
        # copies: the model may reuse these buffers before the batch runs
        return _Kept(x.clone(), y.clone(), g.detach().clone(), current_step(), x.shape[0], samples)

    def _project_whole(
        self, args: tuple, y: torch.Tensor, g: torch.Tensor, samples: int | None
    ) -> None:
        gf, yf = g.detach().float(), y.float()
        for scheme in self.schemes:
            # fp32 products and sums (fp64 over whole activations doubled the pass's cost);
            # only the per-sample projections are squared in float64.
            prod = (self.quantized_output(self.name, scheme, args, y).float() - yf) * gf
            if samples is not None:
                s = prod.reshape(samples, -1).sum(dim=1)
            else:
                s = prod.sum().reshape(1)
            self.acc[scheme] += float(s.double().pow(2).sum())
            TRIM.add(3 * y.numel() * 4)  # the candidate's output and product

    def _project_batch(self, kept: list[_Kept]) -> None:
        self.kept.bytes -= sum(k.nbytes for k in kept)
        for scheme in self.schemes:
            groups: dict[Hashable, list[_Kept]] = {}
            for k in kept:
                groups.setdefault(self.step_key(self.name, scheme, k.step), []).append(k)
            for group in groups.values():
                self._project_group(scheme, group)

    def _project_group(self, scheme: str, group: list[_Kept]) -> None:
        x = torch.cat([k.x for k in group])
        y = torch.cat([k.y for k in group])
        with at_step(group[0].step):
            yq = self.quantized_output(self.name, scheme, (x,), y, calls=len(group))
        prod = (yq.float() - y.float()) * torch.cat([k.g for k in group]).float()
        per_unit = prod.reshape(prod.shape[0], -1).sum(dim=1)
        total = 0.0
        for k, unit_sums in zip(group, per_unit.split([k.units for k in group]), strict=True):
            if k.samples is not None:
                s = unit_sums.reshape(k.samples, -1).sum(dim=1)
            else:
                s = unit_sums.sum().reshape(1)
            total += float(s.double().pow(2).sum())
        self.acc[scheme] += total
        TRIM.add(3 * y.numel() * 4)
