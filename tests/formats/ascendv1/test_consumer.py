"""The AscendV1 consumer on hand-made directories: outputs worked out on paper."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from opsnn_quant.formats.ascendv1.consumer import AscendV1Linear, apply_ascendv1, unpack_w4a16
from opsnn_quant.formats.ascendv1.contract import AscendV1Error
from opsnn_quant.formats.ascendv1.reader import read_ascendv1
from opsnn_quant.formats.ascendv1.writer import w4a16_tensors
from tests.formats.ascendv1 import handmade


def test_two_layer_handmade_directory_gives_the_hand_computed_outputs(tmp_path):
    ckpt = read_ascendv1(handmade.write(tmp_path / "m"))
    assert {k: v.qtype for k, v in ckpt.linears.items()} == {"0": "W8A8", "1": "W8A16"}
    assert ckpt.params_dtype() == torch.float16  # an int64 deq_scale means an fp16 model
    model = apply_ascendv1(handmade.two_layer_model(), ckpt)
    assert all(isinstance(m, AscendV1Linear) for m in model)
    x = torch.tensor(handmade.X)
    assert torch.equal(model[0](x), torch.tensor(handmade.LAYER0))
    assert torch.equal(model(x), torch.tensor(handmade.LAYER1))


def test_w8a8_dynamic_follows_the_per_token_formula(tmp_path):
    t = {
        "weight": torch.tensor([[1, 2, 3], [-1, 0, 1]], dtype=torch.int8),
        "weight_scale": torch.tensor([[0.5], [0.25]]),
        "weight_offset": torch.zeros(2, 1),
        "bias": torch.tensor([0.5, 0.0]),
    }
    d = tmp_path / "dyn"
    d.mkdir()
    save_file({f"fc.{k}": v for k, v in t.items()}, str(d / "quant_model_weights.safetensors"))
    desc = {f"fc.{k}": ("FLOAT" if k == "bias" else "W8A8_DYNAMIC") for k in t}
    (d / "quant_model_description.json").write_text(json.dumps(desc | {"version": "1.0.0"}))
    holder = nn.Module()
    holder.fc = nn.Linear(3, 2)
    apply_ascendv1(holder, read_ascendv1(d))
    y = holder.fc(torch.tensor([[127.0, -63.5, 0.0]]))
    # rowmax 127: q = rint(x * 127 / 127) = [127, -64, 0] (ties to even); acc = [-1, -127];
    # y = acc * s_w * s_t + bias in fp32, s_t = 127 * fp32(1 / 127), output fp16 (no bf16 hint)
    f32 = np.float32
    s_t = f32(127.0) * (f32(1.0) / f32(127.0))
    acc = np.array([-1, -127], dtype=f32)
    want = (acc * np.array([0.5, 0.25], f32) * s_t + np.array([0.5, 0.0], f32)).astype(np.float16)
    assert np.array_equal(y.numpy()[0], want.astype(np.float32))


def test_w4a16_per_channel_weight_of_eight_outputs_goes_through_the_int4_pack():
    # n = 8: the int32 eight-per-word form torch_npu takes (npu_convert_weight_to_int4pack)
    values = (torch.arange(16, dtype=torch.int8).reshape(8, 2) % 15 - 7).to(torch.int8)
    scale = torch.full((8, 1), 0.5)
    t = w4a16_tensors(values, scale)
    from opsnn_quant.formats.ascendv1.reader import QuantLinearEntry

    entry = QuantLinearEntry("W4A16", 8, 2, tuple(sorted(t)), per_group=False)
    lin = AscendV1Linear("fc", entry, t, torch.float16, group_size=0)
    assert lin.weight.dtype == torch.int32 and tuple(lin.weight.shape) == (2, 1)
    x = torch.tensor([[1.0, -2.0]])
    assert torch.equal(lin(x), x @ (values.float() * 0.5).t())


def test_w4a16_per_group_handmade_weight():
    # values [[1, -2, 3, -8], [7, 0, -1, 2]] packed per group along n, low nibble = row 0:
    # (7 << 4) | 1 = 113, (0 << 4) | 14 = 14, 0xF3 = -13, (2 << 4) | 8 = 40
    packed = torch.tensor([[113, 14, -13, 40]], dtype=torch.int8)
    values = torch.tensor([[1, -2, 3, -8], [7, 0, -1, 2]], dtype=torch.int8)
    assert torch.equal(unpack_w4a16(packed, per_group=True), values)
    scale = torch.tensor([[0.5, 0.25], [1.0, 0.125]])
    assert torch.equal(w4a16_tensors(values, scale)["weight"], packed)
    entry_dir = {"weight": packed, "weight_scale": scale, "weight_offset": torch.zeros(2, 2)}
    from opsnn_quant.formats.ascendv1.reader import QuantLinearEntry

    entry = QuantLinearEntry("W4A16", 2, 4, tuple(sorted(entry_dir)), per_group=True)
    lin = AscendV1Linear("fc", entry, entry_dir, torch.float16, group_size=2)
    # dequantized rows [0.5, -1, 0.75, -2] and [7, 0, -0.125, 0.25]; x = [1, 2, 3, 4]
    assert lin(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).tolist() == [[-7.25, 7.625]]


def test_w4a16_packing_matches_msmodelslims_own_test_vectors():
    # msmodelslim test/cases/pytorch/msmodelslim/test_pack_int.py, test_w4a16_pack_int4_*
    w = torch.tensor([[1, 2, 3, 4], [5, 6, 7, -8]], dtype=torch.int8)  # their 8 is int4 -8
    per_group = w4a16_tensors(w, torch.ones(2, 2))["weight"]
    per_channel = w4a16_tensors(w, torch.ones(2, 1))["weight"]
    assert per_group.tolist() == [[81, 98, 115, -124]]
    assert per_channel.tolist() == [[33, 67], [101, -121]]
    assert torch.equal(unpack_w4a16(per_group, True), w)
    assert torch.equal(unpack_w4a16(per_channel, False), w)


def test_a_checkpoint_that_does_not_fit_the_model_is_refused_naming_the_tensor(tmp_path):
    ckpt = read_ascendv1(handmade.write(tmp_path / "m"))
    wrong = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    with pytest.raises(AscendV1Error, match=r"^0\.weight: 2x4 in the checkpoint, 3x4"):
        apply_ascendv1(wrong, ckpt)
    extra = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 2), nn.LayerNorm(2))
    with pytest.raises(AscendV1Error, match=r"^2\.weight: a tensor of the model that the"):
        apply_ascendv1(extra, read_ascendv1(tmp_path / "m"))
