"""A hand-made two-layer AscendV1 directory, with integers and scales chosen so that every
output can be worked out on paper (see the tests that use it)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

# fp32 bit patterns of 0.25 and 0.125, widened to int64: msModelSlim's deqscale2int64_by_dtype
DEQ_INT64 = [0x3E800000, 0x3E000000]


def two_layer_model() -> nn.Sequential:
    """The float architecture: Linear(4 -> 2) then Linear(2 -> 2), both with a bias."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 2))


def tensors() -> dict[str, torch.Tensor]:
    """Layer 0 W8A8 (asymmetric activation, offset 1), layer 1 W8A16 (row 1 zero point 1)."""
    return {
        "0.weight": torch.tensor([[1, -2, 3, 0], [4, 5, -6, 7]], dtype=torch.int8),
        "0.input_scale": torch.tensor([0.5]),
        "0.input_offset": torch.tensor([1.0]),
        "0.quant_bias": torch.tensor([10, -20], dtype=torch.int32),
        "0.deq_scale": torch.tensor(DEQ_INT64, dtype=torch.int64),
        "0.bias": torch.tensor([123.0, 456.0]),  # FLOAT; W8A8 engines use quant_bias instead
        "1.weight": torch.tensor([[2, -1], [3, 4]], dtype=torch.int8),
        "1.weight_scale": torch.tensor([[0.5], [0.25]]),
        "1.weight_offset": torch.tensor([[0.0], [1.0]]),
        "1.bias": torch.tensor([1.0, -1.0]),
    }


def description(t: dict[str, torch.Tensor]) -> dict[str, object]:
    types = {k: ("FLOAT" if k.endswith("bias") and "quant" not in k else
                 "W8A8" if k.startswith("0.") else "W8A16") for k in t}  # fmt: skip
    return {**types, "model_quant_type": "W8A8", "version": "1.0.0", "group_size": 0}


def write(directory: Path, t: dict[str, torch.Tensor] | None = None,
          desc: dict[str, object] | None = None) -> Path:  # fmt: skip
    """Write the directory (tensors and description can be replaced to make broken ones)."""
    t = tensors() if t is None else t
    directory.mkdir(parents=True, exist_ok=True)
    save_file(t, str(directory / "quant_model_weights.safetensors"))
    doc = description(t) if desc is None else desc
    (directory / "quant_model_description.json").write_text(json.dumps(doc, indent=4))
    return directory


# x = [1, -0.75, 0.25, 2]: x * (1 / 0.5) + 1 = [3, -0.5, 1.5, 5]; rint (ties to even) ->
# q = [3, 0, 2, 5]; acc = [3 + 0 + 6 + 0, 12 + 0 - 12 + 35] = [9, 35]; + quant_bias -> [19, 15];
# * deq_scale [0.25, 0.125] -> [4.75, 1.875] (exact in fp16).
X = [[1.0, -0.75, 0.25, 2.0]]
LAYER0 = [[4.75, 1.875]]
# layer 1: (w - z) * s = [[1, -0.5], [0.5, 0.75]]; [4.75, 1.875] -> [4.8125, 3.78125] + bias
LAYER1 = [[4.8125, 2.78125]]
