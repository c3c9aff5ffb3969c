"""The probe on an offloaded model (``--max-memory``): the exhaustive reference (one module
swapped at a time through the whole model) is refused before pass 1; the estimators run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.offload import BlockOffload
from opsnn_quant.probe.api import ProbeConfig, check_offloaded_estimators, run_probe


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        (ProbeConfig(), False),  # the structured estimator (the default)
        (ProbeConfig(estimator="diagonal"), False),
        (ProbeConfig(exhaustive=True), True),
        (ProbeConfig(estimator="diagonal", exhaustive=True), True),
        (ProbeConfig(attribution=False, exhaustive=True), False),  # no estimator at all
    ],
)
def test_which_estimators_run_offloaded(config, refused):
    if refused:
        with pytest.raises(ConfigError, match=r"--max-memory: .*exhaustive reference"):
            check_offloaded_estimators(config)
    else:
        check_offloaded_estimators(config)


def test_a_probe_of_an_offloaded_model_refuses_the_exhaustive_reference_before_pass_one(
    tmp_path,
):
    net = _Net().eval()
    off = BlockOffload(net, budget=1, directory=tmp_path)
    assert off.offloaded == ["blocks.0", "blocks.1"]

    def loop(model: nn.Module) -> None:
        pytest.fail("pass 1 ran")

    with pytest.raises(ConfigError, match="exhaustive reference"):
        run_probe(net, loop, ProbeConfig(exhaustive=True))
    off.release()
