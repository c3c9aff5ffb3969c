"""Measured (not predicted) per-modality output error of a quantized model on held-out data.

The float model runs the held-out data once while a reservoir of each modality root's calls is
recorded with the float outputs; after quantization the same recorded calls are replayed, so
both see identical inputs (a sampling loop would otherwise drift apart after the first step).
"""

from __future__ import annotations

import torch

from opsnn_quant.core.numerics import cosine, sqnr_db
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
    of positions (``sqnr_db:<group>``)."""
    named = dict(adapter.model.named_modules())
    out = {}
    for modality in dict.fromkeys(recorded.modalities.values()):
        roots = recorded.roots_of(modality)
        if not roots:
            continue
        pairs = [
            (root, ref, replay(named[root], c, s).float())
            for root in roots
            for ref, c, s in zip(
                recorded.outputs[root], recorded.calls[root], recorded.steps_of(root), strict=True
            )
        ]
        ref_all = torch.cat([ref.reshape(-1) for _, ref, _ in pairs])
        got_all = torch.cat([got.reshape(-1) for _, _, got in pairs])
        figures = {
            "sqnr_db": sqnr_db(ref_all, got_all),
            "cosine": cosine(ref_all, got_all),
            "calls": sum(len(recorded.calls[root]) for root in roots),
        }
        figures.update(_position_sqnr(adapter, pairs))
        out[modality] = figures
    return out


def _position_sqnr(
    adapter: ModelAdapter, pairs: list[tuple[str, torch.Tensor, torch.Tensor]]
) -> dict[str, float]:
    """``sqnr_db:<group>`` over each group of positions the adapter names (dim 1 of the
    outputs), all the modality's calls together."""
    groups: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for root, ref, got in pairs:
        for name, positions in (adapter.output_positions(root) or {}).items():
            r, g = ref[:, positions].reshape(-1), got[:, positions].reshape(-1)
            if r.numel():
                groups.setdefault(name, []).append((r, g))
    return {
        f"sqnr_db:{name}": sqnr_db(torch.cat([r for r, _ in rg]), torch.cat([g for _, g in rg]))
        for name, rg in groups.items()
    }
