"""Pass 1's calibration statistics of one Linear/Conv2d, handed to ``quantize()`` in place of its
own calibration passes over the same data (:class:`PassOneStatistics`, a
:class:`~opsnn_quant.quant.api.SeedsCalibration`).

They hold no module: the float module they were collected on can be freed as soon as quantize()
has swapped it. Also the range helpers the probe's candidates share with seeding: a symmetric
minmax range follows exactly from an absmax (of the smoothed input: ``max_c absmax_c / s_c``,
fp32 division being monotonic), and a group of steps' range from the per-step maxima.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from opsnn_quant.probe.steps import StepRanges
from opsnn_quant.quant.gptq import InputMoments
from opsnn_quant.quant.modules import QuantModule
from opsnn_quant.quant.observers import MinMaxObserver, MSEObserver
from opsnn_quant.quant.spec import QuantSpec


def symmetric_range(t: float) -> MinMaxObserver:
    """A minmax observer of range [-t, t]: what a symmetric range needs of data of absmax t."""
    obs = MinMaxObserver()
    obs.collect(torch.tensor([-t, t]))
    return obs


def group_range(
    steps: StepRanges, bounds: tuple[int, ...], group: int, smooth: torch.Tensor | None
) -> MinMaxObserver:
    """The symmetric range of group ``group`` of the steps starting at ``bounds`` (of the
    smoothed input ``x / smooth`` when given)."""
    start = bounds[group]
    end = bounds[group + 1] if group + 1 < len(bounds) else math.inf
    return symmetric_range(steps.group_absmax(start, end, smooth))


def all_stepped(steps: StepRanges, elements: int) -> bool:
    """Whether two steps or more were seen and all ``elements`` inputs inside the sampling loop."""
    return len(steps.absmax) >= 2 and sum(steps.count.values()) == elements


@dataclass(frozen=True)
class PassOneStatistics:
    """What probe pass 1 collected on one module's inputs (shared, not copied: read only).

    Attributes:
        calls: calls seen.
        elements: input elements seen (in a sampling loop or not).
        minmax: the input's minmax observer.
        mse: the input's MSE-clip histogram observer.
        channel_absmax: per input channel absmax (Linear), or None.
        channel_seen: rows behind ``channel_absmax``.
        steps: per denoising step ranges.
        moments: the inputs' mean and ``X^T X`` (when GPTQ candidates were measured), or None.
    """

    calls: int
    elements: int
    minmax: MinMaxObserver
    mse: MSEObserver
    channel_absmax: torch.Tensor | None
    channel_seen: int
    steps: StepRanges
    moments: InputMoments | None = None

    def can_seed(self, spec: QuantSpec) -> bool:
        """Whether these statistics give ``spec``'s calibration exactly (see :meth:`seed`).

        They do for what they hold: plain minmax / MSE ranges of the input, SmoothQuant with a
        fixed alpha (the per-channel maxima), and symmetric minmax ranges of smoothed inputs or
        of groups of steps (which follow from the per-channel / per-step maxima). Not for
        another observer, a searched (``"auto"``) alpha (the row reservoir is gone), asymmetric
        smoothed ranges, or groups of steps of calls made outside a sampling loop.
        """
        if self.calls == 0:
            return False
        if spec.needs_moments and self.moments is None:  # GPTQ / bias correction: none kept
            return False
        if spec.smoothquant and (
            self.channel_absmax is None or isinstance(spec.smoothquant_alpha, str)
        ):
            return False
        if not spec.static_activations:
            return True
        derived = spec.smoothquant or spec.timestep_bounds is not None
        if derived and not (spec.observer == "minmax" and spec.activation_symmetric):
            return False
        if spec.timestep_bounds is not None:
            stepped = all_stepped(self.steps, self.elements)
            return stepped and (not spec.smoothquant or self.steps.per_channel)
        if spec.observer == "mse":
            return self.mse.count > 0  # collected only where a scheme probed reads it
        return spec.observer == "minmax"

    def seed(self, module: QuantModule[Any]) -> None:
        """Calibrate an unfrozen quantized module from these statistics: the observers (or the
        ranges they imply) that :func:`~opsnn_quant.quant.api.quantize`'s own passes over the
        same data would fill, bit for bit (where :meth:`can_seed` says so)."""
        iq, spec = module.input_quantizer, module.spec
        iq.calls = self.calls
        if spec.needs_moments:
            iq.moments = self.moments
        if spec.smoothquant:
            assert self.channel_absmax is not None and iq.stats is not None
            iq.stats.absmax = self.channel_absmax.clone()
            iq.stats.seen = self.channel_seen
            module.decide_smoothing()
        if not spec.static_activations:
            return
        smooth = iq.smooth
        if spec.timestep_bounds is not None:
            groups = range(len(spec.timestep_bounds))
            iq.observers = [
                group_range(self.steps, spec.timestep_bounds, g, smooth) for g in groups
            ]
        elif smooth is not None:
            assert self.channel_absmax is not None
            iq.observer = symmetric_range(float((self.channel_absmax / smooth).max()))
        else:
            iq.observer = copy.deepcopy(self.mse if spec.observer == "mse" else self.minmax)
