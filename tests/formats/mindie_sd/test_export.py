"""export/mindie-sd: the files mindiesd.quantize loads (msModelSlim mindie_format_saver's layout,
MindIE-SD's loader rules) and the consumer that runs them, bit for bit our module's arithmetic."""

import copy
import json
import os

import pytest
import torch
from torch import nn

from opsnn_quant.formats.mindie_sd.export import PERMISSION, component_files, export_mindie_sd
from opsnn_quant.formats.mindie_sd.reader import MindieSdError, apply_mindie_sd, read_mindie_sd
from opsnn_quant.formats.safetensors_io import write_safetensors
from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision


class Block(nn.Module):
    """norm -> static Linear -> GELU -> smoothed static Linear -> ReLU -> smoothed dynamic
    Linear (no bias) and a conv beside them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.norm = nn.LayerNorm(32)
        self.a = nn.Linear(32, 48)
        self.b = nn.Linear(48, 40)
        self.c = nn.Linear(40, 24, bias=False)
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c(torch.relu(self.b(nn.functional.gelu(self.a(self.norm(x))))))
        return y + self.conv(y.reshape(-1, 2, 3, 4)).reshape(y.shape)


def _loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        model(torch.randn(8, 32, generator=g) * 2)


def _quantized(dtype: str = "bfloat16", engine: str = "mindie-sd") -> tuple[Block, Block]:
    float_model = Block()
    model = copy.deepcopy(float_model)

    def spec(p: str, alpha: float | None = None) -> QuantSpec:
        return QuantSpec(Precision(p), smoothquant_alpha=alpha, engine=engine, output_dtype=dtype)  # type: ignore[arg-type]

    quantize(model, {"a": spec("w8a8"), "b": spec("w8a8", 0.5), "c": spec("w8a8_dynamic", 0.5),
                     "conv": QuantSpec(Precision.W8A8)}, _loop)  # fmt: skip
    return float_model, model


def _in(dtype: torch.dtype, model: nn.Module) -> nn.Module:
    """``model``'s float modules in ``dtype`` (its quantized modules' tensors stay): a pipeline
    runs so around MindIE-SD's Linears, which return the engine dtype (layer.py 347-363)."""
    from opsnn_quant.quant.modules import is_quant_module

    for module in model.modules():
        if not is_quant_module(module):
            for p in module.parameters(recurse=False):
                p.data = p.data.to(dtype)
    return model


def _export(model: nn.Module, tmp_path):
    adapter = GenericAdapter(model, {"": Modality.DENOISER}, _loop)
    return export_mindie_sd(adapter, tmp_path / "mindie-sd")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mindie_sd_runs_our_export_bit_for_bit(tmp_path, dtype):
    float_model, model = _quantized(dtype)
    _export(model, tmp_path)
    ckpt = read_mindie_sd(tmp_path / "mindie-sd" / "quant_model_description_w8a8.json")
    d = getattr(torch, dtype)
    engine = _in(d, copy.deepcopy(float_model))
    replaced = apply_mindie_sd(engine, ckpt, dtype=d)
    assert replaced == ["a", "b", "c"]  # the conv stays as loaded: MindIE-SD replaces Linears
    engine.conv = model.conv = _in(d, copy.deepcopy(float_model.conv))  # the Linears compared
    x = (torch.randn(6, 32) * 2).to(d)
    assert torch.equal(_in(d, model)(x), engine(x))
    # MindIE-SD's Linear returns the engine dtype, whatever comes in: an fp32 pipeline around it
    # fails as on the NPU (SD3 attention: "Expected query, key, and value to have the same dtype")
    assert engine.a(torch.randn(2, 32)).dtype == d


def test_files_as_the_saver_writes_them(tmp_path):
    _, model = _quantized()
    result = _export(model, tmp_path)
    out = tmp_path / "mindie-sd"
    desc_path = out / "quant_model_description_w8a8.json"
    weights = out / "quant_model_weight_w8a8.safetensors"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        desc_path.name, weights.name,
    ]  # fmt: skip
    for path in (desc_path, weights):  # check_max_permission: no more than rw-r-----
        assert os.stat(path).st_mode & 0o777 == PERMISSION == 0o640
    text = desc_path.read_text()
    assert not text.endswith("\n") and text.startswith('{\n    "a.weight": "W8A8",\n')
    desc = json.loads(text)
    assert list(desc)[-1] == "model_quant_type" and desc["model_quant_type"] == "W8A8"
    # static: on_w8a8_static's tensors; the smoothed ones in the non-fusion form
    assert [k for k in desc if k.startswith("a.")] == [
        "a.weight",
        "a.quant_bias",
        "a.input_scale",
        "a.input_offset",
        "a.deq_scale",
        "a.bias",
    ]
    assert desc["b.div.mul_scale"] == "FLOAT" and desc["b.linear.weight"] == "W8A8"
    assert desc["c.div.mul_scale"] == "FLOAT" and desc["c.linear.weight"] == "W8A8_DYNAMIC"
    assert "c.linear.bias" not in desc  # the float Linear has none
    # every other parameter FLOAT (on_float_module), the int8 conv's float equivalent too
    assert desc["norm.weight"] == desc["conv.weight"] == desc["conv.bias"] == "FLOAT"
    assert (
        "1 quantized module(s) written FLOAT (conv): MindIE-SD quantizes nn.Linear only"
        in result.notes
    )


