"""Measured (not predicted) per-modality output error of a quantized model on held-out data.

The float model runs the held-out data once while a reservoir of each modality root's calls is
recorded with the float outputs; after quantization the same recorded calls are replayed, so
both see identical inputs (a sampling loop would otherwise drift apart after the first step).
"""

from __future__ import annotations

import torch

from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.numerics import cosine, sqnr_db
from opsnn_quant.recording import RecordedRoots, replay
from opsnn_quant.types import Modality


@torch.no_grad()
def measure_modalities(
    adapter: ModelAdapter, recorded: RecordedRoots
) -> dict[Modality, dict[str, float]]:
    """Replay the recorded calls on the (now quantized) model: SQNR dB and cosine per modality,
    over all the modality's roots' outputs together."""
    named = dict(adapter.model.named_modules())
    out = {}
    for modality in dict.fromkeys(recorded.modalities.values()):
        roots = recorded.roots_of(modality)
        if not roots:
            continue
        refs = [r.reshape(-1) for root in roots for r in recorded.outputs[root]]
        got = [
            replay(named[root], c, s).float().reshape(-1)
            for root in roots
            for c, s in zip(recorded.calls[root], recorded.steps_of(root), strict=True)
        ]
        ref_all, got_all = torch.cat(refs), torch.cat(got)
        out[modality] = {
            "sqnr_db": sqnr_db(ref_all, got_all),
            "cosine": cosine(ref_all, got_all),
            "calls": sum(len(recorded.calls[root]) for root in roots),
        }
    return out
