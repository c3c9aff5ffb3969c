"""Where a forward loop is in its data, and the seeded choices keyed by that place.

Every sampled statistic of a calibration pass (which calls a reservoir keeps, which rows, which
calls are re-run in fp16) is a function of the *position* of a call in the data, not of how many
calls this process has seen: the batch index the loop sets (:func:`at_batch`; the adapters'
forward loops set it, counting from their first batch, which a rank's share of the data starts
at) and the call's ordinal within that batch. So a rank running batches 4-7 of the data keeps
exactly what one process running batches 0-7 keeps of batches 4-7, and statistics gathered on
several ranks merge into those of one process (:mod:`opsnn_quant.probe.merge`).

Outside a loop that sets the batch (a user's own ``forward_loop``) the whole run is batch 0.

Reservoirs here are bottom-k samples: each item draws a priority from a generator seeded by
``(seed, position)`` and the k smallest priorities are kept: a uniform sample without
replacement, whatever order or split the items arrive in (ties broken by position).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_BATCH: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "opsnn_quant_batch", default=None
)

Position = tuple[int, int]  # (batch index, call ordinal within the batch, 1-based)


def current_batch() -> int | None:
    """The data batch the forward loop is at (0 = the data's first), or None outside one."""
    return _BATCH.get()


@contextlib.contextmanager
def at_batch(index: int) -> Iterator[None]:
    """Run the block as batch ``index`` of the data (restored afterwards)."""
    token = _BATCH.set(index)
    try:
        yield
    finally:
        _BATCH.reset(token)


@dataclass
class CallCounter:
    """The :data:`Position` of each call one accumulator sees (``ordinal`` restarts at 1 in
    every batch)."""

    batch: int = -1
    ordinal: int = 0

    def next(self) -> Position:
        """The position of the call now offered."""
        batch = current_batch() or 0
        if batch != self.batch:
            self.batch, self.ordinal = batch, 0
        self.ordinal += 1
        return batch, self.ordinal


def _key(seed: int, position: tuple[int, ...]) -> int:
    """A 63-bit generator seed from ``seed`` and ``position`` (platform independent)."""
    data = struct.pack(f"<{1 + len(position)}q", seed, *position)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def priority(seed: int, position: tuple[int, ...]) -> float:
    """A uniform draw in [0, 1) for the item at ``position`` (53 bits)."""
    return (_key(seed, position) >> 10) / float(1 << 53)


def priorities(seed: int, position: tuple[int, ...], count: int) -> torch.Tensor:
    """``count`` uniform float64 draws in [0, 1) for the items ``0..count-1`` at ``position``
    (e.g. the rows of one call), on the CPU."""
    gen = torch.Generator().manual_seed(_key(seed, position))
    return torch.rand(count, dtype=torch.float64, generator=gen)
