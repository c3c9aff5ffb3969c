"""Evenly strided subsets of a module call's rows, where the local error is measured on part of
a call: rows (tokens; a conv's output pixels) are independent under every candidate scheme, so a
subset's error is exactly its own."""

from __future__ import annotations

import math

import torch


def strided_samples(
    args: tuple, y: torch.Tensor, rows: int, channels: int
) -> tuple[tuple, torch.Tensor]:
    """``(args, y)`` on every ``k``-th sample (leading index) so that about ``rows`` input rows
    remain (whole samples: a conv needs its neighbours); the whole call when it holds no more
    rows or is not a single batched input."""
    if len(args) != 1 or not isinstance(args[0], torch.Tensor) or args[0].dim() < 2:
        return args, y
    x = args[0]
    lead = x.shape[0]
    if y.dim() == 0 or y.shape[0] != lead:
        return args, y
    per_sample = x.numel() / max(lead * channels, 1)
    keep = max(1, math.ceil(rows / max(per_sample, 1.0)))
    if keep >= lead:
        return args, y
    step = lead // keep
    return (x[::step],), y[::step]


def strided_rows(y: torch.Tensor, channel_dim: int, rows: float) -> torch.Tensor:
    """Every ``k``-th row of an output, ``k = ceil(rows of y / rows)`` (so about ``rows`` rows,
    at most that many): along the flattened leading dims of a Linear's ``(..., C)``
    (``channel_dim`` -1), along the flattened pixels of each sample of a conv's
    ``(B, C, H, W)`` (``channel_dim`` 1); ``y`` itself when nothing would be left out."""
    channels = y.shape[channel_dim] if y.dim() else 1
    stride = math.ceil((y.numel() // max(channels, 1)) / max(rows, 1.0))
    if stride <= 1 or y.dim() < 2:
        return y
    if channel_dim % y.dim() == 1 and y.dim() > 2:
        return y.flatten(2)[:, :, ::stride]
    return y.reshape(-1, channels)[::stride]