def test_tensors_follow_the_savers_formulas(tmp_path):
    float_model, model = _quantized()
    files = component_files(model, torch.bfloat16)
    t = files.tensors
    s_in, s_w = t["a.input_scale"], model.a.weight_quantizer.scale
    # on_w8a8_static: deq_scale = input_scale * weight_scale (fp32);
    # quant_bias = round(bias / deq_scale - rowsum(W) * input_offset)
    assert t["a.input_scale"].dtype == t["a.deq_scale"].dtype == torch.float32
    assert torch.equal(t["a.deq_scale"], s_in * s_w)
    rowsum = t["a.weight"].to(torch.float64).sum(dim=1)
    expect = torch.round(float_model.a.bias.double() / t["a.deq_scale"].double()
                         - rowsum * float(t["a.input_offset"]))  # fmt: skip
    assert torch.equal(t["a.quant_bias"], expect.to(torch.int32))
    w_q = torch.clamp(torch.round(float_model.a.weight.float() / s_w.unsqueeze(1)), -128, 127)
    assert torch.equal(t["a.weight"], w_q.to(torch.int8))
    # the input scale MindIE-SD divides by is bf16: the stored one already is
    assert torch.equal(s_in.to(torch.bfloat16).float(), s_in)
    # non-fusion: mul_scale = 1/s in bf16, the weight smoothed by the factor it applies
    mul = t["b.div.mul_scale"]
    assert mul.dtype == torch.bfloat16 and mul.shape == (48,)
    smoothed = float_model.b.weight.double() / mul.double().unsqueeze(0)
    s_b = model.b.weight_quantizer.scale.double().unsqueeze(1)
    assert torch.equal(
        t["b.linear.weight"], torch.round(smoothed / s_b).clamp(-128, 127).to(torch.int8)
    )
    # dynamic: weight_scale [N, 1] (bf16-exact: the engine casts it), zero weight_offset
    ws = t["c.linear.weight_scale"]
    assert ws.shape == (24, 1) and torch.equal(ws.to(torch.bfloat16).float(), ws)
    assert torch.equal(t["c.linear.weight_offset"], torch.zeros(24, 1))


def test_other_arithmetic_is_exported_and_said(tmp_path):
    _, model = _quantized(engine="opsnn", dtype="float16")
    result = _export(model, tmp_path)
    assert any("calibrated for another target's arithmetic" in n for n in result.notes)
    ckpt = read_mindie_sd(tmp_path / "mindie-sd" / "quant_model_description_w8a8.json")
    assert apply_mindie_sd(Block(), ckpt) == ["a", "b", "c"]


@pytest.fixture
def exported(tmp_path):
    _, model = _quantized()
    _export(model, tmp_path)
    return tmp_path / "mindie-sd"


def test_refuses_what_mindie_sd_refuses(exported):
    desc = exported / "quant_model_description_w8a8.json"
    weights = exported / "quant_model_weight_w8a8.safetensors"
    os.chmod(weights, 0o644)  # safetensors' default mode: MindIE-SD raises PermissionError
    with pytest.raises(MindieSdError, match=r"mode 0o644 is more permissive than 0o640"):
        read_mindie_sd(desc)
    os.chmod(weights, 0o640)
    ranked = exported / "quant_model_description_w8a8_0.json"
    ranked.write_text(desc.read_text())
    os.chmod(ranked, 0o640)
    with pytest.raises(MindieSdError, match="_<digits>"):
        read_mindie_sd(ranked)
    link = exported / "link.json"
    link.symlink_to(desc)
    with pytest.raises(MindieSdError, match="symbolic link"):
        read_mindie_sd(link)
    doc = json.loads(desc.read_text())
    doc["model_quant_type"] = "w8a8"  # QuantAlgorithm(...) is case-sensitive
    desc.write_text(json.dumps(doc, indent=4))
    with pytest.raises(MindieSdError, match="model_quant_type 'w8a8' is not a MindIE-SD"):
        read_mindie_sd(desc)


