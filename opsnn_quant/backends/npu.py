"""NPU backend: torch_npu's quantized operators, imported only when a tensor is on an ``npu`` device.

Written against the documented torch_npu API (``npu_quantize``, ``npu_dynamic_quant``,
``npu_quant_matmul``, ``npu_weight_quant_batchmatmul``, ``npu_fused_infer_attention_score``). It cannot run on the machines this
project is tested on; its call sequence is tested with a stand-in ``torch_npu`` module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from opsnn_quant.backends.base import ConvGeometry
from opsnn_quant.errors import BackendError


def _torch_npu() -> ModuleType:
    try:
        return importlib.import_module("torch_npu")
    except ImportError as exc:  # pragma: no cover - exercised only on machines without torch_npu
        raise BackendError(
            "a tensor is on an 'npu' device but torch_npu cannot be imported; "
            "install the torch_npu release that matches your CANN and torch"
        ) from exc


class NpuBackend:
    """Dispatches the quantized operators to ``torch_npu``."""

    name = "npu"

    def quantize_static(
        self, x: torch.Tensor, inv_scale: torch.Tensor, offset: torch.Tensor | None
    ) -> torch.Tensor:
        """AscendQuantV2, multiply mode; scales/offsets in x's dtype as torch_npu requires."""
        return _torch_npu().npu_quantize(x, inv_scale, offset, torch.qint8, -1, False)

    def quantize_dynamic(
        self, x: torch.Tensor, smooth_scales: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DynamicQuant (per token)."""
        return _torch_npu().npu_dynamic_quant(x, smooth_scales=smooth_scales)

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
        """QuantBatchMatmulV3; ``w_float_t`` is a reference-only cache and is ignored here."""
        return _torch_npu().npu_quant_matmul(
            x_q,
            w_q_t,
            scale,
            pertoken_scale=pertoken_scale,
            bias=bias,
            output_dtype=output_dtype,
        )

    def weight_quant_matmul(
        self,
        x: torch.Tensor,
        w_q_t: torch.Tensor,
        antiquant_scale: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int = 0,
    ) -> torch.Tensor:
        """WeightQuantBatchMatmulV2; antiquant scale in x's dtype (per group for int4)."""
        return _torch_npu().npu_weight_quant_batchmatmul(
            x, w_q_t, antiquant_scale.to(x.dtype), bias=bias, antiquant_group_size=group_size
        )

    def quant_conv2d(
        self,
        x_q: torch.Tensor,
        w_q: torch.Tensor,
        conv: ConvGeometry,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        output_dtype: torch.dtype,
    ) -> torch.Tensor | None:
        """None: torch_npu's eager API has no int8 convolution (im2col + npu_quant_matmul)."""
        return None

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
        """FIA's int8 full quant; the float32 deq scales are a documented form (no packing)."""
        out, _ = _torch_npu().npu_fused_infer_attention_score(
            q,
            k,
            v,
            atten_mask=atten_mask,
            dequant_scale1=deq_scale1,
            quant_scale1=quant_scale1,
            dequant_scale2=deq_scale2,
            num_heads=num_heads,
            num_key_value_heads=num_key_value_heads,
            scale=scale,
            input_layout=input_layout,
        )
        return out
