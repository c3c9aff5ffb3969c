"""``calibrate --max-memory`` on Whisper (issue 43 §5): the model built on the meta device, its
encoder and decoder layers written to the offload files straight from its safetensors, and the
quantized checkpoint and AscendV1 export written block by block: the same files as in memory."""

from __future__ import annotations

from tests._deps import needs_espeak
from tests.pipeline.conftest import run_files


@needs_espeak
def test_an_offloaded_whisper_calibrate_writes_the_same_files(tmp_path, offloads):
    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe
    from tests.tiny_pipelines import save_tiny_whisper

    save_tiny_whisper(tmp_path / "w")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"name: tiny_whisper\n"
        f"model: {{family: whisper, source: {tmp_path / 'w'}, "
        "settings: {batch_size: 2, max_new_tokens: 4}}\n"
        "data: {calibration: zoo:speech/calibration, limit: 2}\n"
        "probe: {max_root_calls: 1}\n"
        "strategy: all-w8a8-dynamic\n"
        "target: ascend910b-vllm-ascend\n"
    )
    made = offloads
    run_calibrate(load_recipe(str(recipe)), tmp_path / "mem")
    assert made == []
    run_calibrate(load_recipe(str(recipe)), tmp_path / "off", max_memory=1)
    (off,) = made
    assert off.offloaded == ["model.encoder.layers.0", "model.decoder.layers.0"]
    mem, offloaded = run_files(tmp_path / "mem"), run_files(tmp_path / "off")
    assert mem.keys() == offloaded.keys()
    assert any(k.startswith("export/ascendv1/") for k in mem)
    assert [k for k in mem if mem[k] != offloaded[k]] == []


def test_an_offloaded_unet_static_calibrate_writes_the_same_files(tmp_path, offloads):
    # static int8 (quant_bias, deq_scale) and quantized Conv2d written FLOAT (their dequantized
    # weights made from the block's file when written) in both exports
    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe
    from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe

    save_tiny_sd(tmp_path / "pipe")
    recipe = tiny_sd_recipe(tmp_path, "unet", target="ascend910b-mindie-sd")
    made = offloads
    r = load_recipe(str(recipe)).with_strategy("all-w8a8-minmax")
    run_calibrate(r, tmp_path / "mem")
    run_calibrate(r, tmp_path / "off", max_memory=1 << 20)  # above the activations floor
    (off,) = made
    assert sum(n.startswith("unet.") for n in off.offloaded) > 2, off.offloaded
    mem, offloaded = run_files(tmp_path / "mem"), run_files(tmp_path / "off")
    assert mem.keys() == offloaded.keys()
    assert any(k.startswith("export/mindie-sd/unet/") for k in mem)
    assert any(k.startswith("export/ascendv1/unet/") for k in mem)
    assert [k for k in mem if mem[k] != offloaded[k]] == []
