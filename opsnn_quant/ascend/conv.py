"""Exact int8 convolution accumulators on the reference backend (not a torch_npu function).

An Ascend int8 convolution (an ATC graph's quantized Conv2D) accumulates int8 x int8 products
in int32, exactly. Here that sum is computed with fp32 convolutions on the integer values, over
blocks of input channels small enough that every partial sum is an integer below 2**24
(``|int8 * int8| <= 2**14``, at most 1024 products per output per block: any summation order is
exact), the blocks added in int64. Each block's result is checked to be integer-valued, so a
convolution algorithm that is not a plain sum of products (Winograd, FFT) cannot slip through:
such a block falls back to im2col and the exact matmul. The result equals
``int8_matmul_exact(im2col(x_q), w_q)`` bit for bit (tested).

Where the CPU's int8 GEMM is exact and won the race for products of this many rows
(:func:`~opsnn_quant.ascend.matmul.native_int8_matmul`: a CPU with VNNI or AMX), a
1x1 convolution or one of more than 1024 products per output (where the fp32 path needs several
channel blocks) is an int8 im2col (channels last) through that GEMM instead: the same int32
sums, 2-10x faster on a UNet's wide 3x3 convs. Narrow 3x3 convs stay on the fp32 path, where
the im2col copy costs more than it saves.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from opsnn_quant.ascend.matmul import EXACT_FP32_CHUNK, int8_matmul_exact, native_int8_matmul

log = logging.getLogger(__name__)


@torch.no_grad()
def int8_conv2d_exact(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    pad_value: int = 0,
) -> torch.Tensor:
    """Exact ``conv2d`` of int8 tensors as int32 (groups 1).

    Args:
        x_q: int8 (B, C, H, W).
        w_q: int8 (N, C, kh, kw).
        stride, padding, dilation: as ``F.conv2d``.
        pad_value: the int8 value the padding holds (the quantized zero: the offset of an
            asymmetric input, else 0).

    Returns:
        int32 (B, N, OH, OW).
    """
    if pad_value != 0 and any(padding):
        ph, pw = padding
        x_q = F.pad(x_q, (pw, pw, ph, ph), value=pad_value)
        padding = (0, 0)
    kh, kw = w_q.shape[2], w_q.shape[3]
    oh = (x_q.shape[2] + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (x_q.shape[3] + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if (
        native_int8_matmul(x_q.device, rows=x_q.shape[0] * oh * ow)
        and tuple(dilation) == (1, 1)
        and (kh * kw == 1 or x_q.shape[1] * kh * kw > EXACT_FP32_CHUNK)
    ):
        return _native_im2col_conv(x_q, w_q, stride, padding)
    block = max(1, EXACT_FP32_CHUNK // (kh * kw))
    a, b = x_q.to(torch.float32), w_q.to(torch.float32)
    acc: torch.Tensor | None = None
    for c0 in range(0, x_q.shape[1], block):
        part = F.conv2d(
            a[:, c0 : c0 + block], b[:, c0 : c0 + block], None, stride, padding, dilation
        )
        if not torch.equal(part, torch.round(part)):
            log.warning("int8 conv: a non-integer fp32 block (not a plain sum); im2col used")
            return _im2col_conv(x_q, w_q, stride, padding, dilation)
        part_i = part.to(torch.int64)
        acc = part_i if acc is None else acc.add_(part_i)
    assert acc is not None
    return acc.to(torch.int32)


def _native_im2col_conv(
    x_q: torch.Tensor, w_q: torch.Tensor, stride: tuple[int, int], padding: tuple[int, int]
) -> torch.Tensor:
    """Undilated conv as int8 patches (B*OH*OW, C*kh*kw) times the int8 weight in the CPU's
    int8 GEMM. The patches are taken channels last, so the result is a (B, N, OH, OW) view of
    (B, OH, OW, N) rows: the layout the epilogue reshapes to anyway."""
    (ph, pw), (sh, sw) = padding, stride
    if ph or pw:
        x_q = F.pad(x_q, (pw, pw, ph, ph))
    b, c = x_q.shape[:2]
    n, _, kh, kw = w_q.shape
    patches = x_q.permute(0, 2, 3, 1).unfold(1, kh, sh).unfold(2, kw, sw)  # B OH OW C kh kw
    oh, ow = patches.shape[1], patches.shape[2]
    rows = patches.reshape(b * oh * ow, c * kh * kw)  # (C, kh, kw): the weight's own order
    acc = int8_matmul_exact(rows, w_q.reshape(n, -1).t())
    return acc.reshape(b, oh, ow, n).permute(0, 3, 1, 2)


def _im2col_conv(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
) -> torch.Tensor:
    """The same sum through im2col and :func:`int8_matmul_exact` (zero padding: ``x_q`` is
    padded already where the pad value is not 0)."""
    b, _, h, w = x_q.shape
    n, _, kh, kw = w_q.shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = F.unfold(x_q.to(torch.float32), (kh, kw), dilation, padding, stride)
    rows = cols.transpose(1, 2).reshape(-1, cols.shape[1]).to(torch.int8)
    acc = int8_matmul_exact(rows, w_q.reshape(n, -1).t())
    return acc.reshape(b, oh * ow, n).transpose(1, 2).reshape(b, n, oh, ow)
