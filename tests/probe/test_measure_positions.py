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
