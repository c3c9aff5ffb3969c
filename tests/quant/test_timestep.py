"""w8a8 with static activation scales per group of denoising steps (``w8a8_timestep``)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from opsnn_quant.core.timesteps import at_step, group_of
from opsnn_quant.errors import CalibrationError, ConfigError
from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision

BOUNDS = (0, 2)


def _batches() -> list[tuple[int, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(step, torch.randn(6, 32, generator=g) * scale)
            for step, scale in enumerate((20.0, 15.0, 2.0, 1.0))]  # fmt: skip


def _lin() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 16))


def test_group_of_steps():
    assert [group_of(s, (0, 4, 8)) for s in (0, 3, 4, 7, 8, 50)] == [0, 0, 1, 1, 2, 2]


def test_each_group_is_exactly_a_static_w8a8_calibrated_on_its_own_steps():
    # The per-step module at step s computes what a plain static w8a8 module calibrated only on
    # the calls of s's group computes: same scales, same AscendQuantV2 / QuantBatchMatmul bits.
    batches = _batches()

    def loop(m: nn.Module) -> None:
        for step, x in batches:
            with at_step(step):
                m(x)

    grouped = quantize(_lin(), {"0": QuantSpec(Precision.W8A8, timestep_bounds=BOUNDS)}, loop)
    iq = grouped[0].input_quantizer
    assert tuple(iq.scale.shape) == (2,) and tuple(grouped[0].deq_scale.shape) == (2, 16)
    for group, members in ((0, batches[:2]), (1, batches[2:])):

        def only(m: nn.Module, members=members) -> None:
            for _, x in members:
                m(x)

        plain = quantize(_lin(), {"0": "w8a8"}, only)
        want_scale = max(float(x.abs().max()) for _, x in members) / 127.0
        assert float(iq.scale[group]) == pytest.approx(want_scale, rel=1e-6)
        for step, x in members:
            with at_step(step):
                assert torch.equal(grouped(x), plain(x))


def test_outside_a_sampling_loop_it_says_so(tmp_path):
    with pytest.raises(CalibrationError, match="outside a sampling loop"):
        quantize(_lin(), {"0": QuantSpec(Precision.W8A8, timestep_bounds=BOUNDS)},
                 lambda m: m(torch.randn(2, 32)))  # fmt: skip


def test_a_group_no_step_reached_is_named():
    def early(m: nn.Module) -> None:
        with at_step(0):
            m(torch.randn(2, 32))

    with pytest.raises(CalibrationError, match="step group 1 \\(from step 2\\)"):
        quantize(_lin(), {"0": QuantSpec(Precision.W8A8, timestep_bounds=BOUNDS)}, early)


def test_the_scale_table_round_trips_and_is_described(tmp_path):
    batches = _batches()

    def loop(m: nn.Module) -> None:
        for step, x in batches:
            with at_step(step):
                m(x)

    q = quantize(_lin(), {"0": QuantSpec(Precision.W8A8, timestep_bounds=BOUNDS)}, loop)
    save_quantized(q, tmp_path / "ckpt")
    desc = json.loads((tmp_path / "ckpt" / "description.json").read_text())["modules"]["0"]
    assert desc["timestep_bounds"] == [0, 2] and len(desc["input_scale"]) == 2
    assert desc["spec"]["timestep_bounds"] == [0, 2]
    back = load_quantized(_lin(), tmp_path / "ckpt")
    for step, x in batches:
        with at_step(step):
            assert torch.equal(back(x), q(x))


def test_spec_checks():
    with pytest.raises(ConfigError, match="w8a8 only"):
        QuantSpec(Precision.W8A8_DYNAMIC, timestep_bounds=(0, 4))
    with pytest.raises(ConfigError, match="start at 0 and ascend"):
        QuantSpec(Precision.W8A8, timestep_bounds=(0, 4, 4))
    with pytest.raises(ConfigError, match="per-step activation scales are for Linear"):
        quantize(
            nn.Sequential(nn.Conv2d(2, 2, 1)),
            {"0": QuantSpec(Precision.W8A8, timestep_bounds=(0,))},
            None,
        )
