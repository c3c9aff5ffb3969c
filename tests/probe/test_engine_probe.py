"""The probe measures a target's engine arithmetic (ProbeConfig.engine): a candidate's local
error is the error of the module quantize() makes for that engine, on the same data."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from opsnn_quant.probe.api import ProbeConfig, run_probe
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(32, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


BATCHES = [torch.randn(16, 32, generator=torch.Generator().manual_seed(i)) * 3 for i in range(3)]


def _loop(model: nn.Module) -> None:
    for x in BATCHES:
        model(x)


def _sqnr(model: nn.Module, quantized: nn.Module) -> float:
    with torch.no_grad():
        y = torch.cat([model(x) for x in BATCHES]).double()
        e = torch.cat([quantized(x) for x in BATCHES]).double() - y
    return 10 * math.log10(float((y * y).sum() / (e * e).sum()))


@pytest.mark.parametrize(
    ("engine", "dtype", "precision"),
    [
        ("opsnn", "float16", Precision.W8A8),
        ("mindie-sd", "bfloat16", Precision.W8A8),
        ("mindie-sd", "bfloat16", Precision.W8A8_DYNAMIC),
        ("vllm-ascend", "bfloat16", Precision.W8A8),
    ],
)
def test_the_probes_local_error_is_the_engine_modules(engine, dtype, precision):
    model = Net()
    scheme = "w8a8" if precision == Precision.W8A8 else "w8a8_dynamic"
    cfg = ProbeConfig(fp16=False, attribution=False, schemes=(scheme,), engine=engine,
                      engine_dtype=None if engine == "opsnn" else dtype)  # fmt: skip
    report = run_probe(model, _loop, cfg, modalities={"": "denoiser"}).report
    measured = report.module("fc").w8a8[scheme].sqnr_db
    q = copy.deepcopy(model)
    spec = QuantSpec(precision, engine=engine, output_dtype=dtype)  # type: ignore[arg-type]
    quantize(q, {"fc": spec}, _loop)
    assert measured == pytest.approx(_sqnr(model, q), abs=2e-3)


def test_engine_arithmetic_changes_the_measured_error():
    model = Net()
    errs = {}
    for engine in ("opsnn", "mindie-sd"):
        cfg = ProbeConfig(fp16=False, attribution=False, schemes=("w8a8",), engine=engine,
                          engine_dtype="bfloat16")  # fmt: skip
        report = run_probe(model, _loop, cfg, modalities={"": "denoiser"}).report
        errs[engine] = report.module("fc").w8a8["w8a8"].sqnr_db
        assert report.config["engine"] == engine
    assert errs["opsnn"] != errs["mindie-sd"]  # bf16 activations and scales: another error


@pytest.mark.parametrize(
    ("scheme", "engine", "dtype"),
    [("w8a8_gptq", "opsnn", "float16"), ("w8a8_dynamic_gptq", "opsnn", "float16"),
     ("w8a8_gptq", "mindie-sd", "bfloat16")],
)  # fmt: skip
def test_the_probes_input_moments_seed_a_gptq_module_bit_for_bit(scheme, engine, dtype):
    """Pass 1 keeps the inputs' moments: quantize() seeded from them makes the module its own
    calibration pass makes (the probe measures the candidate out of sample: test_crossfit)."""
    from opsnn_quant.quant.schemes import scheme_spec

    model = Net()
    cfg = ProbeConfig(fp16=False, attribution=False, schemes=(scheme,), engine=engine,
                      engine_dtype=None if engine == "opsnn" else dtype)  # fmt: skip
    result = run_probe(model, _loop, cfg, modalities={"": "denoiser"})
    assert result.report.module("fc").w8a8[scheme].sqnr_db is not None
    spec = QuantSpec(**{**scheme_spec(scheme).to_dict(), "engine": engine, "output_dtype": dtype})
    calibrated = quantize(copy.deepcopy(model), {"fc": spec}, _loop)
    seeded = quantize(copy.deepcopy(model), {"fc": spec}, None, statistics=result.statistics)
    want = calibrated.fc.state_dict()
    got = seeded.fc.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


MAPS = [torch.randn(2, 3, 7, 7, generator=torch.Generator().manual_seed(i)) for i in range(3)]


def test_a_convs_gptq_candidate_is_measured_and_seeds_quantize_bit_for_bit():
    # The conv's moments are those of its im2col rows (K = 3 * 3 * 3): the probe measures the
    # w8a8_gptq candidate (out of sample, pixel by pixel) and its pass-1 statistics make the
    # module quantize()'s own calibration pass makes.
    from opsnn_quant.quant.schemes import scheme_spec

    def loop(m: nn.Module) -> None:
        for x in MAPS:
            m(x)

    model = ConvNet()
    cfg = ProbeConfig(fp16=False, attribution=False, schemes=("w8a8", "w8a8_gptq"))
    result = run_probe(model, loop, cfg, modalities={"": "denoiser"})
    errors = result.report.module("conv").w8a8
    assert errors["w8a8_gptq"].sqnr_db is not None and errors["w8a8"].sqnr_db is not None
    spec = scheme_spec("w8a8_gptq")
    calibrated = quantize(copy.deepcopy(model), {"conv": spec}, loop)
    seeded = quantize(copy.deepcopy(model), {"conv": spec}, None, statistics=result.statistics)
    want, got = calibrated.conv.state_dict(), seeded.conv.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
