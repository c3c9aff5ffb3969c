"""The engine table (opsnn_quant/quant/engines.py): one entry per engine, read by the specs,
the quantized modules and the targets; an engine added from outside the package is one
registration."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.targets import TARGETS
from opsnn_quant.quant import engines
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.engines import ENGINES, OPSNN, get_engine, register_engine
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision

INT8 = [p for p in Precision if p.is_int8 and not p.is_attention]  # a8: test_attention.py


@pytest.mark.parametrize(
    ("engine", "runs"),
    [
        ("opsnn", {"w8a8", "w8a8_dynamic", "w8a16", "w4a16"}),
        # mindiesd quantize.py: W8A8, W8A8_DYNAMIC, W8A16 Linear; vllm-ascend: the same schemes
        ("mindie-sd", {"w8a8", "w8a8_dynamic", "w8a16"}),
        ("vllm-ascend", {"w8a8", "w8a8_dynamic", "w8a16"}),
    ],
)
def test_a_spec_is_made_for_an_engine_exactly_where_its_linear_runs_the_precision(engine, runs):
    for p in INT8:
        if p.value in runs:
            assert QuantSpec(p, engine=engine).engine_def is ENGINES[engine]
        else:
            with pytest.raises(ConfigError, match=f"{engine} has no {p.value} Linear"):
                QuantSpec(p, engine=engine)


def test_per_step_scales_and_their_smoothing_follow_the_engine():
    steps = {"timestep_bounds": (0, 2)}
    assert QuantSpec(Precision.W8A8, engine="mindie-sd", **steps).timestep_bounds == (0, 2)
    assert QuantSpec(Precision.W8A8, smoothquant_alpha=0.5, **steps).smoothquant  # ours: both
    with pytest.raises(ConfigError, match="no per-step scales"):
        QuantSpec(Precision.W8A8, engine="vllm-ascend", **steps)
    with pytest.raises(ConfigError, match="takes no SmoothQuant"):
        QuantSpec(Precision.W8A8, engine="mindie-sd", smoothquant_alpha=0.5, **steps)


def test_every_target_names_an_engine_of_the_table():
    assert {t.engine_def.name for t in TARGETS.values()} == set(ENGINES)
    with pytest.raises(ConfigError, match="unknown engine 'tensorrt'; choose one of"):
        get_engine("tensorrt")


# ---- an engine added from outside the package -------------------------------------------------


def _power_of_two_scale(scale: float, dtype: torch.dtype) -> tuple[float, float]:
    """A toy engine that keeps its static activation scale as the power of two at or above the
    calibrated one (stored and applied)."""
    p2 = 2.0 ** math.ceil(math.log2(scale))
    return p2, p2


TOY = dataclasses.replace(
    OPSNN, name="toy-pow2", description="a toy engine: power-of-two activation scales",
    linear=frozenset({Precision.W8A8}), conv=False,
    input_scale=f"{__name__}:_power_of_two_scale",
)  # fmt: skip


@pytest.fixture
def toy_engine():
    register_engine(TOY)
    try:
        yield TOY
    finally:
        del ENGINES[TOY.name]


def test_an_engine_registered_from_outside_the_package_is_what_its_modules_compute(toy_engine):
    with pytest.raises(ConfigError, match="registered already"):
        register_engine(toy_engine)
    with pytest.raises(ConfigError, match="toy-pow2 has no w8a8_dynamic Linear"):
        QuantSpec(Precision.W8A8_DYNAMIC, engine="toy-pow2")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8))
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(4, 16, generator=g) * 3 for _ in range(2)]

    def loop(m: nn.Module) -> None:
        for x in data:
            m(x)

    quantize(model, {"0": QuantSpec(Precision.W8A8, engine="toy-pow2")}, loop)
    q = model[0]
    # the calibrated (symmetric minmax) scale, and the power of two the toy engine keeps
    calibrated = float(torch.cat(data).abs().max()) / 127
    want = 2.0 ** math.ceil(math.log2(calibrated))
    assert float(q.input_quantizer.scale) == want
    # deq_scale is made from the scale the engine applies
    w_scale = q.weight_quantizer.scale.to(torch.float64)
    assert torch.equal(q.deq_scale, (want * w_scale).to(torch.float32))
    with pytest.raises(ConfigError, match="Linear layers only"):
        quantize(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)),
                 {"0": QuantSpec(Precision.W8A8, engine="toy-pow2")},
                 lambda m: m(torch.randn(1, 3, 8, 8)))  # fmt: skip
    assert engines.get_engine("toy-pow2") is toy_engine
