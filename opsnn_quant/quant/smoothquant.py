"""SmoothQuant: migrate activation outliers into the weights, per input channel.

``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``; the layer computes ``(X / s) @ (W * s)^T``, which is
the float result unchanged. The division never needs its own op on Ascend: for static activations
``1 / s`` folds into AscendQuantV2's per-channel scale vector (``x * (1 / (s_x * s_j))``), for
dynamic activations it is the ``smooth_scales`` input of DynamicQuant. So no graph surgery on the
previous LayerNorm/Linear is needed, and layers that share an input can each choose their own s.

alpha is searched per layer on a grid by the layer's output error on a small reservoir of its
input rows, simulated with the same quantization as the deployed scheme. Everything stays on the
layer's device: the statistics, the reservoir, the float reference (computed once per layer,
whatever the number of alphas) and the fake-quantized weights (fp32, a block of output rows at a
time); only the scalar errors reach the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from opsnn_quant.core.stream import CallCounter, priorities
from opsnn_quant.quant.observers import MIN_SCALE


class ChannelStats:
    """Streaming per-input-channel |x| maxima plus a fixed-size, deterministic row reservoir.

    The reservoir is a bottom-k sample (:mod:`opsnn_quant.core.stream`): row ``r`` of the call at
    position ``(batch, ordinal)`` draws its priority from ``(seed, batch, ordinal)``, and the
    ``reservoir`` rows of smallest priority are kept, in the order they came. So the kept rows
    depend on the data and its positions only, and the statistics of several shares of the data
    merge (:meth:`merge`) into those of one pass over all of it, bit for bit.

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
        self.priority = torch.zeros(0, dtype=torch.float64)  # of each kept row (on the CPU)
        self.seen = 0
        self.counter = CallCounter()

    @torch.no_grad()
    def collect(self, x: torch.Tensor, channel_absmax: torch.Tensor | None = None) -> None:
        """Add a batch (..., channels); ``channel_absmax``: its per-channel absmax (fp32), when
        the caller computed it already."""
        rows = x.detach().reshape(-1, self.channels).to(torch.float32)
        if self.absmax.device != rows.device:
            self.absmax = self.absmax.to(rows.device)
        if channel_absmax is None:
            channel_absmax = rows.abs().amax(dim=0)
        self.absmax = torch.maximum(self.absmax, channel_absmax)
        drawn = priorities(self.seed, self.counter.next(), rows.shape[0])
        self.seen += rows.shape[0]
        self._keep(rows, drawn)

    @torch.no_grad()
    def merge(self, other: ChannelStats) -> None:
        """Add the statistics ``other`` gathered on the data that follows this one's."""
        self.absmax = torch.maximum(self.absmax, other.absmax.to(self.absmax.device))
        self.seen += other.seen
        if other.rows is not None:
            self._keep(other.rows.to(self.absmax.device), other.priority)

    def _keep(self, rows: torch.Tensor, drawn: torch.Tensor) -> None:
        """Keep the ``capacity`` smallest priorities of the kept rows followed by ``rows``
        (ties: the earlier row), in their order."""
        if self.rows is not None and self.rows.shape[0] >= self.capacity:
            # Only rows below the largest kept priority can enter: usually a handful.
            pick = torch.nonzero(drawn < self.priority.max()).flatten()
            rows, drawn = rows[pick.to(rows.device)], drawn[pick]
        if rows.shape[0] == 0:
            return
        both = rows if self.rows is None else torch.cat([self.rows, rows])
        drawn = drawn if self.rows is None else torch.cat([self.priority, drawn])
        if drawn.numel() > self.capacity:
            smallest = torch.sort(drawn, stable=True).indices[: self.capacity]
            keep = torch.sort(smallest).values
            both, drawn = both[keep.to(both.device)], drawn[keep]
        self.rows = both.clone() if both.data_ptr() == rows.data_ptr() else both
        self.priority = drawn


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


# Output rows of the weight fake-quantized at once in the alpha search: the transient is a block
# of the weight in fp32, not a float64 copy of all of it per alpha.
WEIGHT_BLOCK_ELEMENTS = 1 << 22


@torch.no_grad()
def _energy(t: torch.Tensor) -> float:
    """``sum t^2``: fp32 sums per row (pairwise inside torch), rows added in float64."""
    return float(t.pow(2).sum(dim=-1).double().sum())


@torch.no_grad()
def layer_error(
    x: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor | None,
    dynamic: bool,
    ref: torch.Tensor | None = None,
) -> float:
    """Relative squared output error of a smoothed, W8A8-quantized ``x @ w.T`` against float.

    The simulated quantization and the products run in fp32, as the device computes; the error
    sums are compensated (per-row fp32 sums added in float64) so that the comparison between
    candidates is stable.

    Args:
        x: (M, K) input rows.
        w: (N, K) float weight.
        s: SmoothQuant factors (K,), or None.
        dynamic: per-token (True) or per-tensor static activations.
        ref: ``x @ w.T`` in fp32, when the caller computed it already (it does not depend on s).
    """
    return layer_errors(x, w, s, (dynamic,), ref)[0]


