"""The named quantizer submodules of ``QuantLinear`` / ``QuantConv2d``: ``input_quantizer``
(calibration statistics, then AscendQuantV2 / DynamicQuant parameters) and ``weight_quantizer``
(per-output-channel int8 scales)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from opsnn_quant.errors import CalibrationError
from opsnn_quant.quant.functional import (
    quantize_weight_per_channel,
    quantize_weight_per_group_int4,
    static_inv_scale,
)
from opsnn_quant.quant.observers import make_observer
from opsnn_quant.quant.smoothquant import ChannelStats, search_alpha, smoothing_factors
from opsnn_quant.quant.spec import DEFAULT_ALPHA_GRID, QuantSpec

log = logging.getLogger(__name__)


class InputQuantizer(nn.Module):
    """Activation side: calibration statistics, then the frozen AscendQuantV2/DynamicQuant params.

    Frozen buffers: static: ``scale``, ``offset`` (0-d fp32), ``inv_scale`` ((1,) or (K,) fp32,
    the multiplier fed to AscendQuantV2, SmoothQuant folded in); dynamic with SmoothQuant:
    ``smooth_scales`` (K,).
    """

    scale: torch.Tensor
    offset: torch.Tensor
    inv_scale: torch.Tensor

    def __init__(self, spec: QuantSpec, channels: int, name: str = "") -> None:
        super().__init__()
        self.spec = spec
        self.channels = channels
        self.name = name
        self.observer = (
            make_observer(spec.observer, spec.percentile) if spec.static_activations else None
        )
        self.stats = ChannelStats(channels) if spec.smoothquant else None
        self.smooth: torch.Tensor | None = None  # s_j, decided before the observer pass
        self.collect_stats = self.stats is not None
        self.collect_range = self.observer is not None and not spec.smoothquant
        self.calls = 0

    @torch.no_grad()
    def collect(self, x2d: torch.Tensor) -> None:
        """Record one calibration batch of (M, K) inputs."""
        self.calls += 1
        if not bool(torch.isfinite(x2d).all()):
            raise CalibrationError(
                f"calibration activations entering module '{self.name}' contain NaN or Inf "
                f"(call {self.calls}); check the calibration data and the float model"
            )
        if self.collect_stats and self.stats is not None:
            self.stats.collect(x2d)
        if self.collect_range and self.observer is not None:
            xs = x2d if self.smooth is None else x2d / self.smooth.to(x2d.device)
            self.observer.collect(xs)

    def decide_smoothing(self, weight2d: torch.Tensor) -> None:
        """Choose SmoothQuant factors from the collected statistics (fixed alpha or search)."""
        if self.stats is None:
            return
        if self.stats.seen == 0:
            raise CalibrationError(f"module '{self.name}' received no calibration data")
        alpha = self.spec.smoothquant_alpha
        dynamic = not self.spec.static_activations
        if alpha == "auto":
            chosen, s, err = search_alpha(self.stats, weight2d, dynamic, DEFAULT_ALPHA_GRID)
            log.debug("%s: SmoothQuant alpha=%s (rel. error %.3g)", self.name, chosen, err)
            self.chosen_alpha = chosen
        else:
            assert isinstance(alpha, float | int)
            w_absmax = weight2d.detach().abs().amax(dim=0).float()
            s = smoothing_factors(self.stats.absmax.to(w_absmax.device), w_absmax, float(alpha))
            self.chosen_alpha = float(alpha)
        self.smooth = s
        self.collect_stats = False
        self.collect_range = self.observer is not None

    def freeze(self) -> tuple[float, float]:
        """Register the frozen buffers; returns the static ``(scale, offset)`` (1, 0 if dynamic)."""
        if self.spec.static_activations:
            assert self.observer is not None
            if self.observer.count == 0:
                raise CalibrationError(f"module '{self.name}' received no calibration data")
            qp = self.observer.compute(self.spec.activation_symmetric)
            self.register_buffer("scale", torch.tensor(qp.scale, dtype=torch.float32))
            self.register_buffer("offset", torch.tensor(qp.offset, dtype=torch.float32))
            self.register_buffer("inv_scale", static_inv_scale(qp.scale, self.smooth))
            result = (qp.scale, qp.offset)
        else:
            result = (1.0, 0.0)
            if self.smooth is not None:
                self.register_buffer("smooth_scales", (1.0 / self.smooth).to(torch.float32))
        if self.smooth is not None:
            smooth = self.smooth.to(torch.float32)
            del self.smooth  # a plain attribute until now; saved as a buffer from here on
            self.register_buffer("smooth", smooth)
        self.observer, self.stats = None, None
        return result

    def extra_repr(self) -> str:
        return f"{self.spec.precision.value}, observer={self.spec.observer}"


class WeightQuantizer(nn.Module):
    """Weight side: symmetric int8 per output channel (frozen buffer ``scale`` (N,) fp32), or
    int4 per group of input channels (``scale`` (groups, N) fp32)."""

    def __init__(self, out_channels: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(out_channels, dtype=torch.float32))

    @torch.no_grad()
    def quantize(self, w2d: torch.Tensor) -> torch.Tensor:
        """Quantize a (N, K) weight; stores the scales and returns the int8 weight."""
        q, s = quantize_weight_per_channel(w2d)
        self.scale = s
        return q

    @torch.no_grad()
    def quantize_int4(self, w2d: torch.Tensor, group_size: int) -> torch.Tensor:
        """Quantize a (N, K) weight to int4 per group; stores the (groups, N) scales and returns
        the packed int32 (N, K // 8) weight."""
        q, s = quantize_weight_per_group_int4(w2d, group_size)
        self.scale = s
        return q
