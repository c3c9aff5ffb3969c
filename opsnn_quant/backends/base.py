"""The backend interface: the quantized operations a quantized module needs.

Modules never test for a device themselves; they call :func:`get_backend` once per forward with
their input's device, which is the single dispatch point of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class ConvGeometry:
    """A Conv2d's geometry: stride, padding, dilation, and the int8 value its padding holds
    (the quantized zero: an asymmetric input's offset, else 0)."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    pad_value: int = 0


class QuantBackend(Protocol):
    """Runs the Ascend quantized operators somewhere (the NPU, or the exact reference)."""

    name: str

    def quantize_static(
        self, x: torch.Tensor, inv_scale: torch.Tensor, offset: torch.Tensor | None
    ) -> torch.Tensor:
        """AscendQuantV2 in multiply mode: ``int8(rint(x * inv_scale + offset))``.

        ``inv_scale``/``offset`` have one element or one per channel of ``x``'s last axis, in
        ``x``'s dtype (as torch_npu requires for ``div_mode=False``).
        """
        ...

    def quantize_dynamic(
        self, x: torch.Tensor, smooth_scales: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DynamicQuant: per-token int8 and fp32 per-token scales (shape ``x.shape[:-1]``)."""
        ...

    def quant_matmul(
        self,
        x_q: torch.Tensor,
        w_q_t: torch.Tensor,
        scale: torch.Tensor,
        *,
        pertoken_scale: torch.Tensor | None,
        bias: torch.Tensor | None,
        output_dtype: torch.dtype,
        w_float_t: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """QuantBatchMatmulV3 of int8 (M, K) by int8 (K, N).

        ``scale`` is the packed int64 deq scale for fp16 output without per-token scales, fp32
        otherwise. ``w_float_t`` is a reference-only cache of ``w_q_t`` in fp32.
        """
        ...

    def weight_quant_matmul(
        self,
        x: torch.Tensor,
        w_q_t: torch.Tensor,
        antiquant_scale: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int = 0,
    ) -> torch.Tensor:
        """WeightQuantBatchMatmulV2 (W8A16, W4A16): ``x @ (w_q_t * antiquant_scale) + bias``.

        ``w_q_t`` is int8 (K, N), or int32 (K // 8, N) holding int4 values (W4A16, with
        ``antiquant_scale`` (groups, N) and ``group_size`` > 0).
        """
        ...

    def quant_conv2d(
        self,
        x_q: torch.Tensor,
        w_q: torch.Tensor,
        conv: ConvGeometry,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        output_dtype: torch.dtype,
    ) -> torch.Tensor | None:
        """A quantized convolution straight from int8 (B, C, H, W) and int8 (N, C, kh, kw):
        what :meth:`quant_matmul` gives on the im2col rows (M = B*OH*OW, N), bit for bit, or
        None when the backend has no int8 convolution (the caller then runs im2col +
        :meth:`quant_matmul`: torch_npu's eager API has no int8 conv)."""
        ...

    def quant_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        deq_scale1: torch.Tensor,
        quant_scale1: torch.Tensor,
        deq_scale2: torch.Tensor,
        num_heads: int,
        num_key_value_heads: int,
        scale: float,
        input_layout: str,
        atten_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Fused int8 attention (``npu_fused_infer_attention_score``, prefill branch, Atlas A2/A3)
        of int8 ``q``/``k``/``v`` (Q_S > 1) with per-tensor float32 ``deq_scale1`` (after QK^T),
        ``quant_scale1`` (on P before PV) and ``deq_scale2`` (after PV); float16 output."""
        ...
