"""Measured (not predicted) per-modality output error of a quantized model on held-out data.

The float model runs the held-out data once while a reservoir of each modality root's calls is
recorded with the float outputs; after quantization the same recorded calls are replayed, so
both see identical inputs (a sampling loop would otherwise drift apart after the first step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.numerics import cosine, sqnr_db
from opsnn_quant.probe.recording import RootRecorder, replay
from opsnn_quant.types import ForwardLoop, Modality


@dataclass
class RecordedRoots:
    """Recorded root calls and their float outputs, per modality."""

    calls: dict[Modality, list[tuple[tuple, dict]]]
    outputs: dict[Modality, list[torch.Tensor]]


@torch.no_grad()
def record_roots(
    adapter: ModelAdapter, loop: ForwardLoop, max_calls: int = 8, seed: int = 1
) -> RecordedRoots:
    """Run ``loop`` on the float model, recording up to ``max_calls`` calls per modality root."""
    named = dict(adapter.model.named_modules())
    roots = {m: r for m, r in adapter.roots().items() if r in named}
    recorders = {
        m: RootRecorder(r, max_calls, seed, adapter.record_filter(r)) for m, r in roots.items()
    }
    handles = [
        named[roots[m]].register_forward_pre_hook(
            lambda mod, a, k, rec=rec: rec.offer(a, k), with_kwargs=True
        )
        for m, rec in recorders.items()
    ]
    try:
        loop(adapter.model)
    finally:
        for h in handles:
            h.remove()
    calls = {m: rec.calls for m, rec in recorders.items() if rec.calls}
    outputs = {m: [replay(named[roots[m]], c).float() for c in cs] for m, cs in calls.items()}
    return RecordedRoots(calls, outputs)


@torch.no_grad()
def measure_modalities(
    adapter: ModelAdapter, recorded: RecordedRoots
) -> dict[Modality, dict[str, float]]:
    """Replay the recorded calls on the (now quantized) model: SQNR dB and cosine per modality."""
    named = dict(adapter.model.named_modules())
    roots = adapter.roots()
    out = {}
    for modality, calls in recorded.calls.items():
        root = named[roots[modality]]
        refs = recorded.outputs[modality]
        got = [replay(root, c).float() for c in calls]
        ref_all = torch.cat([r.reshape(-1) for r in refs])
        got_all = torch.cat([g.reshape(-1) for g in got])
        out[modality] = {
            "sqnr_db": sqnr_db(ref_all, got_all),
            "cosine": cosine(ref_all, got_all),
            "calls": len(calls),
        }
    return out
