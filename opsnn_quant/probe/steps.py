"""How a module's activation range moves over the denoising steps, and the groups of steps that
static scales should be kept per (the ``w8a8_timestep`` scheme).

Per step (the index :mod:`opsnn_quant.core.timesteps` holds while the sampling loop runs) the probe
keeps each quantizable module's input absmax and element count. A static per-tensor scale over a
group of steps is that group's largest absmax / 127, and adds uniform rounding noise of power
``scale^2 / 12`` to every element of every step in the group: the modelled input noise
``sum_g sum_{t in g} n_t (max_{s in g} a_s / 127)^2 / 12``. Contiguous groups minimising it are
found exactly by dynamic programming; one group is a single static scale, one group per step
the per-step ideal.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

MAX_AUTO_GROUPS = 4
# With automatic groups, the fewest whose modelled noise is within this of MAX_AUTO_GROUPS'.
AUTO_TOLERANCE_DB = 0.5


@dataclass
class StepRanges:
    """Per-step input absmax and element counts of one module."""

    absmax: dict[int, float] = field(default_factory=dict)
    count: dict[int, int] = field(default_factory=dict)
    # Per step, the absmax of each input channel (last dim; on the input's device): what the
    # group scales of a smoothed input follow from (max_c absmax_c / s_c). Linear inputs only.
    channels: dict[int, torch.Tensor] = field(default_factory=dict)
    per_channel: bool = False

    @torch.no_grad()
    def collect(
        self,
        step: int,
        x: torch.Tensor,
        absmax: float | None = None,
        channel_absmax: torch.Tensor | None = None,
    ) -> None:
        """Add one call's input at ``step`` (its absmax and per-channel absmax, last dim, when
        the caller has them already)."""
        if absmax is None:
            absmax = float(x.detach().abs().max()) if x.numel() else 0.0
        self.absmax[step] = max(self.absmax.get(step, 0.0), absmax)
        self.count[step] = self.count.get(step, 0) + x.numel()
        if self.per_channel and x.numel():
            c = channel_absmax
            if c is None:
                c = x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0).float()
            seen = self.channels.get(step)
            self.channels[step] = c if seen is None else torch.maximum(seen, c)

    @torch.no_grad()
    def merge(self, other: StepRanges) -> None:
        """Add the per-step ranges ``other`` gathered (maxima and counts: exact)."""
        for step, absmax in other.absmax.items():
            self.absmax[step] = max(self.absmax.get(step, 0.0), absmax)
            self.count[step] = self.count.get(step, 0) + other.count[step]
        for step, c in other.channels.items():
            seen = self.channels.get(step)
            self.channels[step] = c if seen is None else torch.maximum(seen, c.to(seen.device))

    def group_absmax(self, start: int, end: float, smooth: torch.Tensor | None = None) -> float:
        """The input absmax over steps ``start <= t < end``; of ``x / smooth`` when given."""
        members = [t for t in self.absmax if start <= t < end]
        if smooth is None:
            return max(self.absmax[t] for t in members)
        s = smooth.reshape(-1).float()
        return max(float((self.channels[t].to(s.device) / s).max()) for t in members)

    @property
    def steps(self) -> list[int]:
        """The steps seen, ascending."""
        return sorted(self.absmax)

    def group_cost(self, i: int, j: int) -> float:
        """Modelled input noise of one static scale over ``steps[i:j]``."""
        members = self.steps[i:j]
        scale = max(self.absmax[t] for t in members) / 127.0
        return sum(self.count[t] for t in members) * scale * scale / 12.0

    def noise(self, bounds: tuple[int, ...]) -> float:
        """Modelled input noise of static scales per group (groups start at ``bounds``)."""
        return grouped_noise(self, bounds)

    def best_bounds(self, groups: int) -> tuple[int, ...]:
        """The contiguous ``groups`` groups of steps with the least modelled noise (first
        steps of each group; fewer when fewer steps were seen). Ties keep the earlier cut."""
        return best_grouping(self, groups)

    def choose(self, groups: int | None) -> tuple[int, ...]:
        """Fixed ``groups``, or the fewest (up to :data:`MAX_AUTO_GROUPS`) within
        :data:`AUTO_TOLERANCE_DB` of the most."""
        return chosen_grouping(self, groups)

    def gain_db(self, bounds: tuple[int, ...]) -> float:
        """How much less modelled noise ``bounds`` give than one static scale, dB."""
        one, grouped = self.noise((0,)), self.noise(bounds)
        return 10 * math.log10(one / grouped) if grouped > 0 and one > 0 else 0.0

    def per_step_bounds(self) -> tuple[int, ...]:
        """One group per step seen (the per-step ideal)."""
        steps = self.steps
        return tuple([0, *steps[1:]]) if steps else (0,)


class Grouping(Protocol):
    """Steps and the modelled noise of one static scale over a run of them."""

    @property
    def steps(self) -> list[int]:
        """The steps seen, ascending."""
        ...

    def group_cost(self, i: int, j: int) -> float:
        """Modelled noise of one static scale over ``steps[i:j]``."""
        ...


def grouped_noise(g: Grouping, bounds: tuple[int, ...]) -> float:
    """Modelled noise of static scales per group (groups start at ``bounds``)."""
    steps = g.steps
    total = 0.0
    for i, start in enumerate(bounds):
        end = bounds[i + 1] if i + 1 < len(bounds) else math.inf
        lo = bisect.bisect_left(steps, start)
        hi = len(steps) if end == math.inf else bisect.bisect_left(steps, end)
        if hi > lo:
            total += g.group_cost(lo, hi)
    return total


def best_grouping(g: Grouping, groups: int) -> tuple[int, ...]:
    """The contiguous ``groups`` groups of steps with the least modelled noise, found exactly by
    dynamic programming (first steps of each group; ties keep the earlier cut)."""
    steps = g.steps
    t_count, k = len(steps), max(1, min(groups, len(steps)))
    if t_count == 0:
        return (0,)
    inf = math.inf
    best = [[inf] * (t_count + 1) for _ in range(k + 1)]
    cut = [[0] * (t_count + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for n_groups in range(1, k + 1):
        for j in range(1, t_count + 1):
            for i in range(n_groups - 1, j):
                c = best[n_groups - 1][i] + g.group_cost(i, j)
                if c < best[n_groups][j]:
                    best[n_groups][j], cut[n_groups][j] = c, i
    starts, j = [], t_count
    for n_groups in range(k, 0, -1):
        i = cut[n_groups][j]
        starts.append(i)
        j = i
    first = sorted(starts)
    return tuple([0, *[steps[i] for i in first[1:]]])


def chosen_grouping(g: Grouping, groups: int | None) -> tuple[int, ...]:
    """Fixed ``groups``, or the fewest (up to :data:`MAX_AUTO_GROUPS`) within
    :data:`AUTO_TOLERANCE_DB` of the most."""
    if groups is not None:
        return best_grouping(g, groups)
    candidates = [best_grouping(g, n) for n in range(1, MAX_AUTO_GROUPS + 1)]
    floor = grouped_noise(g, candidates[-1])
    for bounds in candidates:
        if grouped_noise(g, bounds) <= floor * 10 ** (AUTO_TOLERANCE_DB / 10):
            return bounds
    return candidates[-1]


@dataclass
class JointSteps:
    """Several tensors quantized with static scales over the same groups of steps (an
    attention's query, key and value): a grouping's cost is the sum of each tensor's modelled
    noise relative to its noise under one scale for all steps, so that each counts by how much
    the groups improve it, whatever its magnitude."""

    members: list[StepRanges]
    _one: list[float] = field(init=False)  # each member's noise under one scale

    def __post_init__(self) -> None:
        self._one = [m.noise((0,)) for m in self.members]

    @property
    def steps(self) -> list[int]:
        """The steps seen, ascending (the members see the same calls)."""
        return self.members[0].steps if self.members else []

    def group_cost(self, i: int, j: int) -> float:
        """Sum over the members of their noise over ``steps[i:j]``, each relative to its own."""
        total = 0.0
        for m, one in zip(self.members, self._one, strict=True):
            if one > 0:
                total += m.group_cost(i, j) / one
        return total
