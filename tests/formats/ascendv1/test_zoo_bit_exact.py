"""The zoo models quantized for vLLM-Ascend's arithmetic (``QuantSpec.engine="vllm-ascend"``,
bfloat16 params), exported to AscendV1 and run by the consumer (vLLM-Ascend's Linear methods,
written from its source) give our quantized model's outputs bit for bit, on held-out inputs,
for every scheme vLLM-Ascend runs (static symmetric and asymmetric, per token, weight only):
every quantized Linear on the inputs it gets in our model, and every root.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from opsnn_quant.core.determinism import set_reproducible
from opsnn_quant.formats.ascendv1.candidate import load_ascendv1_candidate
from opsnn_quant.formats.ascendv1.export import export_ascendv1
from opsnn_quant.models import load_adapter
from opsnn_quant.models.data import load_records
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.modules import is_quant_module
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.recording import record_roots, replay
from tests._deps import needs_espeak

VLLM = {"engine": "vllm-ascend", "output_dtype": "bfloat16"}
SCHEMES = [
    QuantSpec("w8a8", **VLLM),  # type: ignore[arg-type]
    QuantSpec("w8a8", activation_symmetric=False, observer="percentile", **VLLM),  # type: ignore[arg-type]
    QuantSpec("w8a8_dynamic", **VLLM),  # type: ignore[arg-type]
    QuantSpec("w8a16", **VLLM),  # type: ignore[arg-type]
]


def _linear_specs(model: nn.Module, skip: str = "\0") -> dict[str, QuantSpec]:
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear and skip not in n]
    return {n: SCHEMES[i % len(SCHEMES)] for i, n in enumerate(names)}


def _compare(ours, consumer, recorded) -> None:
    """Every quantized Linear, on the inputs it gets in our model on the held-out calls, and
    every root, is bit for bit the consumer's."""
    a, c = dict(ours.model.named_modules()), dict(consumer.model.named_modules())
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    hooks = [a[n].register_forward_hook(lambda m, i, o, n=n: seen.setdefault(n, []).append(
        (i[0].detach().clone(), o.detach().clone()))) for n in a if is_quant_module(a[n])]  # fmt: skip
    checked = 0
    with torch.no_grad():
        for root, calls in recorded.calls.items():
            for call in calls:
                seen.clear()
                y_ours = replay(a[root], call)
                checked += len(seen)
                for name, pairs in seen.items():
                    for x, y in pairs:
                        assert torch.equal(y, c[name](x)), f"{name} ({root}) differs"
                assert torch.equal(y_ours, replay(c[root], call)), root
    for h in hooks:
        h.remove()
    assert checked > 10


@pytest.mark.slow
def test_shapes_t2i_consumer_reproduces_our_quantized_pipeline_bit_for_bit(tmp_path):
    set_reproducible(seed=0)
    ours = load_adapter("diffusers-sd", "zoo:shapes-t2i", steps=2, batch_size=2)
    held_out = record_roots(ours, ours.forward_loop(load_records("zoo:shapes/eval", 2)), 2, seed=3)
    # every Linear but the VAE encoder's (text-to-image never runs it: nothing to calibrate)
    specs = _linear_specs(ours.model, skip="vae.encoder")
    quantize(ours.model, specs, ours.forward_loop(load_records("zoo:shapes/calibration", 2)))
    out = tmp_path / "ascendv1"
    result = export_ascendv1(ours, out, calls=held_out.calls)
    assert set(result.components) == {"text_encoder", "unet", "vae"}
    assert not any(e.exported_float for e in result.components.values())
    # the engines read the checkpoint's names: transformers 5 drops CLIP's "text_model." prefix
    desc = json.loads((out / "text_encoder" / "quant_model_description.json").read_text())
    assert desc["text_model.encoder.layers.0.self_attn.q_proj.weight"] == "W8A8_DYNAMIC"
    assert desc["model_quant_type"] == "W8A8" and desc["version"] == "1.0.0"
    assert (out / "model_index.json").is_file() and (out / "unet" / "config.json").is_file()
    consumer = load_ascendv1_candidate(out, "zoo:shapes-t2i")
    _compare(ours, consumer, held_out)


@pytest.mark.slow
@needs_espeak
def test_whisper_consumer_reproduces_our_quantized_model_bit_for_bit(tmp_path):
    set_reproducible(seed=0)
    ours = load_adapter("whisper", "zoo:whisper-tiny.en", batch_size=2, max_new_tokens=8)
    held_out = record_roots(ours, ours.forward_loop(load_records("zoo:speech/eval", 2)), 1, seed=3)
    quantize(
        ours.model,
        _linear_specs(ours.model),
        ours.forward_loop(load_records("zoo:speech/calibration", 2)),
    )
    out = tmp_path / "ascendv1"
    export_ascendv1(ours, out, calls=held_out.calls)
    desc = json.loads((out / "quant_model_description.json").read_text())
    assert desc["proj_out.weight"] in {"W8A8", "W8A8_DYNAMIC", "W8A16"}
    assert desc["model.decoder.embed_tokens.weight"] == "FLOAT"
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    # what `vllm serve` picks with --dtype auto: the params dtype the Linears were written for
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    consumer = load_ascendv1_candidate(out, "zoo:whisper-tiny.en")
    _compare(ours, consumer, held_out)
