"""Error measures between a reference tensor and an approximation of it, and dB formatting.

torch is imported inside the tensor functions: the policy (torch-free) formats dB figures from
here without pulling torch in.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

# Elements per float64 chunk: converting a whole activation to float64 (plus its difference and
# square) costs several times its size at once, the probe's largest transient on long inputs.
CHUNK = 1 << 18


class Energies(NamedTuple):
    """Sums over all elements, in float64: ``signal = sum ref^2``, ``noise = sum (approx -
    ref)^2``, ``cross = sum ref * approx``, ``approx = sum approx^2``."""

    signal: float
    noise: float
    cross: float
    approx: float


class ExactSum:
    """A sum of floats that does not depend on the order of its terms: kept exactly (a
    :class:`~fractions.Fraction`; every finite float is one) and rounded once when read. Two
    sums of two shares of the terms :meth:`merge` into the sum of all of them, bit for bit.
    Infinite and NaN terms are summed apart, as floats (their sum is order-free too: inf, -inf
    or NaN), and dominate the result."""

    __slots__ = ("_exact", "_special")

    def __init__(self) -> None:
        self._exact = Fraction(0)
        self._special: float | None = None

    def add(self, value: float) -> None:
        """Add one term."""
        if math.isfinite(value):
            self._exact += Fraction(value)
        else:
            self._special = value if self._special is None else self._special + value

    def merge(self, other: ExactSum) -> None:
        """Add every term of ``other``."""
        self._exact += other._exact
        if other._special is not None:
            self.add(other._special)

    def __float__(self) -> float:
        exact = float(self._exact)
        return exact if self._special is None else exact + self._special

    def __getstate__(self) -> tuple[int, int, float | None]:
        return self._exact.numerator, self._exact.denominator, self._special

    def __setstate__(self, state: tuple[int, int, float | None]) -> None:
        self._exact = Fraction(state[0], state[1])
        self._special = state[2]


def energies(reference: torch.Tensor, approx: torch.Tensor, chunk: int = CHUNK) -> Energies:
    """:class:`Energies` of two same-shaped tensors, in float64 chunks of ``chunk`` elements
    (the transient memory stays a few MB whatever the tensors' size)."""
    import torch

    ref = reference.detach().reshape(-1)
    out = approx.detach().reshape(-1)
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: {tuple(reference.shape)} vs {tuple(approx.shape)}")
    sums = torch.zeros(4, dtype=torch.float64)
    for i in range(0, ref.numel(), chunk):
        r = ref[i : i + chunk].to(torch.float64)
        o = out[i : i + chunk].to(torch.float64)
        sums[0] += r.dot(r)
        d = o - r
        sums[1] += d.dot(d)
        sums[2] += r.dot(o)
        sums[3] += o.dot(o)
    s, n, c, a = sums.tolist()
    return Energies(s, n, c, a)


def noise_energy(reference: torch.Tensor, approx: torch.Tensor, chunk: int = CHUNK) -> float:
    """``sum (approx - reference)^2`` alone (:class:`Energies`' ``noise``, the same sums)."""
    import torch

    ref = reference.detach().reshape(-1)
    out = approx.detach().reshape(-1)
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: {tuple(reference.shape)} vs {tuple(approx.shape)}")
    total = 0.0
    for i in range(0, ref.numel(), chunk):
        d = out[i : i + chunk].to(torch.float64) - ref[i : i + chunk].to(torch.float64)
        total += float(d.dot(d))
    return total


def signal_energy(t: torch.Tensor, chunk: int = CHUNK) -> float:
    """``sum t^2`` (:class:`Energies`' ``signal`` of ``t``, the same sums)."""
    import torch

    flat = t.detach().reshape(-1)
    total = 0.0
    for i in range(0, flat.numel(), chunk):
        r = flat[i : i + chunk].to(torch.float64)
        total += float(r.dot(r))
    return total


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(sum ref^2 / sum (ref - approx)^2)`` in dB.

    ``inf`` when the two are equal; ``-inf`` when the reference is all zeros but they differ.
    Non-finite values in ``approx`` (fp16 overflow) give ``-inf``.
    """
    import torch

    if not bool(torch.isfinite(approx).all()):
        return -math.inf
    return sqnr_of(energies(reference, approx))


def sqnr_of(e: Energies) -> float:
    """:func:`sqnr_db` from the sums (of finite tensors): ``inf`` for no noise, ``-inf`` for
    noise on a zero reference."""
    if e.noise == 0.0:
        return math.inf
    if e.signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(e.signal / e.noise)


def cosine_of(e: Energies) -> float:
    """:func:`cosine` from the sums (of finite tensors)."""
    if e.signal == 0.0 and e.approx == 0.0:
        return 1.0
    if e.signal == 0.0 or e.approx == 0.0:
        return 0.0
    return e.cross / math.sqrt(e.signal * e.approx)


def add_energies(a: Energies, b: Energies) -> Energies:
    """The sums of two parts of the same tensors, together."""
    return Energies(a.signal + b.signal, a.noise + b.noise, a.cross + b.cross, a.approx + b.approx)


def cosine(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors (1.0 for two zero tensors, nan never)."""
    import torch

    if not bool(torch.isfinite(approx).all()):
        return -1.0
    return cosine_of(energies(reference, approx))


def fmt_db(db: float | None, *, unit: str = "dB", none: str = "inf") -> str:
    """A dB figure with one decimal, e.g. ``31.2 dB`` (``inf dB`` for None by default).

    Args:
        db: the figure; ``inf``/``-inf``/``nan`` print as such.
        unit: written after the number, separated by a space; ``""`` for table cells whose
            column header carries the unit.
        none: what None reads as. The probe and the policy write None for "no error at all",
            hence ``inf``; a table of optional figures passes ``"-"``.
    """
    text = none if db is None else f"{db:.1f}"
    return f"{text} {unit}" if unit else text


def fmt_share(share: float, width: int = 0) -> str:
    """A share as a whole percentage that never rounds to a claim it does not make: ``100%``
    only when all of it is (99.6 % prints ``>99%``), ``0%`` only when none is (``<1%``)."""
    if 0.0 < share < 0.005:
        text = "<1%"
    elif 0.995 <= share < 1.0:
        text = ">99%"
    else:
        text = f"{share:.0%}"
    return text.rjust(width)
