"""measure_modalities: the SQNR of each group of output positions an adapter names."""

from __future__ import annotations

import math

import torch

from opsnn_quant.probe.measure import measure_modalities
from opsnn_quant.recording import RecordedRoots
from opsnn_quant.types import Modality


class _Offset(torch.nn.Module):
    """Adds ``delta[t]`` at position t of a (B, T, D) input: a known error per position."""

    def __init__(self, delta: list[float]) -> None:
        super().__init__()
        self.delta = torch.tensor(delta).view(1, -1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.delta


class _Adapter:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def output_positions(self, root: str) -> dict[str, slice] | None:
        return {"first": slice(1, 2), "later": slice(2, None)}


def test_each_group_of_positions_gets_its_own_sqnr():
    # Reference: ones (B=2, T=4, D=3). The replayed model adds 0, 0.1, 0.01, 0.01 per position:
    # overall noise 2*3*(0.01 + 1e-4 + 1e-4) over 24 ones; "first" (t=1) 10 log10(1/0.01) = 20 dB;
    # "later" (t=2, 3) 10 log10(1/1e-4) = 40 dB.
    x = torch.ones(2, 4, 3)
    model = torch.nn.Sequential()
    model.add_module("root", _Offset([0.0, 0.1, 0.01, 0.01]))
    recorded = RecordedRoots(
        modalities={"root": Modality.TEXT_DECODER},
        calls={"root": [((x,), {})]},
        outputs={"root": [x.clone()]},
    )
    got = measure_modalities(_Adapter(model), recorded)[Modality.TEXT_DECODER]  # type: ignore[arg-type]
    assert math.isclose(got["sqnr_db:first"], 20.0, abs_tol=1e-4)
    assert math.isclose(got["sqnr_db:later"], 40.0, abs_tol=1e-3)
    overall = 10 * math.log10(24 / (6 * (0.01 + 2e-4)))
    assert math.isclose(got["sqnr_db"], overall, abs_tol=1e-3)


class _Counting(torch.nn.Module):
    """x * 2 (exact in any batch), counting the samples of each call it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(x.shape[0])
        return x * 2


def test_calls_replay_in_the_roots_chunks_and_sum_over_every_call():
    # Two recorded calls of 4 and 2 samples, the root's chunks of 1 sample (Whisper's encoder:
    # estimator_batch {audio_encoder: 1}); reference x, replay 2x: noise = signal, 0 dB, cosine 1
    # over both calls together, summed call by call.
    a, b = torch.arange(8.0).view(4, 2), -torch.ones(2, 2)
    model = torch.nn.Sequential()
    model.add_module("root", _Counting())
    recorded = RecordedRoots(
        modalities={"root": Modality.AUDIO_ENCODER},
        calls={"root": [((a,), {}), ((b,), {})]},
        outputs={"root": [a.clone(), b.clone()]},
        batch={"root": 1},
    )
    adapter = _Adapter(model)
    adapter.output_positions = lambda root: None  # type: ignore[method-assign]
    got = measure_modalities(adapter, recorded)[Modality.AUDIO_ENCODER]  # type: ignore[arg-type]
    assert model.root.batches == [1, 1, 1, 1, 1, 1]  # six samples, one at a time
    assert math.isclose(got["sqnr_db"], 0.0, abs_tol=1e-12)
    # cosine of (x, 2x) is 1 whatever x: sum x.2x / sqrt(sum x^2 * sum 4x^2)
    assert math.isclose(got["cosine"], 1.0, abs_tol=1e-12) and got["calls"] == 2
    recorded.batch.clear()  # whole calls: the same figures, two calls of 4 and 2
    model.root.batches.clear()
    again = measure_modalities(adapter, recorded)[Modality.AUDIO_ENCODER]  # type: ignore[arg-type]
    assert model.root.batches == [4, 2] and again == got
    recorded.outputs["root"][1] = b * 3  # the second call's reference: replay 2b vs 3b
    noise = float((a**2).sum() + (b**2).sum())  # (2a - a)^2 + (2b - 3b)^2
    signal = float((a**2).sum() + (9 * b**2).sum())
    mixed = measure_modalities(adapter, recorded)[Modality.AUDIO_ENCODER]  # type: ignore[arg-type]
    assert math.isclose(mixed["sqnr_db"], 10 * math.log10(signal / noise), abs_tol=1e-9)
