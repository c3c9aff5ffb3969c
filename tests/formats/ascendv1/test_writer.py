"""The AscendV1 writer: input scales the engines invert exactly, W4A16 modules, determinism."""

from __future__ import annotations

import copy
import json
import struct
from types import SimpleNamespace

import torch
from safetensors.torch import save_file
from torch import nn

from opsnn_quant.formats.ascendv1.consumer import apply_ascendv1
from opsnn_quant.formats.ascendv1.export import export_ascendv1
from opsnn_quant.formats.ascendv1.reader import read_ascendv1
from opsnn_quant.formats.ascendv1.writer import component_export, engine_input_scale
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from tests.folding.test_smooth_fold import Stub
from tests.tiny_models import TinyAttention, forward_loop_for


def _f32(bits: int) -> torch.Tensor:
    return torch.tensor([struct.unpack("<f", struct.pack("<I", bits))[0]], dtype=torch.float32)


def test_engine_input_scale_is_the_fp32_number_whose_reciprocal_is_our_multiplier():
    scale, exact = engine_input_scale(torch.tensor([4.0]))
    assert exact and scale.item() == 0.25
    # 1/0.1 in fp32: its reciprocal rounds back to fp32(0.1) exactly
    inv = torch.tensor([1.0], dtype=torch.float32) / torch.tensor([0.1], dtype=torch.float32)
    scale, exact = engine_input_scale(inv)
    assert exact and torch.equal(1.0 / scale, inv)
    # 0x3FFFFFFF (1.99999988): 1/x for x in fp32 near 0.5 jumps over it (no preimage)
    inv = _f32(0x3FFFFFFF)
    scale, exact = engine_input_scale(inv)
    assert not exact and abs(float(1.0 / scale) - float(inv)) <= 2 * 1.2e-7


def test_a_w4a16_module_is_written_per_group_and_read_back(tmp_path):
    # QuantLinear cannot be W4A16 yet: a frozen W8A16 module stands in, holding int4 values and
    # per-group scales (n, k / 32) as a W4A16 QuantLinear will (int8 values, scale per group)
    torch.manual_seed(0)
    holder = nn.Module()
    holder.fc = nn.Linear(64, 8, bias=False)
    quantize(holder, {"fc": QuantSpec("w8a16")})
    m = holder.fc
    values = torch.randint(-8, 8, (8, 64), dtype=torch.int8)
    scale = torch.rand(8, 2) + 0.5
    m.weight = values
    m.weight_quantizer.scale = scale
    m.spec = SimpleNamespace(precision="w4a16", output_dtype="float16", static_activations=False)
    export = component_export(holder, folds=[], refused={}, source_keys=None)
    assert export.description["fc.weight"] == "W4A16" and export.description["group_size"] == 32
    assert tuple(export.tensors["fc.weight"].shape) == (4, 64)  # per group: [n / 2, k]
    d = tmp_path / "w4"
    d.mkdir()
    save_file(export.tensors, str(d / "quant_model_weights.safetensors"))
    (d / "quant_model_description.json").write_text(json.dumps(export.description))
    fresh = nn.Module()
    fresh.fc = nn.Linear(64, 8, bias=False)
    apply_ascendv1(fresh, read_ascendv1(d))
    x = torch.randn(3, 64)
    # the engine computes in its fp16 params dtype: fp16 activations and scales, fp16 output
    w = values.float() * scale.half().float().repeat_interleave(32, dim=1)
    want = (x.half().float() @ w.t()).half().float()
    assert torch.allclose(fresh.fc(x), want, rtol=2e-3, atol=2e-3)


