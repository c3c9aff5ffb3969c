"""Attention modules in the probe: the SDPA call of each, watched where the target runs int8
attention (schemes ``a8``, ``a8_kmean``: :mod:`opsnn_quant.quant.attention`).

* **Pass 1** (:class:`AttentionWatch`): per attention module, over its SDPA calls, the absolute
  maxima of the query, key (as it is and less its mean over the keys) and value: the static
  scales each candidate calibrates to, the same numbers ``quantize`` finds; the calls' MACs
  (the scores and their weighted sum of the values); the first call the int8 op refuses
  (decode, an unaligned head dim...), which leaves the module float with that reason.
* **End to end** (:class:`SdpaTaps` in the attribution's replay): the SDPA output is put in the
  estimator's graph like a module's output; when its gradient ``g`` arrives, each candidate's
  output is computed from the call's own query/key/value and its noise ``e`` projected on ``g``
  (the structured estimator of :mod:`.attribution`, in the same forward and backward: no pass
  of its own). The same outputs give each candidate's local error (signal, noise and cross
  energies of the SDPA output).

A call is attributed to the innermost watched attention module running when SDPA is called
(forward pre/post hooks keep the stack); the probe's own re-runs are not the model's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from opsnn_quant.core.timesteps import current_step, group_of
from opsnn_quant.probe.energy import SchemeEnergy
from opsnn_quant.probe.hooks import in_rerun
from opsnn_quant.probe.report import SchemeError
from opsnn_quant.probe.steps import JointSteps, StepRanges, chosen_grouping
from opsnn_quant.quant.attention import (
    QuantizedAttention,
    SdpaCall,
    call_ranges,
    int8_sdpa,
    read_call,
    scales_of,
)
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.quant.spec import QuantSpec

_SDPA = F.scaled_dot_product_attention
# the fused op's output dtype: what a candidate's error is judged in (report's SchemeError)
OUTPUT_DTYPE = "float16"


@dataclass
class AttentionWatch:
    """Pass 1 of one attention module, and its candidates' local errors.

    Attributes:
        offered: the candidate schemes the target runs (``a8``, ``a8_kmean``, ``a8_step``,
            ``a8_head``); :attr:`schemes` those that fit what pass 1 saw.
        amax: (2, 3) float32: the query/key/value absolute maxima with the key as it is (row 0)
            and less its mean over the keys (row 1).
        steps: denoising step -> the same (2, 3) maxima over that step's calls (calls made
            while a sampling loop set the clock, :mod:`opsnn_quant.core.timesteps`).
        counts: denoising step -> the query/key/value elements of that step's calls.
        unstepped: calls made outside a sampling loop (then no per-step scheme is offered).
        head_amax: (2, 3, N_kv) float32: the same maxima per key/value head (None before a
            call; :attr:`amax` is their maximum over the heads).
        heads_differ: calls with different numbers of key/value heads (no per-head scheme).
        calls: SDPA calls seen (those the op can run and those it refuses).
        macs: their MACs, summed.
        problem: why the op cannot run one of its calls (the first seen), or None.
        energies: scheme -> its output error summed over the replayed calls.
    """

    offered: tuple[str, ...]
    amax: torch.Tensor = field(default_factory=lambda: torch.zeros(2, 3))
    steps: dict[int, torch.Tensor] = field(default_factory=dict)
    counts: dict[int, list[int]] = field(default_factory=dict)
    unstepped: int = 0
    head_amax: torch.Tensor | None = None
    heads_differ: bool = False
    calls: int = 0
    macs: int = 0
    problem: str | None = None
    energies: dict[str, SchemeEnergy] = field(default_factory=dict)
    _bounds: tuple[int, ...] | None = field(default=None, repr=False)

    def observe(self, call: SdpaCall) -> None:
        """Add one SDPA call of pass 1 (at the step the clock reads)."""
        self.calls += 1
        self.macs += call.macs
        if call.problem is not None:
            self.problem = self.problem or call.problem
            return
        heads = torch.stack([call_ranges(call, False, True), call_ranges(call, True, True)])
        self._add_heads(heads)
        ranges = heads.amax(dim=-1)  # the per-tensor maxima, exactly
        self.amax = torch.maximum(self.amax, ranges)
        step = current_step()
        if step is None:
            self.unstepped += 1
            return
        seen = self.steps.get(step)
        self.steps[step] = ranges if seen is None else torch.maximum(seen, ranges)
        counts = self.counts.setdefault(step, [0, 0, 0])
        for i, t in enumerate((call.q, call.k, call.v)):
            counts[i] += t.numel()
        self._bounds = None

    def _add_heads(self, heads: torch.Tensor | None) -> None:
        if heads is None:
            return
        if self.head_amax is None:
            self.head_amax = heads
        elif self.head_amax.shape != heads.shape:
            self.heads_differ = True
        else:
            self.head_amax = torch.maximum(self.head_amax, heads)

    @property
    def stepped(self) -> bool:
        """Whether every call ran at a denoising step, over two steps or more: static scales
        per group of steps can follow them."""
        return self.unstepped == 0 and len(self.steps) >= 2

    @property
    def schemes(self) -> tuple[str, ...]:
        """The candidates measured: the offered ones, per-step ones only where :attr:`stepped`,
        per-head ones only where every call had the same key/value heads."""
        heads = self.head_amax is not None and not self.heads_differ
        return tuple(
            s
            for s in self.offered
            if (self.stepped or not SCHEMES[s].per_step)
            and (heads or not SCHEMES[s].template.per_head)
        )

    @property
    def step_bounds(self) -> tuple[int, ...] | None:
        """The groups of steps (their first steps) the per-step candidates keep scales per:
        the fewest within tolerance of the least modelled query/key/value noise
        (:class:`~opsnn_quant.probe.steps.JointSteps`); None when not :attr:`stepped`."""
        if not self.stepped:
            return None
        if self._bounds is None:
            members = []
            for i in range(3):
                r = StepRanges()
                for t, ranges in self.steps.items():
                    r.absmax[t], r.count[t] = float(ranges[0, i]), self.counts[t][i]
                members.append(r)
            self._bounds = chosen_grouping(JointSteps(members), None)
        return self._bounds

    def group_amax(self, bounds: Sequence[int], k_mean: bool) -> torch.Tensor:
        """(groups, 3) maxima of the calls of each group of steps (``bounds``: first steps)."""
        out = torch.zeros(len(bounds), 3)
        for t, ranges in self.steps.items():
            g = group_of(t, bounds)
            out[g] = torch.maximum(out[g], ranges[1 if k_mean else 0])
        return out

    def merge(self, other: AttentionWatch) -> None:
        """Pass 1 over this share and ``other``'s (another rank's batches)."""
        self.amax = torch.maximum(self.amax, other.amax)
        self._add_heads(other.head_amax)
        self.heads_differ = self.heads_differ or other.heads_differ
        for t, ranges in other.steps.items():
            seen = self.steps.get(t)
            self.steps[t] = ranges if seen is None else torch.maximum(seen, ranges)
            mine = self.counts.setdefault(t, [0, 0, 0])
            for i, c in enumerate(other.counts[t]):
                mine[i] += c
        self.steps = dict(sorted(self.steps.items()))
        self.counts = dict(sorted(self.counts.items()))
        self.unstepped += other.unstepped
        self._bounds = None
        self.calls += other.calls
        self.macs += other.macs
        self.problem = self.problem or other.problem

    @property
    def runs(self) -> bool:
        """Whether the int8 op can run every call seen (and there was one)."""
        return self.calls > 0 and self.problem is None

    def can_seed_attention(self, spec: QuantSpec) -> bool:
        """Whether :meth:`seed_attention` gives an ``a8`` module of ``spec`` exactly what its own
        calibration on the same data would: one group of steps, or groups of steps where every
        call ran at a step (a call outside a sampling loop falls in group 0 of the module)."""
        if not (spec.precision.is_attention and self.runs):
            return False
        if spec.per_head:  # pass 1 keeps per-head maxima over all steps only
            return spec.timestep_bounds is None and self.head_amax is not None
        return spec.timestep_bounds is None or self.unstepped == 0

    def seed_attention(self, module: QuantizedAttention) -> None:
        """Put pass 1's maxima (of the key as the module's spec takes it; per group of steps
        where it has groups) into ``module``."""
        spec = module.attn_spec
        row = 1 if spec.k_mean else 0
        if spec.per_head:
            assert self.head_amax is not None
            amax = self.head_amax[row].unsqueeze(0)
        elif spec.timestep_bounds is None:
            amax = self.amax[row].unsqueeze(0)
        else:
            amax = self.group_amax(spec.timestep_bounds, spec.k_mean)
        module.seed_calibration(amax, self.calls)

    def scales(self, scheme: str, step: int | None = None) -> torch.Tensor:
        """(3,) float32 scales candidate ``scheme`` calibrates to (at ``step`` for a per-step
        scheme: its group's; (3, N_kv) for a per-head one)."""
        k_mean = self._k_mean(scheme)
        if SCHEMES[scheme].template.per_head:
            assert self.head_amax is not None
            return scales_of(self.head_amax[1 if k_mean else 0])
        bounds = self.step_bounds
        if SCHEMES[scheme].per_step and bounds is not None and step is not None:
            return scales_of(self.group_amax(bounds, k_mean)[group_of(step, bounds)])
        return scales_of(self.amax[1 if k_mean else 0])

    @staticmethod
    def _k_mean(scheme: str) -> bool:
        return SCHEMES[scheme].template.k_mean

    def candidate(self, scheme: str, call: SdpaCall, step: int | None = None) -> torch.Tensor:
        """Candidate ``scheme``'s output of ``call`` (made at ``step``): the float16 op
        output in the query's dtype."""
        return int8_sdpa(call, self.scales(scheme, step), self._k_mean(scheme))

    def candidates(self, call: SdpaCall, step: int | None = None) -> dict[str, torch.Tensor]:
        """Every candidate's output of ``call`` (:meth:`candidate`), each distinct computation
        once: a per-step scheme in the group that holds the overall maxima has the per-tensor
        scheme's scales exactly, and so its output."""
        done: dict[tuple[Any, ...], torch.Tensor] = {}
        out = {}
        for scheme in self.schemes:
            scales = self.scales(scheme, step)
            key = (self._k_mean(scheme), tuple(scales.shape), tuple(scales.reshape(-1).tolist()))
            if key not in done:
                done[key] = int8_sdpa(call, scales, key[0])
            out[scheme] = done[key]
        return out

    def add_error(self, scheme: str, reference: torch.Tensor, output: torch.Tensor) -> None:
        """Add one call's candidate output against the float SDPA output."""
        self.energies.setdefault(scheme, SchemeEnergy()).add(reference, output, -1)

    def results(self) -> dict[str, SchemeError]:
        """Per scheme: its local error (SQNR, cosine of the SDPA output); every scheme
        infeasible, with the reason, when the op refuses a call."""
        if self.problem is not None:
            refused = f"the fused int8 attention cannot run {self.problem}"
            return {
                s: SchemeError(sqnr_db=None, cosine=0.0, infeasible=refused) for s in self.schemes
            }
        out = {}
        for scheme, energy in self.energies.items():
            err = energy.result(None, OUTPUT_DTYPE)
            bounds = self.step_bounds
            if SCHEMES[scheme].per_step and bounds is not None:
                err = err.model_copy(update={"timestep_bounds": list(bounds)})
            out[scheme] = err
        return out

    def best_scheme(self) -> str | None:
        """The scheme with the highest local SQNR (ties: the one listed first)."""
        results = {s: r for s, r in self.results().items() if r.infeasible is None}
        if not results:
            return None

        def key(s: str) -> float:
            db = results[s].sqnr_db
            return -round(float("inf") if db is None else db, 4)

        return min(results, key=key)


Handler = Callable[[str, Callable[..., Any], tuple, dict[str, Any]], Any]


class SdpaTaps(TorchFunctionMode):
    """While :meth:`tapping`: every SDPA call inside one of ``modules`` goes to ``handler(name,
    func, args, kwargs)``, whose return is the call's result (the mode is entered around those
    modules' forwards only)."""

    def __init__(self, modules: dict[str, nn.Module], handler: Handler) -> None:
        super().__init__()
        self.modules = modules
        self.handler = handler
        self._stack: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is _SDPA and self._stack and not in_rerun():
            return self.handler(self._stack[-1], func, args, kwargs)
        return func(*args, **kwargs)

    # The mode is entered only while a watched module's forward runs: every torch call under a
    # mode pays a Python dispatch, and the rest of the forward, the backward and the gradient
    # hooks computing the candidates (thousands of calls each) have no SDPA call to catch.
    def _enter(self, name: str) -> None:
        if not self._stack:
            self.__enter__()
        self._stack.append(name)

    def _leave(self) -> None:  # a forward hook returning None: the output is left as it is
        if self._stack:
            self._stack.pop()
            if not self._stack:
                self.__exit__(None, None, None)

    @contextmanager
    def tapping(self) -> Iterator[SdpaTaps]:
        """Install the hooks that enter the mode around each watched module's forward (and say
        which module a call runs in)."""
        handles = []
        for name, module in self.modules.items():
            handles.append(module.register_forward_pre_hook(lambda *_, n=name: self._enter(n)))
            handles.append(module.register_forward_hook(lambda *_: self._leave()))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            if self._stack:  # a forward that raised: its module's hook never ran
                self._stack.clear()
                self.__exit__(None, None, None)


@contextmanager
def observing(watches: dict[str, AttentionWatch], modules: dict[str, nn.Module]) -> Iterator[None]:
    """Pass 1: each watched module's SDPA calls observed (:meth:`AttentionWatch.observe`)."""
    if not watches:
        yield
        return

    def observe(name: str, func: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        out = func(*args, **kwargs)
        with torch.no_grad():
            watches[name].observe(read_call(args, kwargs))
        return out

    with SdpaTaps({n: modules[n] for n in watches}, observe).tapping():
        yield


def detached(call: SdpaCall) -> SdpaCall:
    """``call`` with its tensors detached (kept for the gradient hook)."""
    return SdpaCall(
        call.q.detach(), call.k.detach(), call.v.detach(), call.masked, call.scale, call.problem
    )
