"""Reference backend: the exact CPU/CUDA arithmetic of :mod:`opsnn_quant.ascend`."""

from __future__ import annotations

import torch

from opsnn_quant import ascend
from opsnn_quant.ascend.conv import int8_conv2d_exact
from opsnn_quant.backends.base import ConvGeometry


class ReferenceBackend:
    """Runs the Ascend quant operators with :mod:`opsnn_quant.ascend` on any torch device."""

    name = "reference"

    def quantize_static(
        self, x: torch.Tensor, inv_scale: torch.Tensor, offset: torch.Tensor | None
    ) -> torch.Tensor:
        """See :meth:`QuantBackend.quantize_static`."""
        return ascend.npu_quantize(x, inv_scale, offset, torch.qint8, axis=-1, div_mode=False)

    def quantize_dynamic(
        self, x: torch.Tensor, smooth_scales: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`QuantBackend.quantize_dynamic`."""
        return ascend.npu_dynamic_quant(x, smooth_scales=smooth_scales)

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
        """See :meth:`QuantBackend.quant_matmul`."""
        # quant_matmul_cached: npu_quant_matmul plus the fp32 weight cache (same bits, faster).
        return ascend.quant_matmul_cached(
            x_q,
            w_q_t,
            scale,
            pertoken_scale=pertoken_scale,
            bias=bias,
            output_dtype=output_dtype,
            x2_float=w_float_t,
        )

    def weight_quant_matmul(
        self,
        x: torch.Tensor,
        w_q_t: torch.Tensor,
        antiquant_scale: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int = 0,
    ) -> torch.Tensor:
        """See :meth:`QuantBackend.weight_quant_matmul`."""
        return ascend.npu_weight_quant_batchmatmul(
            x, w_q_t, antiquant_scale, bias=bias, antiquant_group_size=group_size
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
        """See :meth:`QuantBackend.quant_conv2d`: the exact int32 conv, then npu_quant_matmul's
        epilogue on its rows."""
        acc = int8_conv2d_exact(
            x_q, w_q, conv.stride, conv.padding, conv.dilation, pad_value=conv.pad_value
        )
        rows = acc.permute(0, 2, 3, 1).reshape(-1, w_q.shape[0])
        k = w_q[0].numel()
        return ascend.quant_matmul_epilogue(rows, scale, k=k, bias=bias, output=output_dtype)

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
        """See :meth:`QuantBackend.quant_attention`."""
        out, _ = ascend.npu_fused_infer_attention_score(
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
