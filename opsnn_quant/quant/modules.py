"""Quantized modules: whole-module swaps whose forward is Ascend's quant arithmetic.

Life cycle: ``from_float(module, spec, name)`` -> calibration (float forward while the named
``input_quantizer`` collects statistics) -> ``freeze()`` (int8 weights, int32 bias, scales, packed
deq scales) -> quantized forward through :func:`opsnn_quant.backends.get_backend`, so the CPU
output equals what torch_npu computes on the same inputs.

:class:`QuantModule` is the base (in :mod:`opsnn_quant.quant.qmodule`, re-exported here with
the registry); :class:`QuantLinear` and :class:`QuantConv2d` register
themselves for ``nn.Linear`` and ``nn.Conv2d`` with :func:`register_quant_module`, the table
:func:`~opsnn_quant.quant.api.quantize` and :func:`~opsnn_quant.formats.checkpoint.load_quantized`
look classes up in. Another module type needs no change here: subclass ``QuantModule[FloatType]``
(store the float ``weight``/``bias``, call :meth:`QuantModule.init_quant`; ``forward`` reshapes
the input to (M, K) rows for :meth:`QuantModule.matmul_rows`; override
:meth:`QuantModule.int8_weight_shape` for a weight that is not (N, K)), implement ``from_float``
and decorate the class with ``@register_quant_module(FloatType)``.
"""

from __future__ import annotations

from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.backends import get_backend
from opsnn_quant.backends.base import ConvGeometry
from opsnn_quant.errors import ConfigError
from opsnn_quant.quant.qmodule import (
    CACHE_MAX_ROWS,
    OUTPUT_DTYPES,
    ROW_CHUNK_ELEMENTS,
    QuantModule,
    is_quant_module,
    no_weight_copies,
    quant_module_class,
    quant_module_named,
    register_quant_module,
    set_submodule,
)
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


