"""Error measures between a reference tensor and an approximation of it."""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(sum ref^2 / sum (ref - approx)^2)`` in dB.

    ``inf`` when the two are equal; ``-inf`` when the reference is all zeros but they differ.
    Non-finite values in ``approx`` (fp16 overflow) give ``-inf``.
    """
    ref = reference.detach().to(torch.float64)
    out = approx.detach().to(torch.float64)
    if not bool(torch.isfinite(out).all()):
        return -math.inf
    noise = float((ref - out).pow(2).sum())
    signal = float(ref.pow(2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@torch.no_grad()
def cosine(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors (1.0 for two zero tensors, nan never)."""
    ref = reference.detach().to(torch.float64).reshape(-1)
    out = approx.detach().to(torch.float64).reshape(-1)
    if not bool(torch.isfinite(out).all()):
        return -1.0
    nr, no = float(ref.norm()), float(out.norm())
    if nr == 0.0 and no == 0.0:
        return 1.0
    if nr == 0.0 or no == 0.0:
        return 0.0
    return float(ref @ out) / (nr * no)