def test_the_same_model_gives_byte_identical_files(tmp_path):
    model = TinyAttention()
    quantize(model, {"*": QuantSpec("w8a8", smoothquant_alpha=0.5)}, forward_loop_for(model))
    twin = copy.deepcopy(model)
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    calls = {"": [(model.example_inputs(seed=9), {})]}
    for name, m in (("a", model), ("b", twin)):
        export_ascendv1(Stub(m), tmp_path / name, calls=calls, source_dir=src)  # type: ignore[arg-type]
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    # the format's files only: an output's marker is the commands' (opsnn_quant/output/directories.py atomic_dir)
    assert files == ["config.json", "quant_model_description.json",
                     "quant_model_weights.safetensors"]  # fmt: skip
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_per_step_module_is_written_float_with_the_reason():
    # AscendV1 (msModelSlim ascendv1.md, vllm_ascend w8a8.py) has one [1] input_scale per
    # Linear: a w8a8_timestep module's scale table cannot be written there.
    from opsnn_quant.core.timesteps import at_step
    from opsnn_quant.formats.ascendv1.writer import TIMESTEP_REASON

    torch.manual_seed(0)
    holder = nn.Module()
    holder.fc = nn.Linear(16, 8)
    holder.plain = nn.Linear(8, 8)

    def loop(m: nn.Module) -> None:
        for step in range(4):
            with at_step(step):
                m.plain(m.fc(torch.randn(4, 16) * (4 - step)))

    specs = {"fc": QuantSpec("w8a8", timestep_bounds=(0, 2)), "plain": QuantSpec("w8a8")}
    bias = holder.fc.bias.detach().clone()
    quantize(holder, specs, loop)
    export = component_export(holder, folds=[], refused={}, source_keys=None)
    assert export.exported_float == {"fc": TIMESTEP_REASON}
    assert export.description["fc.weight"] == "FLOAT" and "fc.input_scale" not in export.tensors
    # the float bias is the one the int32 bias of either group encodes (one rounding step)
    deq = float(holder.fc.deq_scale[0].max())
    assert torch.allclose(export.tensors["fc.bias"].float(), bias, atol=deq)
    assert export.description["plain.weight"] == "W8A8"
    assert tuple(export.tensors["plain.input_scale"].shape) == (1,)


def test_export_runs_with_a_per_step_module_in_the_model(tmp_path):
    # The fold planning replays the quantized model: a per-step module there must not stop the
    # export (it needs a step to run), and it is written FLOAT.
    from opsnn_quant.core.timesteps import at_step
    from opsnn_quant.formats.ascendv1.writer import TIMESTEP_REASON

    model = TinyAttention()
    loop = forward_loop_for(model)

    def stepped(m: nn.Module) -> None:
        for step in (0, 1):
            with at_step(step):
                loop(m)

    specs = {"ff2": QuantSpec("w8a8", timestep_bounds=(0, 1)),
             "*": QuantSpec("w8a8", smoothquant_alpha=0.5)}  # fmt: skip
    quantize(model, specs, stepped)
    calls = {"": [(model.example_inputs(seed=9), {})]}
    export_ascendv1(Stub(model), tmp_path / "out", calls=calls)  # type: ignore[arg-type]
    description = json.loads((tmp_path / "out" / "quant_model_description.json").read_text())
    assert description["ff2.weight"] == "FLOAT"
    assert TIMESTEP_REASON in json.dumps(description)


def test_a_float_conv_weight_is_made_only_when_written_and_holds_the_dequantized_weight(tmp_path):
    from opsnn_quant.formats.safetensors_io import LazyTensor

    torch.manual_seed(3)
    holder = nn.Module()
    holder.conv = nn.Conv2d(3, 4, 3, padding=1)
    holder.fc = nn.Linear(8, 4)
    xs = [torch.randn(2, 3, 4, 4) for _ in range(2)]
    quantize(holder, {"*": QuantSpec("w8a8")},
             lambda m: [m.fc(m.conv(x).reshape(2, 4, 16)[..., :8]) for x in xs])  # fmt: skip
    export = component_export(holder, folds=[], refused={}, source_keys=None)
    lazy = export.tensors["conv.weight"]
    assert isinstance(lazy, LazyTensor)  # a float copy of the conv is not held
    assert (lazy.dtype, lazy.shape) == (torch.float32, (4, 3, 3, 3))
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    calls = {"": [((xs[0],), {})]}

    class Root(nn.Module):  # the fold trace replays the component's root
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = holder.conv, holder.fc

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(x).reshape(2, 4, 16)[..., :8])

    export_ascendv1(Stub(Root()), tmp_path / "av1", calls=calls, source_dir=src)  # type: ignore[arg-type]
    ckpt = read_ascendv1(tmp_path / "av1")
    # what our int8 weight means: int8 values x per-output-channel weight scale
    want = holder.conv.weight.float() * holder.conv.weight_quantizer.scale.reshape(4, 1, 1, 1)
    assert torch.equal(ckpt.load("conv.weight"), want)
    assert ckpt.load("fc.weight").dtype == torch.int8
