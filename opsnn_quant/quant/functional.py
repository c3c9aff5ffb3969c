"""Pure tensor maths of the quantized modules (weights, biases, scale vectors)."""

from __future__ import annotations

import torch

from opsnn_quant.quant.engine import round_up_to
from opsnn_quant.quant.observers import MIN_SCALE

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@torch.no_grad()
def quantize_weight_per_channel(
    w: torch.Tensor, scale_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: ``s_n = max|W_n| / 127``, ``q = rint(W / s_n)``.

    Args:
        w: (N, K) float weight.
        scale_dtype: an engine's dtype for the scales: ``s_n`` is rounded up to it (no value
            then exceeds 127 in magnitude); None: float32.

    Returns:
        ``(q, s)``: int8 (N, K) and fp32 (N,). An all-zero row gets scale 1 and zeros.
    """
    w = w.detach()
    lo, hi = torch.aminmax(w.to(torch.float32), dim=1)
    s = torch.maximum(-lo, hi) / 127.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    if scale_dtype is not None:
        s = round_up_to(s, scale_dtype)
    # Row blocks: a large weight's fp32 temporaries (an LM head: 80 MB each) stay bounded.
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    step = max(1, (1 << 20) // max(w.shape[1], 1))
    for i in range(0, w.shape[0], step):
        rows = w[i : i + step].to(torch.float32) / s[i : i + step].unsqueeze(1)
        q[i : i + step] = rows.round_().clamp_(-128, 127)
    return q, s


@torch.no_grad()
def quantize_weight_per_group_int4(
    w: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 in groups of ``group_size`` input channels: ``s = max|W_group| / 7``,
    ``q = clamp(rint(W / s), -8, 7)``, packed eight per int32 along K (first value in the low
    nibble, :func:`opsnn_quant.ascend.pack_int4`).

    Args:
        w: (N, K) float weight, K a multiple of 8.
        group_size: input channels per scale (the last group may be shorter).

    Returns:
        ``(packed, s)``: int32 (N, K // 8) and fp32 (ceil(K / group_size), N), the
        ``antiquant_scale`` layout of ``npu_weight_quant_batchmatmul``. An all-zero group gets
        scale 1 and zeros.
    """
    from opsnn_quant.ascend import pack_int4

    n, k = w.shape
    groups = -(-k // group_size)
    wf = w.detach().to(torch.float32)
    pad = groups * group_size - k
    blocks = torch.nn.functional.pad(wf, (0, pad)).reshape(n, groups, group_size)
    s = blocks.abs().amax(dim=2) / 7.0  # (N, G)
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = (blocks / s.unsqueeze(2)).round_().clamp_(-8, 7).reshape(n, -1)[:, :k]
    return pack_int4(q.to(torch.int8)), s.t().contiguous()


@torch.no_grad()
def fold_bias_int32(
    bias: torch.Tensor | None, deq_scale: torch.Tensor, offset: float, w_q: torch.Tensor
) -> torch.Tensor:
    """The int32 bias of QuantBatchMatmulV3 for static activations.

    ``b_int = rint(bias / deq_scale) - offset * sum_k(w_q[n, k])``: the float bias in accumulator
    units plus the asymmetric-activation correction, since
    ``sum_k (q_k - o) w_nk = acc_n - o * sum_k w_nk`` (o is an integer, so the fold is exact).
    """
    n = w_q.shape[0]
    b = torch.zeros(n, dtype=torch.float64)
    if bias is not None:
        b = torch.round(bias.detach().to(torch.float64) / deq_scale.to(torch.float64))
    if offset != 0.0:
        b = b - offset * w_q.to(torch.float64).sum(dim=1)
    return b.clamp(INT32_MIN, INT32_MAX).to(torch.int32)


@torch.no_grad()
def static_inv_scale(scale: float, smooth: torch.Tensor | None) -> torch.Tensor:
    """The multiplier vector of AscendQuantV2: ``1 / scale`` or ``1 / (scale * s_j)`` per channel."""
    scale = max(scale, MIN_SCALE)
    if smooth is None:
        return torch.tensor([1.0 / scale], dtype=torch.float32)
    return (1.0 / (scale * smooth.to(torch.float64))).to(torch.float32)
