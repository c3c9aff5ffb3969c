"""Measured (not predicted) per-modality output error of a quantized model on held-out data.

The float model runs the held-out data once while a reservoir of each modality root's calls is
recorded with the float outputs; after quantization the same recorded calls are replayed, so
both see identical inputs (a sampling loop would otherwise drift apart after the first step).
"""

from __future__ import annotations

import math

import torch

from opsnn_quant.core.numerics import Energies, add_energies, cosine_of, energies, sqnr_of
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.recording import RecordedRoots, replay
from opsnn_quant.types import Modality


@torch.no_grad()
def measure_modalities(
    adapter: ModelAdapter, recorded: RecordedRoots
) -> dict[Modality, dict[str, float]]:
    """Replay the recorded calls on the (now quantized) model: SQNR dB and cosine per modality,
    over all the modality's roots' outputs together; with the adapter's
    :meth:`~opsnn_quant.models.base.ModelAdapter.output_positions`, also the SQNR of each group
    of positions (``sqnr_db:<group>``).

    Each call's sums are taken as it is replayed and its output dropped: no modality's outputs
    are ever held together (a Whisper decoder's logits are 8 x 66 x 51865 floats a call)."""
    named = dict(adapter.model.named_modules())
    out = {}
    for modality in dict.fromkeys(recorded.modalities.values()):
        roots = recorded.roots_of(modality)
        if not roots:
            continue
        total = Sums()
        groups: dict[str, Sums] = {}
        for root in roots:
            positions = adapter.output_positions(root) or {}
            for ref, c, s in zip(
                recorded.outputs[root], recorded.calls[root], recorded.steps_of(root), strict=True
            ):
                got = replay(named[root], c, s, recorded.batch.get(root)).float()
                total.add(ref, got)
                for name, where in positions.items():
                    r, g = ref[:, where], got[:, where]
                    if r.numel():
                        groups.setdefault(name, Sums()).add(r, g)
                del got
        figures = {
            "sqnr_db": total.sqnr_db(),
            "cosine": total.cosine(),
            "calls": sum(len(recorded.calls[root]) for root in roots),
        }
        figures.update({f"sqnr_db:{name}": sums.sqnr_db() for name, sums in groups.items()})
        out[modality] = figures
    return out


class Sums:
    """:func:`~opsnn_quant.core.numerics.sqnr_db` and :func:`~opsnn_quant.core.numerics.cosine`
    of many pairs of tensors taken together, from their running sums."""

    def __init__(self) -> None:
        self.energies = Energies(0.0, 0.0, 0.0, 0.0)
        self.finite = True

    def add(self, reference: torch.Tensor, approx: torch.Tensor) -> None:
        """Add one pair (same shape)."""
        self.finite = self.finite and bool(torch.isfinite(approx).all())
        self.energies = add_energies(self.energies, energies(reference, approx))

    def sqnr_db(self) -> float:
        """The SQNR of all pairs together (``-inf`` once an approximation is not finite)."""
        return sqnr_of(self.energies) if self.finite else -math.inf

    def cosine(self) -> float:
        """The cosine of all pairs together (``-1`` once an approximation is not finite)."""
        return cosine_of(self.energies) if self.finite else -1.0
