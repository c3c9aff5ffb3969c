"""vLLM 0.23.0's Whisper asks vLLM-Ascend's quantization config for its Linears under prefixes
that are not the checkpoint's names ('.encoder.layers.0.layers.self_attn.q_proj'; whisper.py
478-483, 556-561, 962): our AscendV1 export also writes each Linear's weight key under that
prefix, with its type, and our reader checks those aliases (the engine itself, running on the
export: tests/conformance/test_vllm_ascend_engine.py)."""

from __future__ import annotations

import json

import pytest
import torch

from opsnn_quant.formats.ascendv1.contract import AscendV1Error
from opsnn_quant.formats.ascendv1.export import export_ascendv1
from opsnn_quant.formats.ascendv1.reader import read_ascendv1
from opsnn_quant.formats.ascendv1.vllm_prefixes import (
    WHISPER,
    aliased_key,
    is_alias,
    vllm_prefix_aliases,
)
from opsnn_quant.models import load_adapter
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from tests.formats.ascendv1 import handmade

VLLM = {"engine": "vllm-ascend", "output_dtype": "bfloat16"}
LINEARS = ["model.encoder.layers.0.fc1", "model.decoder.layers.3.encoder_attn.k_proj"]


def test_each_whisper_linear_weight_key_gets_the_prefix_vllm_asks_for():
    desc = {
        "model.encoder.layers.0.fc1.weight": "W8A8",
        "model.encoder.layers.0.fc1.deq_scale": "W8A8",
        "model.encoder.layers.0.final_layer_norm.weight": "FLOAT",  # not a Linear
        "model.decoder.layers.3.encoder_attn.k_proj.weight": "FLOAT",  # a float Linear too
        "proj_out.weight": "FLOAT",
        "model_quant_type": "W8A8",
    }
    aliases = vllm_prefix_aliases(desc, [WHISPER], LINEARS)
    # the '.fc1.' -> '.mlp.fc1.' mapping is the engine's (it maps the description's keys too)
    assert aliases == {
        ".encoder.layers.0.layers.fc1.weight": "W8A8",
        ".decoder.layers.3.layers.encoder_attn.k_proj.weight": "FLOAT",
    }
    assert all(is_alias(a) and aliased_key(a) in desc for a in aliases)
    assert vllm_prefix_aliases(desc, ["LlamaForCausalLM"], LINEARS) == {}  # other models: none


@pytest.fixture
def tiny_export(tmp_path):
    from tests.tiny_pipelines import save_tiny_whisper

    source = save_tiny_whisper(tmp_path / "w")
    adapter = load_adapter("whisper", str(source), max_new_tokens=4)
    model = adapter.model
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    specs = {n: QuantSpec("w8a8_dynamic", **VLLM) for n in names if "fc2" not in n and n != "proj_out"}  # type: ignore[arg-type]  # fmt: skip

    def loop(m: torch.nn.Module) -> None:
        g = torch.Generator().manual_seed(0)
        m(input_features=torch.randn(1, 80, 3000, generator=g), decoder_input_ids=torch.tensor([[50257, 50362]]))  # fmt: skip

    quantize(model, specs, loop)
    export_ascendv1(adapter, tmp_path / "ascendv1", calls={}, source_dir=source)
    return tmp_path / "ascendv1", names


def test_the_whisper_export_describes_every_linear_under_vllms_prefix_too(tiny_export):
    out, names = tiny_export
    desc = json.loads((out / "quant_model_description.json").read_text())
    aliases = {k: v for k, v in desc.items() if is_alias(k)}
    linears = {f"{n}.weight" for n in names if n != "proj_out"}  # proj_out is no layer's prefix
    assert {aliased_key(a) for a in aliases} == linears
    assert all(desc[aliased_key(a)] == v for a, v in aliases.items())
    assert desc[".encoder.layers.0.layers.self_attn.q_proj.weight"] == "W8A8_DYNAMIC"
    assert desc[".decoder.layers.0.layers.fc2.weight"] == "FLOAT"
    assert "vllm_prefix_aliases" in desc["metadata"]["opsnn_quant"]
    # our reader takes the aliases for what they are: no tensor, its key's type
    ckpt = read_ascendv1(out)
    assert not any(is_alias(p) for p in ckpt.linears)
    assert "model.encoder.layers.0.self_attn.q_proj" in ckpt.linears


def test_an_alias_that_disagrees_with_its_key_is_refused(tmp_path, tiny_export):
    out, _ = tiny_export
    desc = json.loads((out / "quant_model_description.json").read_text())
    desc[".encoder.layers.0.layers.self_attn.q_proj.weight"] = "FLOAT"
    (out / "quant_model_description.json").write_text(json.dumps(desc))
    with pytest.raises(AscendV1Error, match=r"^\.encoder\.layers\.0\.layers\.self_attn\.q_proj\.weight: a vLLM prefix alias of model\.encoder\.layers\.0\.self_attn\.q_proj\.weight \('W8A8_DYNAMIC'\), typed 'FLOAT'$"):  # fmt: skip
        read_ascendv1(out)


def test_a_model_that_is_not_whisper_gets_no_alias(tmp_path):
    directory = handmade.write(tmp_path / "h")
    desc = json.loads((directory / "quant_model_description.json").read_text())
    assert not any(is_alias(k) for k in desc)
    desc[".stray.weight"] = "W8A8"  # a leading dot is never a tensor name: only our aliases
    (directory / "quant_model_description.json").write_text(json.dumps(desc))
    with pytest.raises(AscendV1Error, match=r"^\.stray\.weight: a vLLM prefix alias of no checkpoint key"):  # fmt: skip
        read_ascendv1(directory)