@torch.no_grad()
def layer_errors(
    x: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor | None,
    modes: Sequence[bool],
    ref: torch.Tensor | None = None,
) -> list[float]:
    """:func:`layer_error` for each activation mode of ``modes`` (True: dynamic), the smoothed
    weight fake-quantized once for all of them (the same numbers as one call per mode)."""
    ref = x @ w.T if ref is None else ref
    xqs = [fake_quant_activation(x if s is None else x / s, dynamic) for dynamic in modes]
    noise = [0.0] * len(xqs)
    step = max(1, WEIGHT_BLOCK_ELEMENTS // max(w.shape[1], 1))
    for n0 in range(0, w.shape[0], step):
        block = w[n0 : n0 + step] if s is None else w[n0 : n0 + step] * s
        wq_t = fake_quant_weight(block).T
        for i, xq in enumerate(xqs):
            noise[i] += _energy(xq @ wq_t - ref[:, n0 : n0 + step])
    signal = max(_energy(ref), 1e-300)
    return [_sig(n / signal) for n in noise]


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
        weight: (N, K) float weight (on the layer's device; not copied when already fp32).
        dynamic: per-token (True) or per-tensor static (False) activation quantization.
        alphas: candidates; "no smoothing" is always a candidate too.

    Returns:
        ``(alpha, s, error)``: alpha None and s None when smoothing does not help.
    """
    return search_alphas(stats, weight, (dynamic,), alphas)[0]


@torch.no_grad()
def search_alphas(
    stats: ChannelStats,
    weight: torch.Tensor,
    modes: Sequence[bool],
    alphas: Sequence[float],
) -> list[tuple[float | None, torch.Tensor | None, float]]:
    """:func:`search_alpha` for each activation mode of ``modes`` (True: dynamic) at once: the
    float reference and each alpha's fake-quantized weight are computed once for all modes, and
    each mode's choice is the one its own search would make."""
    w = weight.detach().to(torch.float32)
    x = stats.rows if stats.rows is not None else w.new_zeros(1, w.shape[1])
    x = x.to(w.device)
    ref = x @ w.T  # the float reference, once for every alpha
    w_absmax = w.abs().amax(dim=0)
    act_absmax = stats.absmax.to(w.device)
    factors = [smoothing_factors(act_absmax, w_absmax, alpha) for alpha in alphas]
    if (len(factors) + 1) * max(w.numel(), x.numel()) <= WEIGHT_BLOCK_ELEMENTS:
        errors = _stacked_errors(x, w, factors, modes, ref)
    else:
        errors = [layer_errors(x, w, s, modes, ref) for s in (None, *factors)]
    best: list[tuple[float | None, torch.Tensor | None, float]] = [
        (None, None, err) for err in errors[0]
    ]
    for alpha, s, errs in zip(alphas, factors, errors[1:], strict=True):
        for i, err in enumerate(errs):
            if err < best[i][2] and math.isfinite(err):
                best[i] = (float(alpha), s, err)
    return best


@torch.no_grad()
def _stacked_errors(
    x: torch.Tensor,
    w: torch.Tensor,
    factors: list[torch.Tensor],
    modes: Sequence[bool],
    ref: torch.Tensor,
) -> list[list[float]]:
    """:func:`layer_errors` of no smoothing and of each of ``factors``, as one batch (a small
    layer: per-call overhead, not arithmetic, is its search's cost). The same fp32 steps per
    candidate; the batched matmul may round its last bits otherwise, which the significant
    digits compared (``_sig``) absorb."""
    s = torch.stack([torch.ones_like(factors[0]), *factors])  # (A, K); x / 1 is x exactly
    xs = x.unsqueeze(0) / s.unsqueeze(1)  # (A, M, K)
    wq_t = _fake_quant_weights(w.unsqueeze(0) * s.unsqueeze(1)).transpose(1, 2)  # (A, K, N)
    signal = max(_energy(ref), 1e-300)
    by_mode = []
    for dynamic in modes:
        if dynamic:
            scale = (xs.abs().amax(dim=2, keepdim=True) / 127.0).clamp_min(1e-12)
        else:
            scale = (xs.abs().amax(dim=(1, 2), keepdim=True) / 127.0).clamp_min(MIN_SCALE)
        xq = torch.round(xs / scale).clamp(-128, 127) * scale
        noise = (torch.bmm(xq, wq_t) - ref).pow(2).sum(dim=-1).double().sum(dim=-1)
        by_mode.append([_sig(float(n) / signal) for n in noise])
    return [list(errs) for errs in zip(*by_mode, strict=True)]


def _fake_quant_weights(w: torch.Tensor) -> torch.Tensor:
    """:func:`fake_quant_weight` of each (N, K) weight of a stack (A, N, K)."""
    s = (w.abs().amax(dim=2, keepdim=True) / 127.0).clamp_min(1e-12)
    return torch.round(w / s).clamp(-128, 127) * s
