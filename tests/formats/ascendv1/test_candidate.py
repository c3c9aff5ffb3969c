"""``evaluate --candidate DIR`` on an AscendV1 directory written here in msModelSlim's layout:
the denoiser flat (names relative to it, ``ascendv1.md`` §7), sharded with an index, ``deq_scale``
as msModelSlim stores it (the fp32 bits widened to int64, ``deqscale2int64_by_dtype``), no W8A8
weight scales (the v1 saver writes none), float biases tagged FLOAT."""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from opsnn_quant.cli import main
from opsnn_quant.formats.candidates import load_candidate
from opsnn_quant.models import load_adapter
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.modules import QuantModule
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.recording import record_roots, replay
from tests.tiny_pipelines import save_tiny_sd, tiny_t2i_suite


def _msmodelslim_tensors(unet: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors, types = {}, {}
    quantized = {n: m for n, m in unet.named_modules() if isinstance(m, QuantModule)}
    for name, t in unet.state_dict().items():
        if not any(name.startswith(f"{q}.") for q in quantized):
            tensors[name], types[name] = t.clone(), "FLOAT"
    for name, m in quantized.items():
        if m.spec.static_activations:
            deq32 = m.deq_scale.to(torch.float32).numpy().view(np.int32).astype(np.int64)
            part = {"weight": m.weight, "input_scale": m.input_quantizer.scale.reshape(1),
                    "input_offset": m.input_quantizer.offset.reshape(1),
                    "quant_bias": m.quant_bias, "deq_scale": torch.from_numpy(deq32)}  # fmt: skip
            qtype = "W8A8"
        else:
            s = m.weight_quantizer.scale.reshape(-1, 1)
            part = {"weight": m.weight, "weight_scale": s, "weight_offset": torch.zeros_like(s)}
            qtype = "W8A8_DYNAMIC"
            if m.bias is not None:
                part["bias"] = m.bias
        for suffix, t in part.items():
            tensors[f"{name}.{suffix}"] = t.contiguous()
            types[f"{name}.{suffix}"] = "FLOAT" if suffix == "bias" else qtype
    return tensors, types


def _write_msmodelslim(directory, tensors, types) -> None:
    directory.mkdir()
    names = sorted(tensors)
    shards = {"quant_model_weights-00001-of-00002.safetensors": names[::2],
              "quant_model_weights-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(directory / shard))
        weight_map.update(dict.fromkeys(members, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "quant_model_weights.safetensors.index.json").write_text(
        json.dumps(index, indent=2)
    )
    desc = {**types, "model_quant_type": "W8A8", "version": "1.0.0", "group_size": 0,
            "metadata": {}}  # fmt: skip
    (directory / "quant_model_description.json").write_text(json.dumps(desc, indent=4))


def test_an_msmodelslim_directory_is_evaluated_with_the_engines_arithmetic(tmp_path):
    save_tiny_sd(tmp_path / "pipe")
    ours = load_adapter("diffusers-sd", str(tmp_path / "pipe"), steps=2, batch_size=2)
    prompts = [{"prompt": "a red circle"}, {"prompt": "a blue square"}]
    held = record_roots(ours, ours.forward_loop(prompts), 1, seed=3)
    names = [
        n for n, m in ours.model.named_modules() if type(m) is nn.Linear and n.startswith("unet.")
    ]
    specs = {n: QuantSpec("w8a8_dynamic" if i % 3 == 0 else "w8a8") for i, n in enumerate(names)}
    quantize(ours.model, specs, ours.forward_loop(prompts))
    cand = tmp_path / "msmodelslim_unet"
    _write_msmodelslim(cand, *_msmodelslim_tensors(ours.model.unet))
    adapter, _ = load_candidate(cand, baseline=str(tmp_path / "pipe"))
    with torch.no_grad():
        y_ours = replay(ours.model.unet, held.calls["unet"][0])
        y_cand = replay(adapter.model.unet, held.calls["unet"][0])
    # our modules compute in fp32 (this package's arithmetic); the engine in its fp16 params
    # dtype (activations, 1 / input_scale in fp16): a few 1e-3 apart, a wrong layer far more
    assert float((y_ours - y_cand).norm() / y_ours.norm()) < 5e-3
    suite = tiny_t2i_suite(tmp_path, psnr_min=1.0, extra="latency: {warmup: 0, runs: 1}\n")
    report = tmp_path / "report"
    rc = main(["evaluate", "--candidate", str(cand), "--baseline", str(tmp_path / "pipe"),
               "--suite", str(suite), "-o", str(report), "--latency", "none", "--quiet"])  # fmt: skip
    assert rc == 0
    doc = json.loads((report / "report.json").read_text())
    assert "cpu-reference" in json.dumps(doc)
