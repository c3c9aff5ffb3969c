"""A module made for a serving engine (QuantSpec.engine): its parameters in the engine's form
(opsnn_quant/quant/engine.py) and a checkpoint that reproduces it bit for bit."""

import copy

import pytest
import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.engine import deqscale2int64, mul_scale_of, round_up_to
from opsnn_quant.quant.engines import MINDIE_SD, OPSNN, VLLM_ASCEND
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision

BF16, FP16 = torch.bfloat16, torch.float16


def test_round_up_to_the_next_representable_value():
    # bf16 has 7 mantissa bits: around 1 the spacing is 2^-7
    assert round_up_to(torch.tensor([1.001, 1.0, 0.75]), BF16).tolist() == [1.0078125, 1.0, 0.75]
    # fp16 around 0.1: 0.0999755859375 is below 0.1, the next value 0.10003662109375 is not
    assert round_up_to(torch.tensor([0.1]), FP16).tolist() == [0.10003662109375]
    v = torch.rand(1000) * 10 + 1e-3
    r = round_up_to(v, BF16)
    assert bool((r >= v).all()) and torch.equal(r.to(BF16).float(), r)
    lower = (r.to(BF16).view(torch.int16) - 1).view(BF16).float()
    assert bool((lower < v).all())  # the smallest such value


def test_mul_scale_and_the_factor_it_applies():
    mul, factor = mul_scale_of(torch.tensor([3.0, 0.5]), BF16)
    # 1/3 in bf16: 171/128 * 2^-2 = 0.333984375; 1/0.5 = 2 exactly
    assert mul.dtype == BF16 and mul.float().tolist() == [0.333984375, 2.0]
    assert factor.tolist() == pytest.approx([1 / 0.333984375, 0.5], rel=1e-7)


def test_engine_input_scale_is_what_the_engine_applies():
    # MindIE-SD, bf16: input_scale.to(bfloat16); 0.05 -> 205/128 * 2^-5
    assert MINDIE_SD.input_scale_of(0.05, BF16) == (0.050048828125, 0.050048828125)
    stored, eff = MINDIE_SD.input_scale_of(0.05, FP16)  # float32 as stored
    assert stored == eff == float(torch.tensor(0.05, dtype=torch.float32))
    # vLLM-Ascend, fp16: fp16(0.1) = 0.0999755859375, 1 / it rounded to fp16 = 10.0
    assert VLLM_ASCEND.input_scale_of(0.1, FP16) == (0.0999755859375, 0.1)
    # ours: the calibrated scale, stored and applied as is (fp32 activations)
    assert OPSNN.input_scale_of(0.1, BF16) == (0.1, 0.1)


def test_deqscale2int64_keeps_the_fp32_bits_sign_extended():
    out = deqscale2int64(torch.tensor([1.0, -2.0]))
    assert out.dtype == torch.int64 and out.tolist() == [0x3F800000, -(2**30)]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b, self.c = nn.Linear(32, 48), nn.Linear(48, 40), nn.Linear(40, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.nn.functional.gelu(self.a(x)))))


def _loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        model(torch.randn(8, 32, generator=g) * 2)


@pytest.mark.parametrize(
    ("engine", "alpha"), [("mindie-sd", 0.5), ("vllm-ascend", None), ("vllm-ascend", 0.5)]
)
def test_engine_modules_round_trip_through_a_checkpoint(tmp_path, engine, alpha):
    float_model = _Net()
    model = copy.deepcopy(float_model)

    def spec(p: str) -> QuantSpec:
        return QuantSpec(Precision(p), smoothquant_alpha=alpha, engine=engine,
                         output_dtype="bfloat16")  # fmt: skip

    quantize(model, {"a": spec("w8a8"), "b": spec("w8a8_dynamic")}, _loop)
    if engine == "mindie-sd":  # the mul_scale in bf16, and the weight smoothed by its inverse
        assert model.a.input_quantizer.mul_scale.dtype == BF16
    else:  # per-token weight scales the engine keeps in bf16: exact there
        s = model.b.weight_quantizer.scale
        assert torch.equal(s.to(BF16).float(), s)
    # the static input scale is the engine's (bf16-exact for both)
    s_in = model.a.input_quantizer.scale
    assert torch.equal(s_in.to(BF16).float(), s_in)
    save_quantized(model, tmp_path / "q")
    again = load_quantized(copy.deepcopy(float_model), tmp_path / "q")
    x = torch.randn(16, 32) * 2
    assert torch.equal(model(x), again(x))


def test_engine_specs_are_checked():
    with pytest.raises(ConfigError, match="mindie-sd has no w4a16 Linear"):
        QuantSpec(Precision.W4A16, engine="mindie-sd")
    with pytest.raises(ConfigError, match="unknown engine 'tensorrt'"):
        QuantSpec(Precision.W8A8, engine="tensorrt")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Linear layers only"):
        quantize(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)),
                 {"0": QuantSpec(Precision.W8A8, engine="mindie-sd")},
                 lambda m: m(torch.randn(1, 3, 8, 8)))  # fmt: skip


@pytest.mark.parametrize("precision", ["w8a8", "w8a8_dynamic"])
def test_a_folded_vllm_module_runs_the_engines_linear_on_x_over_s(precision):
    """vLLM-Ascend applies no factor (w8a8_static.py / w8a8_dynamic.py apply: x goes straight
    to npu_quantize / npu_dynamic_quant): a smoothed module computes the engine's Linear on
    ``x / s``, what the norm with s divided into its gain hands it (fp32 here)."""
    from opsnn_quant.ascend import engines

    model = _Net()
    spec = QuantSpec(Precision(precision), smoothquant_alpha=0.5, engine="vllm-ascend",
                     output_dtype="bfloat16")  # fmt: skip
    quantize(model, {"a": spec}, _loop)
    q, iq = model.a, model.a.input_quantizer
    assert not hasattr(iq, "mul_scale")  # nothing at run time: the factor goes into the norm
    x = torch.randn(16, 32) * 2
    xs = x / iq.smooth
    w_t = q.weight.t()
    if precision == "w8a8":
        want = engines.vllm_ascend_static(
            xs, w_t, q.deq_scale, q.quant_bias, iq.scale.reshape(1).to(BF16),
            iq.offset.reshape(1).to(torch.int8), BF16,
        )  # fmt: skip
    else:
        bias = q.bias.to(BF16)
        want = engines.vllm_ascend_dynamic(xs, w_t, q.weight_quantizer.scale.to(BF16), bias, BF16)
    assert torch.equal(q(x), want.float())
    # and it is SmoothQuant: the int8 weight is that of W * s
    w_s = _Net().a.weight.detach() * iq.smooth
    assert torch.equal(
        q.weight,
        torch.round(w_s / q.weight_quantizer.scale[:, None]).clamp(-128, 127).to(torch.int8),
    )
