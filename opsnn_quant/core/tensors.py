"""Reading tensors out of module inputs and outputs (plain tensors, tuples, dicts, ModelOutputs)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first floating tensor in a module's input/output structure (ModelOutput included)."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if hasattr(value, "to_tuple") and not isinstance(value, tuple):  # transformers ModelOutput
        for key in ("sample", "logits", "last_hidden_state"):
            t = getattr(value, key, None)
            if isinstance(t, torch.Tensor):
                return t
        value = value.to_tuple()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        for v in value:
            t = first_tensor(v)
            if t is not None:
                return t
    return None
