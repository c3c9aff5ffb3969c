"""Small pass-2 calls of one module kept to be measured together (see ``LocalProbe.measure``).

A candidate run on 4 rows costs what one on 512 rows costs in per-call overhead: a decoder's
per-token calls, a DiT's few tokens and a low-resolution feature map are measured in batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PENDING_ROWS = 512  # a measured call of fewer rows waits to be measured with others, in batches
PENDING_BYTES = 128 << 20  # ... of about this many rows, or of this many bytes of input + output


@dataclass
class PendingBatch:
    """Small measured calls of one module, waiting to run as one batch."""

    step: int | None  # the clock while the batch runs: its first call's step
    xs: list[torch.Tensor] = field(default_factory=list)
    ys: list[torch.Tensor] = field(default_factory=list)
    elements: int = 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Keep a copy of one call's input and float output (the model may reuse its buffers)."""
        self.xs.append(x.detach().clone())
        self.ys.append(y.detach().clone())
        self.elements += x.numel() + y.numel()

    def full(self, channels: int) -> bool:
        """Whether the batch holds :data:`PENDING_ROWS` input rows or :data:`PENDING_BYTES`."""
        if not self.xs:
            return False
        rows = sum(x.numel() for x in self.xs) // max(channels, 1)
        size = self.elements * self.xs[0].element_size()
        return rows >= PENDING_ROWS or size >= PENDING_BYTES

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept inputs and outputs, joined along the leading dim."""
        return torch.cat(self.xs), torch.cat(self.ys)