def test_refuses_missing_tensors_and_int64_deq_scale_in_bf16(exported):
    desc = exported / "quant_model_description_w8a8.json"
    weights = exported / "quant_model_weight_w8a8.safetensors"
    ckpt = read_mindie_sd(desc)
    saved = {k: ckpt.load(k).clone() for k in ckpt.keys}
    del ckpt  # its file is rewritten below
    tensors = {k: v for k, v in saved.items() if k != "a.quant_bias"}
    write_safetensors(tensors, weights)
    with pytest.raises(MindieSdError, match=r"a\.quant_bias: Critical parameter missing"):
        apply_mindie_sd(Block(), read_mindie_sd(desc))
    tensors["a.quant_bias"] = saved["a.quant_bias"]
    tensors["a.deq_scale"] = saved["a.deq_scale"].view(torch.int32).to(torch.int64)
    write_safetensors(tensors, weights)
    with pytest.raises(
        MindieSdError, match=r"a\.deq_scale: int64, but npu_quant_matmul with bfloat16"
    ):
        apply_mindie_sd(Block(), read_mindie_sd(desc))
    # a FLOAT key leaves the layer as loaded
    doc = json.loads(desc.read_text())
    doc["a.weight"] = "FLOAT"
    desc.write_text(json.dumps(doc, indent=4))
    tensors["a.deq_scale"] = saved["a.deq_scale"]
    write_safetensors(tensors, weights)
    assert apply_mindie_sd(Block(), read_mindie_sd(desc)) == ["b", "c"]


def test_per_step_scales_as_w8a8_timestep(tmp_path):
    # W8A8TimeStepQuantLinear: a static row per denoising step ([T, 1] input scales, [T, N]
    # deq_scale and quant_bias); our step groups (0-1, 2-3) expand to the four steps' rows
    from opsnn_quant.core.timesteps import at_step
    from opsnn_quant.formats.mindie_sd.export import _write

    float_model = Block()
    model = copy.deepcopy(float_model)

    def stepped(m: nn.Module) -> None:
        g = torch.Generator().manual_seed(0)
        for step, scale in enumerate((8.0, 4.0, 2.0, 1.0)):
            with at_step(step):
                m(torch.randn(8, 32, generator=g) * scale)

    spec = QuantSpec(Precision.W8A8, timestep_bounds=(0, 2), engine="mindie-sd",
                     output_dtype="bfloat16")  # fmt: skip
    quantize(model, {"a": spec, "b": spec}, stepped)
    files = component_files(model, torch.bfloat16, steps=4)
    assert files.description["a.weight"] == "W8A8_TIMESTEP"
    assert files.description["model_quant_type"] == "W8A8_TIMESTEP"
    t = files.tensors
    assert t["a.input_scale"].shape == (4, 1) and t["a.deq_scale"].shape == (4, 48)
    assert torch.equal(t["a.input_scale"][0], t["a.input_scale"][1])  # steps 0 and 1: group 0
    assert not torch.equal(t["a.input_scale"][1], t["a.input_scale"][2])
    assert t["a.weight_scale"].shape == (48, 1)  # the dynamic branch's
    _write(files, tmp_path)
    engine = _in(torch.bfloat16, copy.deepcopy(float_model))
    apply_mindie_sd(engine, read_mindie_sd(tmp_path / "quant_model_description_w8a8_timestep.json"))
    engine.conv = model.conv = _in(torch.bfloat16, copy.deepcopy(float_model.conv))
    model = _in(torch.bfloat16, model)
    x = (torch.randn(6, 32) * 3).to(torch.bfloat16)
    for step in range(4):
        with at_step(step):
            assert torch.equal(model(x), engine(x)), step
    with at_step(4), pytest.raises(MindieSdError, match="step 4 has no row in the 4-step table"):
        engine(x)
    # without the number of steps there is no table to write: FLOAT, with the reason
    assert "number of denoising steps" in component_files(model, torch.bfloat16).exported_float["a"]


def test_a_w4a16_module_is_written_float_as_what_its_int4_values_mean():
    # MindIE-SD's WeightQuantLinear takes per-channel scales only: a per-group w4a16 Linear is
    # written FLOAT, its weight the dequantized int4 values (within half a step of the float)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 16))
    float_weight = model[0].weight.detach().clone()
    quantize(model, {"0": QuantSpec(Precision.W4A16)})
    files = component_files(model, torch.bfloat16)
    assert files.description["0.weight"] == "FLOAT" and "per-channel" in files.exported_float["0"]
    w = files.tensors["0.weight"].float()
    step = model[0].weight_quantizer.scale.t().repeat_interleave(128, dim=1)  # (16, 256)
    assert w.shape == (16, 256)
    assert bool(((w - float_weight).abs() <= step / 2 + w.abs() * 2**-8).all())  # + bf16 rounding