@register_quant_module(nn.Linear)
class QuantLinear(QuantModule[nn.Linear]):
    """Quantized ``nn.Linear`` (W8A8 static, W8A8 dynamic per token, W8A16 or W4A16)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        spec: QuantSpec,
        name: str = "",
    ) -> None:
        super().__init__()
        if spec.precision == Precision.W4A16 and in_features % 8:
            raise ConfigError(
                f"module '{name}': w4a16 packs eight int4 values per word along the "
                f"{in_features} input features; they must be a multiple of 8"
            )
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.init_quant(spec, out_features, in_features, name)

    @classmethod
    def from_float(cls, module: nn.Linear, spec: QuantSpec, name: str = "") -> Self:
        """Wrap a float ``nn.Linear``; the module is left untouched.

        Its weights are shared, not copied: nothing writes them, and :meth:`freeze` replaces
        them with new tensors. A copy made a second float model during quantize() (its weights
        read from a memory-mapped checkpoint stay resident beside the copy).
        """
        q = cls(module.in_features, module.out_features, module.bias is not None, spec, name)
        q.weight = nn.Parameter(module.weight.detach(), requires_grad=False)
        if module.bias is not None:
            q.bias = nn.Parameter(module.bias.detach(), requires_grad=False)
        return q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.frozen:
            # calibrating: exactly nn.Linear's float output (F.linear on the input's own shape:
            # a 2-D reshape may take another GEMM path and move last bits downstream, and the
            # probe's pass 1, which can seed quantize(), saw the float model's)
            self.input_quantizer.collect(x.reshape(-1, self.in_features))
            return F.linear(x, self._weight2d(), self.bias)
        lead = x.shape[:-1]
        y = self.matmul_rows(x.reshape(-1, self.in_features))
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        state = "frozen" if self.frozen else "calibrating"
        return f"{self.in_features}, {self.out_features}, {self.spec.precision.value}, {state}"


def im2col_conv(module: nn.Module) -> bool:
    """Whether ``module`` is a conv :class:`QuantConv2d` takes: an ``nn.Conv2d`` with groups 1
    and explicit zero padding (its im2col rows are what the weight multiplies)."""
    return (
        type(module) is nn.Conv2d
        and module.groups == 1
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    )


@register_quant_module(nn.Conv2d)
class QuantConv2d(QuantModule[nn.Conv2d]):
    """Quantized ``nn.Conv2d`` (groups=1, zero padding) computed as im2col + the quant matmul.

    Ascend runs int8 convolutions only through ATC (or on 950); the eager torch_npu API has no
    int8 conv, so targets decide whether a QuantConv2d is deployable. SmoothQuant is not offered
    here: its per-column factors would not map onto a per-channel quantize before an ATC conv.
    GPTQ rounding and bias correction (static activations) see the conv as the matmul of its
    weight (O, C * KH * KW) with its im2col rows: the moments are those rows' (padding zeros
    included, as the conv multiplies them).
    """

    def __init__(self, conv: nn.Conv2d, spec: QuantSpec, name: str = "") -> None:
        super().__init__()
        if conv.groups != 1:
            raise ConfigError(f"module '{name}': QuantConv2d supports groups=1 only")
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ConfigError(f"module '{name}': QuantConv2d needs explicit zero padding")
        if spec.smoothquant:
            raise ConfigError(f"module '{name}': SmoothQuant is supported on Linear layers only")
        if spec.needs_moments and not spec.static_activations:
            raise ConfigError(
                f"module '{name}': GPTQ rounding and bias correction of a conv are for static "
                "activations (W8A8) only: no engine runs a per-token int8 conv"
            )
        if not spec.engine_def.conv:
            raise ConfigError(
                f"module '{name}': {spec.engine} quantizes Linear layers only (engine arithmetic "
                "is a Linear's)"
            )
        if spec.timestep_bounds is not None:
            raise ConfigError(
                f"module '{name}': per-step activation scales are for Linear layers only"
            )
        if spec.precision == Precision.W4A16:
            raise ConfigError(
                f"module '{name}': w4a16 (int4 weights) is a matmul format: Linear only"
            )
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size = tuple(conv.kernel_size)
        self.stride, self.padding = tuple(conv.stride), tuple(conv.padding)
        self.dilation = tuple(conv.dilation)
        # shared, never written (see QuantLinear.from_float)
        self.weight = nn.Parameter(conv.weight.detach(), requires_grad=False)
        self.bias = (
            None if conv.bias is None else nn.Parameter(conv.bias.detach(), requires_grad=False)
        )
        k = conv.in_channels * self.kernel_size[0] * self.kernel_size[1]
        self.init_quant(spec, conv.out_channels, k, name)

    @classmethod
    def from_float(cls, module: nn.Conv2d, spec: QuantSpec, name: str = "") -> Self:
        """Wrap a float ``nn.Conv2d`` (its weights shared, never written; see
        :meth:`QuantLinear.from_float`)."""
        return cls(module, spec, name)

    def int8_weight_shape(self) -> tuple[int, ...]:
        return (self.out_channels, self.in_channels, *self.kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.frozen:
            # Per-tensor statistics of the feature map equal those of its im2col columns
            # (zero padding only adds zeros, and every range includes 0); GPTQ's Hessian and
            # bias correction's mean are those of the im2col rows the weight multiplies.
            iq = self.input_quantizer
            rows = self.im2col_rows(x) if iq.moments is not None and iq.moments_pass else None
            iq.collect(x, rows)
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)
        b, _, h, w = x.shape
        kh, kw = self.kernel_size
        oh = (h + 2 * self.padding[0] - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        ow = (w + 2 * self.padding[1] - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        y = self._direct_rows(x) if self.spec.precision == Precision.W8A8 else None
        if y is None:
            y = self.matmul_rows(self.im2col_rows(x))
        return y.reshape(b, oh * ow, self.out_channels).transpose(1, 2).reshape(b, -1, oh, ow)

    def im2col_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The (B * OH * OW, C * KH * KW) im2col rows of ``x`` this conv's weight multiplies,
        in output-pixel order, columns as ``weight.reshape(O, -1)``'s."""
        cols = F.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)
        return cols.transpose(1, 2).reshape(-1, self.in_k)

    def _direct_rows(self, x: torch.Tensor) -> torch.Tensor | None:
        """The im2col rows' output straight from the quantized feature map, where the backend
        has an int8 convolution (the reference: its exact int32 sum, ~10x faster on a CPU than
        im2col); static activations only (a per-token scale is one per im2col row). None: use
        im2col."""
        if not self.spec.static_activations:
            return None
        iq = self.input_quantizer
        offset = None if self.spec.activation_symmetric else iq.offset.reshape(1).to(x.dtype)
        backend = get_backend(x.device)
        inv = iq.inv_scale.to(x.dtype)
        # Every element is quantized on its own with the one per-tensor scale, so quantizing the
        # map equals quantizing its im2col copies; the padding holds the quantized zero.
        x_q = backend.quantize_static(x, inv, offset)
        pad = int(backend.quantize_static(x.new_zeros(1), inv, offset).item())
        geometry = ConvGeometry(
            (self.stride[0], self.stride[1]),
            (self.padding[0], self.padding[1]),
            (self.dilation[0], self.dilation[1]),
            pad,
        )
        out_dtype = OUTPUT_DTYPES[self.spec.output_dtype]
        scale = self.deq_scale_packed if out_dtype == torch.float16 else self.deq_scale
        y = backend.quant_conv2d(x_q, self.weight, geometry, scale, self.quant_bias, out_dtype)
        return None if y is None else y.to(x.dtype)

    def extra_repr(self) -> str:
        state = "frozen" if self.frozen else "calibrating"
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"{self.spec.precision.value}, {state}"
        )


__all__ = [
    "CACHE_MAX_ROWS",
    "ROW_CHUNK_ELEMENTS",
    "QuantConv2d",
    "QuantLinear",
    "QuantModule",
    "im2col_conv",
    "is_quant_module",
    "no_weight_copies",
    "quant_module_class",
    "quant_module_named",
    "register_quant_module",
    "set_submodule",
]
