"""Argument checks shared by the reference operators: one-line :class:`ShapeError` messages."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from opsnn_quant.errors import ShapeError


def require_dtype(name: str, t: torch.Tensor, allowed: Iterable[torch.dtype], op: str) -> None:
    """Raise unless ``t.dtype`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        got = str(t.dtype).replace("torch.", "")
        raise ShapeError(f"{op}: {name} must be {names}, got {got}")


def require_vector(name: str, t: torch.Tensor, sizes: Iterable[int], op: str) -> None:
    """Raise unless ``t`` holds one value per channel (1-D or (1, n)) with ``numel`` in ``sizes``."""
    sizes = tuple(sorted(set(sizes)))
    if t.dim() > 2 or (t.dim() == 2 and t.shape[0] != 1) or t.numel() not in sizes:
        raise ShapeError(
            f"{op}: {name} must be 1-D with {' or '.join(map(str, sizes))} elements, "
            f"got shape {tuple(t.shape)}"
        )
