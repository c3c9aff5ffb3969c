"""The named quantizer submodules of ``QuantLinear`` / ``QuantConv2d``: ``input_quantizer``
(calibration statistics, then AscendQuantV2 / DynamicQuant parameters) and ``weight_quantizer``
(per-output-channel int8 scales)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from opsnn_quant.core.timesteps import current_step, group_of
from opsnn_quant.errors import CalibrationError, ConfigError
from opsnn_quant.quant.engine import TORCH_DTYPES, mul_scale_of
from opsnn_quant.quant.functional import (
    quantize_weight_per_channel,
    quantize_weight_per_group_int4,
    static_inv_scale,
)
from opsnn_quant.quant.gptq import Moments, SplitMoments
from opsnn_quant.quant.observers import Observer, make_observer
from opsnn_quant.quant.smoothquant import ChannelStats, search_alpha, smoothing_factors
from opsnn_quant.quant.spec import DEFAULT_ALPHA_GRID, QuantSpec

log = logging.getLogger(__name__)


class InputQuantizer(nn.Module):
    """Activation side: calibration statistics, then the frozen AscendQuantV2/DynamicQuant params.

    Frozen buffers: static: ``scale``, ``offset`` (0-d fp32), ``inv_scale`` ((1,) or (K,) fp32,
    the multiplier fed to AscendQuantV2, SmoothQuant folded in); dynamic with SmoothQuant:
    ``smooth_scales`` (K,). With ``spec.timestep_bounds`` (G groups of denoising steps) the static
    buffers get a leading group dimension (``scale`` (G,), ``inv_scale`` (G, 1 or K)) and
    ``step_bounds`` (G,) int64 records the groups; one observer per group calibrates them, fed by
    the step the sampling loop is at (:mod:`opsnn_quant.core.timesteps`).
    """

    scale: torch.Tensor
    offset: torch.Tensor
    inv_scale: torch.Tensor

    def __init__(self, spec: QuantSpec, channels: int, name: str = "") -> None:
        super().__init__()
        self.spec = spec
        self.channels = channels
        self.name = name
        self.bounds = spec.timestep_bounds
        groups = len(self.bounds) if self.bounds else 1
        # One observer per group of steps (just one without timestep groups).
        self.observers = (
            [make_observer(spec.observer, spec.percentile) for _ in range(groups)]
            if spec.static_activations
            else []
        )
        self.stats = ChannelStats(channels) if spec.smoothquant else None
        self.smooth: torch.Tensor | None = None  # s_j, decided before the observer pass
        # per input channel max |W| over every Linear sharing this module's factor (a smoothing
        # group); None: this module's own weight's
        self.shared_weight_absmax: torch.Tensor | None = None
        self.collect_stats = self.stats is not None
        self.collect_range = bool(self.observers) and not spec.smoothquant
        # the raw inputs' moments (GPTQ's Hessian, bias correction's mean), in the first pass
        self.moments: Moments | None = (
            SplitMoments(channels, gram=spec.weight_rounding == "gptq")
            if spec.needs_moments
            else None
        )
        self.calls = 0
        self.moments_pass = True

    @property
    def observer(self) -> Observer | None:
        """The range observer (the first group's with timestep groups; None when dynamic)."""
        return self.observers[0] if self.observers else None

    @observer.setter
    def observer(self, value: Observer | None) -> None:
        self.observers = [] if value is None else [value]

    def group_index(self) -> int | None:
        """The group of steps the sampling loop is at (None without timestep groups).

        Raises:
            CalibrationError: timestep groups but no step set (called outside a sampling loop).
        """
        if not self.bounds:
            return None
        step = current_step()
        if step is None:
            raise CalibrationError(
                f"module '{self.name}' keeps activation scales per group of denoising steps, but "
                "it ran outside a sampling loop (no step is set): run it through its diffusion "
                "adapter, or use opsnn_quant.core.timesteps.at_step"
            )
        return group_of(step, self.bounds)

    @torch.no_grad()
    def collect(self, x2d: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Record one calibration batch of (M, K) inputs (``rows``: the (M', K) rows the
        weight multiplies, for the moments, when ``x2d`` is not them: a conv's feature map
        and its im2col rows)."""
        self.calls += 1
        if not bool(torch.isfinite(x2d).all()):
            raise CalibrationError(
                f"calibration activations entering module '{self.name}' contain NaN or Inf "
                f"(call {self.calls}); check the calibration data and the float model"
            )
        if self.collect_stats and self.stats is not None:
            self.stats.collect(x2d)
        if self.moments is not None and self.moments_pass:
            self.moments.collect(x2d if rows is None else rows)
        if self.collect_range and self.observers:
            xs = x2d if self.smooth is None else x2d / self.smooth.to(x2d.device)
            g = self.group_index()
            self.observers[0 if g is None else g].collect(xs)

    def end_first_pass(self) -> None:
        """After quantize()'s first pass over the data: nothing more is collected (a second
        pass, for SmoothQuant's ranges, re-opens range collection in
        :meth:`decide_smoothing` for the smoothed modules only), so every statistic sums the
        data once, as the probe's pass 1 that can seed it does."""
        self.moments_pass = False
        self.collect_range = False

    def decide_smoothing(self, weight2d: torch.Tensor) -> None:
        """Choose SmoothQuant factors from the collected statistics (fixed alpha or search)."""
        if self.stats is None:
            return
        if self.stats.seen == 0:
            raise CalibrationError(f"module '{self.name}' received no calibration data")
        alpha = self.spec.smoothquant_alpha
        dynamic = not self.spec.static_activations
        if alpha == "auto" and self.shared_weight_absmax is not None:
            raise ConfigError(
                f"module '{self.name}' shares its SmoothQuant factor with a group; the group "
                "takes one fixed alpha, not 'auto'"
            )
        if alpha == "auto":
            chosen, s, err = search_alpha(self.stats, weight2d, dynamic, DEFAULT_ALPHA_GRID)
            log.debug("%s: SmoothQuant alpha=%s (rel. error %.3g)", self.name, chosen, err)
            self.chosen_alpha = chosen
        else:
            assert isinstance(alpha, float | int)
            w_absmax = self.shared_weight_absmax
            if w_absmax is None:
                w_absmax = weight2d.detach().abs().amax(dim=0).float()
            s = smoothing_factors(self.stats.absmax.to(w_absmax.device), w_absmax, float(alpha))
            self.chosen_alpha = float(alpha)
        self.smooth = s
        self.collect_stats = False
        self.collect_range = bool(self.observers)
        self.moments_pass = False  # the range pass sees the same inputs again

    def engine_smoothing(self) -> None:
        """For a module made for a serving engine (``spec.engine``), before :meth:`freeze` and
        before the weight is smoothed: an engine that multiplies by ``mul_scale`` (MindIE-SD:
        ``1 / s`` in the engine dtype, buffer ``mul_scale``) effectively applies the factor that
        undoes it, which replaces ``smooth``. A factor folded into the producer's float weights
        (vLLM-Ascend) or into the quantize multiplier (ours) is kept as is."""
        if self.spec.engine_def.smoothing != "mul_scale" or self.smooth is None:
            return
        dtype = TORCH_DTYPES[self.spec.output_dtype]
        mul, self.smooth = mul_scale_of(self.smooth, dtype)
        self.register_buffer("mul_scale", mul)

    def freeze(self) -> list[tuple[float, float]]:
        """Register the frozen buffers; returns the static ``(scale, offset)`` of each group of
        steps (one pair without timestep groups; ``(1, 0)`` when dynamic). For a serving
        engine's module the ``scale`` buffer holds the ``input_scale`` it stores and the scale
        returned is the one the engine effectively applies
        (:meth:`~opsnn_quant.quant.engines.Engine.input_scale_of`)."""
        if self.spec.static_activations:
            qps = []
            for g, obs in enumerate(self.observers):
                if obs.count == 0:
                    where = (
                        f" in step group {g} (from step {self.bounds[g]})" if self.bounds else ""
                    )
                    raise CalibrationError(
                        f"module '{self.name}' received no calibration data{where}"
                    )
                qp = obs.compute(self.spec.activation_symmetric)
                qps.append((qp.scale, qp.offset, *self._engine_scale(qp.scale)))
            scale = torch.tensor([stored for _, _, stored, _ in qps], dtype=torch.float32)
            offset = torch.tensor([off for _, off, _, _ in qps], dtype=torch.float32)
            inv = torch.stack([static_inv_scale(eff, self.smooth) for _, _, _, eff in qps])
            if self.bounds:
                self.register_buffer("step_bounds", torch.tensor(self.bounds, dtype=torch.int64))
            else:
                scale, offset, inv = scale[0], offset[0], inv[0]
            self.register_buffer("scale", scale)
            self.register_buffer("offset", offset)
            self.register_buffer("inv_scale", inv)
            result = [(eff, off) for _, off, _, eff in qps]
        else:
            result = [(1.0, 0.0)]
            if self.smooth is not None and self.spec.engine_def.smoothing == "multiplier":
                self.register_buffer("smooth_scales", (1.0 / self.smooth).to(torch.float32))
        if self.smooth is not None:
            smooth = self.smooth.to(torch.float32)
            del self.smooth  # a plain attribute until now; saved as a buffer from here on
            self.register_buffer("smooth", smooth)
        self.observers, self.stats, self.moments = [], None, None
        return result

    def _engine_scale(self, scale: float) -> tuple[float, float]:
        """(scale to store, scale effectively applied): the calibrated one twice for this
        package's own arithmetic, the engine's rounding of it otherwise
        (:meth:`~opsnn_quant.quant.engines.Engine.input_scale_of`)."""
        dtype = TORCH_DTYPES[self.spec.output_dtype]
        return self.spec.engine_def.input_scale_of(scale, dtype)

    def extra_repr(self) -> str:
        return f"{self.spec.precision.value}, observer={self.spec.observer}"


class WeightQuantizer(nn.Module):
    """Weight side: symmetric int8 per output channel (frozen buffer ``scale`` (N,) fp32), or
    int4 per group of input channels (``scale`` (groups, N) fp32)."""

    def __init__(self, out_channels: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(out_channels, dtype=torch.float32))

    @torch.no_grad()
    def quantize(self, w2d: torch.Tensor, scale_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Quantize a (N, K) weight; stores the scales and returns the int8 weight.

        Args:
            w2d: the (N, K) float weight.
            scale_dtype: the dtype an engine keeps the scales in (they are rounded up to it
                first); None: float32 as computed.
        """
        q, s = quantize_weight_per_channel(w2d, scale_dtype)
        self.scale = s
        return q

    @torch.no_grad()
    def quantize_int4(self, w2d: torch.Tensor, group_size: int) -> torch.Tensor:
        """Quantize a (N, K) weight to int4 per group; stores the (groups, N) scales and returns
        the packed int32 (N, K // 8) weight."""
        q, s = quantize_weight_per_group_int4(w2d, group_size)
        self.scale = s
        return q
