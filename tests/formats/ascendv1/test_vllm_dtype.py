"""The model dtype ``vllm serve --dtype auto`` runs an AscendV1 directory in, where the files do
not say it (msModelSlim's W8A8_DYNAMIC: no deq_scale, no config.json). Expected values worked out
from vLLM 0.23.0's ``get_torch_dtype`` and ``_resolve_auto_dtype`` (cited in the module); vLLM's
own resolution on msModelSlim's files is tests/conformance/test_msmodelslim_peer.py."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from opsnn_quant.formats.ascendv1.candidate import apply_ascendv1_dir
from opsnn_quant.formats.ascendv1.consumer import AscendV1Linear
from opsnn_quant.formats.ascendv1.reader import read_ascendv1
from opsnn_quant.formats.ascendv1.vllm_dtype import auto_dtype
from tests.formats.ascendv1 import handmade

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
I8 = torch.int8

CASES = {
    # a float32 model runs in the platform's first dtype, bfloat16 (before: float16)
    "float32 config": ({"dtype": "float32"}, {I8, FP32}, BF16),
    "torch_dtype key": ({"torch_dtype": "float16"}, {I8, FP32}, FP16),
    "bfloat16 config": ({"dtype": "bfloat16"}, {I8, FP32}, BF16),
    "text sub-config": ({"text_config": {"dtype": "float16"}}, {I8, FP32}, FP16),
    # no dtype named: the dtype every tensor of the directory casts to without loss
    "no dtype, float32 tensors": ({}, {I8, torch.int32, FP32}, BF16),
    "no dtype, float16 tensors": ({}, {I8, FP16}, FP16),
    "no dtype, bfloat16 tensors": ({}, {I8, BF16}, BF16),
    "no dtype, no tensors": ({}, set(), BF16),
    "no config.json": (None, {I8, FP16}, FP16),
    # float16 refused for the model type, float64 not supported: the first supported, bfloat16
    "gemma2 in float16": ({"model_type": "gemma2", "dtype": "float16"}, {I8}, BF16),
    "float64 config": ({"dtype": "float64"}, {I8}, BF16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_vllms_auto_dtype(case):
    config, tensors, want = CASES[case]
    assert auto_dtype(config, tensors) == want


def _dynamic_dir(tmp_path):
    """Layer 0 float (FLOAT), layer 1 W8A16: a directory with no deq_scale and no metadata."""
    t = {k: v for k, v in handmade.tensors().items() if k.startswith("1.")}
    float0 = handmade.two_layer_model()[0]
    t |= {"0.weight": float0.weight.detach().clone(), "0.bias": float0.bias.detach().clone()}
    desc = {k: "W8A16" if k.startswith("1.") and k != "1.bias" else "FLOAT" for k in t}
    desc |= {"model_quant_type": "W8A16", "version": "1.0.0", "group_size": 0}
    return handmade.write(tmp_path / "ckpt", t, desc)


@pytest.mark.parametrize(
    ("own", "float_model", "want"),
    [(None, None, BF16), (None, "float16", FP16), ("float16", "bfloat16", FP16),
     (None, "float32", BF16)],
)  # fmt: skip
def test_the_directorys_config_else_the_float_models_decides(own, float_model, want, tmp_path):
    directory = _dynamic_dir(tmp_path)
    if own:
        (directory / "config.json").write_text(json.dumps({"dtype": own}))
    float_dir = tmp_path / "float"
    float_dir.mkdir()
    if float_model:
        (float_dir / "config.json").write_text(json.dumps({"torch_dtype": float_model}))
    assert read_ascendv1(directory).params_dtype(float_dir / "config.json") == want
    model = handmade.two_layer_model()
    assert apply_ascendv1_dir(model, directory, float_dir) == [""]
    assert isinstance(model[1], AscendV1Linear) and model[1].params_dtype == want
    assert isinstance(model[0], nn.Linear)  # loaded as float


def test_a_static_deq_scale_still_names_the_dtype(tmp_path):
    # int64 deq_scale: an fp16 model's (vLLM-Ascend makes its deq_scale parameter int64 in fp16
    # only), whatever the float model's config says
    directory = handmade.write(tmp_path / "ckpt")
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    assert read_ascendv1(directory).params_dtype(tmp_path / "config.json") == FP16
