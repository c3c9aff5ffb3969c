"""SmoothQuant: migrate activation outliers into the weights, per input channel.

``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``; the layer computes ``(X / s) @ (W * s)^T``, which is
the float result unchanged. The division never needs its own op on Ascend: for static activations
``1 / s`` folds into AscendQuantV2's per-channel scale vector (``x * (1 / (s_x * s_j))``), for
dynamic activations it is the ``smooth_scales`` input of DynamicQuant. So no graph surgery on the
previous LayerNorm/Linear is needed, and layers that share an input can each choose their own s.

alpha is searched per layer on a grid by the layer's output error on a small reservoir of its
input rows, simulated with the same quantization as the deployed scheme.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from opsnn_quant.quant.observers import MIN_SCALE


class ChannelStats:
    """Streaming per-input-channel |x| maxima plus a fixed-size, deterministic row reservoir.

    Args:
        channels: number of input channels (the last axis).
        reservoir: rows kept for the alpha search.
        seed: generator seed; the same batches give the same reservoir.
    """

    def __init__(self, channels: int, reservoir: int = 256, seed: int = 0) -> None:
        self.channels = channels
        self.capacity = reservoir
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        """Forget everything collected."""
        self.absmax = torch.zeros(self.channels, dtype=torch.float32)
        self.rows: torch.Tensor | None = None
        self.seen = 0
        self._gen = torch.Generator().manual_seed(self.seed)

    @torch.no_grad()
    def collect(self, x: torch.Tensor) -> None:
        """Add a batch (..., channels)."""
        rows = x.detach().reshape(-1, self.channels).to(torch.float32).cpu()
        self.absmax = torch.maximum(self.absmax, rows.abs().amax(dim=0))
        # Reservoir sampling keeps a uniform sample of all rows seen, in fixed memory.
        for start in range(0, rows.shape[0], 4096):
            chunk = rows[start : start + 4096]
            if self.rows is None or self.rows.shape[0] < self.capacity:
                take = chunk[: self.capacity - (0 if self.rows is None else self.rows.shape[0])]
                self.rows = take.clone() if self.rows is None else torch.cat([self.rows, take])
                chunk = chunk[take.shape[0] :]
                self.seen += take.shape[0]
            if chunk.shape[0] == 0:
                continue
            idx = self.seen + torch.arange(1, chunk.shape[0] + 1)
            slots = (torch.rand(chunk.shape[0], generator=self._gen) * idx).long()
            hit = slots < self.capacity
            if hit.any():
                # Sequential reservoir semantics: when several rows of this chunk draw the same
                # slot, the last one wins. (Indexed assignment with duplicate indices is
                # nondeterministic in torch, so deduplicate first.)
                target, rows_hit = slots[hit], chunk[hit]
                rev = torch.flip(target, dims=(0,))
                uniq, inverse = torch.unique(rev, return_inverse=True)
                first_in_rev = torch.full((uniq.numel(),), rev.numel(), dtype=torch.long)
                first_in_rev.scatter_reduce_(0, inverse, torch.arange(rev.numel()), reduce="amin")
                last = rev.numel() - 1 - first_in_rev
                self.rows[uniq] = rows_hit[last]
            self.seen += chunk.shape[0]


@torch.no_grad()
def smoothing_factors(
    act_absmax: torch.Tensor, w_absmax: torch.Tensor, alpha: float
) -> torch.Tensor:
    """``s_j = act_j^alpha / w_j^(1-alpha)``, with 1 for channels where either is zero."""
    a = act_absmax.to(torch.float32)
    w = w_absmax.to(torch.float32)
    ok = (a > 0) & (w > 0)
    s = torch.where(ok, a.clamp_min(1e-12).pow(alpha) / w.clamp_min(1e-12).pow(1.0 - alpha), 1.0)
    return s.clamp(1e-5, 1e5)


@torch.no_grad()
def fake_quant_weight(w: torch.Tensor) -> torch.Tensor:
    """Symmetric per-output-channel int8 round trip of a (N, K) weight (float simulation)."""
    s = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
    return torch.round(w / s).clamp(-128, 127) * s


@torch.no_grad()
def fake_quant_activation(x: torch.Tensor, dynamic: bool) -> torch.Tensor:
    """Symmetric int8 round trip of (M, K) activations: per token (dynamic) or per tensor."""
    if dynamic:
        s = (x.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
    else:
        s = (x.abs().max() / 127.0).clamp_min(MIN_SCALE)
    return torch.round(x / s).clamp(-128, 127) * s


def _sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits.

    Decisions compare errors rounded like this, so that last-bit differences between runs (BLAS
    kernels may round differently from one run to the next) cannot flip a choice: byte-identical
    checkpoints and policies depend on it. Near-ties go to the earlier candidate.
    """
    if x == 0.0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


@torch.no_grad()
def layer_error(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, dynamic: bool) -> float:
    """Relative squared output error of a smoothed, W8A8-quantized ``x @ w.T`` against float.

    The simulated quantization runs in fp32 (as the device rounds); the products and error sums in
    float64 so that the comparison between candidates is stable.
    """
    ref = x.double() @ w.double().T
    xs, ws = (x, w) if s is None else (x / s, w * s)
    out = fake_quant_activation(xs, dynamic).double() @ fake_quant_weight(ws).double().T
    denom = float(ref.pow(2).sum())
    return _sig(float((out - ref).pow(2).sum()) / max(denom, 1e-300))


@torch.no_grad()
def search_alpha(
    stats: ChannelStats,
    weight: torch.Tensor,
    dynamic: bool,
    alphas: Sequence[float],
) -> tuple[float | None, torch.Tensor | None, float]:
    """Choose SmoothQuant's alpha for one layer (or none) by output error on the reservoir.

    Args:
        stats: the layer's input statistics.
        weight: (N, K) float weight.
        dynamic: per-token (True) or per-tensor static (False) activation quantization.
        alphas: candidates; "no smoothing" is always a candidate too.

    Returns:
        ``(alpha, s, error)``: alpha None and s None when smoothing does not help.
    """
    x = stats.rows if stats.rows is not None else torch.zeros(1, weight.shape[1])
    w = weight.detach().to(torch.float32).cpu()
    w_absmax = w.abs().amax(dim=0)
    best: tuple[float | None, torch.Tensor | None, float] = (
        None,
        None,
        layer_error(x, w, None, dynamic),
    )
    for alpha in alphas:
        s = smoothing_factors(stats.absmax, w_absmax, alpha)
        err = layer_error(x, w, s, dynamic)
        if err < best[2] and math.isfinite(err):
            best = (float(alpha), s, err)
    return best
