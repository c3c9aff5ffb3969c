"""The accumulated output error of one candidate scheme on one module (probe pass 2)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from opsnn_quant.core.numerics import CHUNK
from opsnn_quant.probe.report import BF16_MAX, SchemeError


@dataclass
class SchemeEnergy:
    """One candidate scheme's output error on one module, summed over the calls measured:
    signal, noise and cross energies (float64), per output channel noise, and the calls whose
    int8 output overflowed its output dtype (the candidate is then infeasible)."""

    signal: float = 0.0
    noise: float = 0.0
    cross: float = 0.0
    approx: float = 0.0
    channel_noise: torch.Tensor | None = None  # float64 sum of squared error per output channel
    channel_count: int = 0  # elements per channel summed so far
    nonfinite: int = 0  # candidate outputs that were inf/nan (output dtype overflowed)
    ref_absmax: float = 0.0  # largest |float output| seen on calls with a non-finite candidate

    def add(self, ref: torch.Tensor, out: torch.Tensor, channel_dim: int) -> None:
        """Add one measured call: the float output ``ref`` and the candidate's ``out``, output
        channels along ``channel_dim`` (-1 for a Linear, 1 for a Conv2d).

        One float64 sweep gives the four energies and the per-channel noise together (blocks
        of rows, or one sample of a feature map at a time, so the copies stay a few MB)."""
        o, r = out.detach(), ref.detach()
        d = channel_dim % r.dim()
        signal = cross = approx = 0.0  # Python floats: the same float64 additions, fewer ops
        sq: torch.Tensor | None = None
        for rb, ob, dims in _blocks(r, o, d):
            # float64 dot products (no squared copies) for the three sums; one difference,
            # squared in place, for the per-channel noise.
            r64, o64 = rb.double(), ob.to(torch.float64, copy=True)  # o64: changed in place
            rf, of = r64.reshape(-1), o64.reshape(-1)
            signal += float(rf.dot(rf))
            cross += float(rf.dot(of))
            approx += float(of.dot(of))
            part = o64.sub_(r64).square_().sum(dim=dims)
            sq = part if sq is None else sq.add_(part)
        channels = r.shape[d]
        if sq is None:  # no rows
            sq = torch.zeros(channels, dtype=torch.float64)
        noise = float(sq.sum())
        if not math.isfinite(approx):  # an inf/nan in the candidate's output (fp16 squares fit)
            # The int8 matmul's output dtype (fp16) cannot hold this module's output: the
            # candidate is infeasible here, and its error is not a number to add up.
            self.nonfinite += int((~torch.isfinite(o)).sum())
            self.ref_absmax = max(self.ref_absmax, float(r.abs().max()))
            return
        self.signal += signal
        self.noise += noise
        self.cross += cross
        self.approx += approx
        self.channel_noise = sq if self.channel_noise is None else self.channel_noise + sq
        self.channel_count += r.numel() // max(channels, 1)

    def channel_power(self) -> torch.Tensor | None:
        """Mean squared error per element of each output channel."""
        if self.channel_noise is None or self.channel_count == 0:
            return None
        return self.channel_noise / self.channel_count

    def result(self, alpha: float | None, output_dtype: str) -> SchemeError:
        """The report's :class:`SchemeError` (with the SmoothQuant ``alpha`` the candidate used;
        ``output_dtype`` names what overflowed when it is infeasible)."""
        if self.nonfinite:
            return SchemeError(
                sqnr_db=None,
                cosine=0.0,
                smoothquant_alpha=alpha,
                infeasible=(
                    f"{self.nonfinite} inf/nan outputs: the {output_dtype} output of the int8 "
                    f"matmul overflows (float output absmax {self.ref_absmax:.3g} > 65504)"
                ),
                fits_output_dtype="bfloat16" if self.ref_absmax < BF16_MAX else None,
            )
        if self.noise == 0.0:
            sqnr = math.inf
        elif self.signal == 0.0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(self.signal / self.noise)
        denom = math.sqrt(self.signal * self.approx)
        cos = self.cross / denom if denom > 0 else (1.0 if self.noise == 0 else 0.0)
        return SchemeError(sqnr_db=sqnr, cosine=cos, smoothquant_alpha=alpha)


def _blocks(
    r: torch.Tensor, o: torch.Tensor, d: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[int]]]:
    """``(ref block, out block, dims to sum for per-channel sums)`` over ``r``/``o`` with
    channels along ``d``: blocks of about :data:`CHUNK` elements of rows when channels are
    last (a Linear), of whole samples otherwise (a Conv2d's ``(B, C, ...)``: as many samples
    as fit, one at least; one at a time made a small feature map's sums a loop of tiny ops)."""
    channels = r.shape[d]
    if d == r.dim() - 1:
        r2, o2 = r.reshape(-1, channels), o.reshape(-1, channels)
        step = max(1, CHUNK // max(channels, 1))
        for i in range(0, r2.shape[0], step):
            yield r2[i : i + step], o2[i : i + step], [0]
    else:
        dims = [k for k in range(r.dim()) if k != d]
        step = max(1, CHUNK // max(r[0].numel(), 1))
        for i in range(0, r.shape[0], step):
            yield r[i : i + step], o[i : i + step], dims
