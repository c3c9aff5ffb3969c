"""``calibrate`` writes the deployable outputs; ``export-weights`` redoes them byte for byte."""

from __future__ import annotations

import json

import pytest

from opsnn_quant.cli import main
from tests.tiny_pipelines import save_tiny_sd


def _files(root):
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_calibrate_writes_ascendv1_msmodelslim_and_atc_and_export_weights_repeats_them(tmp_path):
    save_tiny_sd(tmp_path / "pipe")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"name: tiny\nmodel: {{family: diffusers-sd, source: {tmp_path / 'pipe'}, "
        f"settings: {{steps: 1, batch_size: 1}}}}\ndata: {{calibration: {prompts}}}\n"
        f"probe: {{max_root_calls: 1}}\ntarget: ascend910b-atc\n"
    )
    out = tmp_path / "out"
    assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 0
    av1 = out / "export" / "ascendv1"
    assert (av1 / "model_index.json").read_bytes() == (
        tmp_path / "pipe" / "model_index.json"
    ).read_bytes()
    for component in ("text_encoder", "unet"):
        desc = json.loads((av1 / component / "quant_model_description.json").read_text())
        assert desc["version"] == "1.0.0" and desc["model_quant_type"] == "W8A8"
        assert (av1 / component / "quant_model_weights.safetensors").is_file()
        assert (av1 / component / "config.json").is_file()
    # every quantized Conv2d is exported float, and says so in the description and the notes
    unet = json.loads((av1 / "unet" / "quant_model_description.json").read_text())
    floats = unet["metadata"]["opsnn_quant"]["exported_float"]
    assert floats["conv_in"].startswith("a quantized Conv2d") and unet["conv_in.weight"] == "FLOAT"
    notes = (out / "export" / "ascendv1.notes.txt").read_text()
    assert "quantized Conv2d exported FLOAT" in notes
    assert (out / "export" / "msmodelslim_v1.yaml").read_text().startswith("# msModelSlim")
    for root in ("unet", "vae.decoder", "text_encoder"):
        assert (out / "export" / "atc" / f"{root}.sh").is_file()
        assert (out / "export" / "atc" / f"{root}.qdq.onnx").is_file()
    # the same files again from quant/ (SmoothQuant folds traced on the same prompt)
    again = tmp_path / "again"
    rc = main(["export-weights", str(out), "-f", "ascendv1", "-o", str(again),
               "--data", str(prompts), "--quiet"])  # fmt: skip
    assert rc == 0
    mine = {k: v for k, v in _files(av1).items() if not k.endswith(".opsnn-quant.json")}
    redo = {
        k: v for k, v in _files(again / "ascendv1").items() if not k.endswith(".opsnn-quant.json")
    }
    assert mine.keys() == redo.keys() and all(mine[k] == redo[k] for k in mine)


def test_export_weights_refuses_bad_input_before_loading(tmp_path, capsys):
    (tmp_path / "nothing").mkdir()
    assert main(["export-weights", str(tmp_path / "nothing")]) == 2
    assert "description.json not found" in capsys.readouterr().err
    assert main(["export-weights", str(tmp_path / "nothing"), "-f", "onnx"]) == 2
    assert "--format must be one of ascendv1, mindie-sd, atc" in capsys.readouterr().err


def test_an_export_whose_engine_runs_no_int8_attention_says_which_modules_stay_float():
    import torch
    from diffusers.models.attention_processor import Attention
    from torch import nn

    from opsnn_quant.formats.registry import exporter
    from opsnn_quant.models.generic import GenericAdapter
    from opsnn_quant.pipeline.model_exports import _float_attention
    from opsnn_quant.quant.api import quantize

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), Attention(query_dim=64, heads=2, dim_head=32))
    data = [torch.randn(2, 8, 16)]
    quantize(model, {"1": "a8", "0": "w8a8"}, lambda m: [m(x) for x in data])
    adapter = GenericAdapter(model, {"": "denoiser"}, lambda m: None)
    (note,) = _float_attention(adapter, exporter("ascendv1"))
    assert note.startswith("1 int8 attention module(s) (1) are float in this export: vLLM-Ascend")
    assert "FP8RotateQuantFA" in _float_attention(adapter, exporter("mindie-sd"))[0]
    assert "Linear/Conv2d only" in _float_attention(adapter, exporter("atc"))[0]
    # a model without int8 attention: nothing to say
    plain = GenericAdapter(nn.Linear(4, 4), {"": "denoiser"}, lambda m: None)
    assert _float_attention(plain, exporter("ascendv1")) == []
