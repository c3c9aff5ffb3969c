"""Model directories checked before they load (issue 41 §4): configs, classes, weight files."""

from __future__ import annotations

import json
import struct

import pytest

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.models.checks import (
    check_classes,
    check_component,
    check_config_against_weights,
    check_config_values,
    check_model_files,
    index_entries,
    weight_files,
)
from opsnn_quant.sources import model_path, resolve_source

# ---- config values ---------------------------------------------------------------------------

BAD_VALUES = [
    ("hidden_size", 1e9, "hidden_size is 1000000000.0; it must be an integer from 1 to 131072"),
    ("hidden_size", 10**9, "hidden_size is 1000000000; it must be an integer from 1 to 131072"),
    ("hidden_size", "abc", "hidden_size is 'abc'; it must be an integer from 1 to 131072"),
    ("hidden_size", True, "hidden_size is True; it must be an integer"),
    ("vocab_size", 1e10, "vocab_size is 10000000000.0; it must be an integer from 1 to 4194304"),
    ("block_out_channels", [1e6], "block_out_channels is [1000000.0]; it must be a list of integers from 1 to 131072"),
    ("block_out_channels", [], "block_out_channels is []; it must be a list of integers"),
    ("num_train_timesteps", 10**12, "num_train_timesteps is 1000000000000; it must be an integer from 1 to 1000000"),
    ("num_train_timesteps", -5, "num_train_timesteps is -5; it must be an integer from 1 to 1000000"),
    ("sample_size", 1e6, "sample_size is 1000000.0; it must be an integer from 1 to 8192"),
    ("sample_size", [64, 10**6], "sample_size is [64, 1000000]; it must be a list of integers from 1 to 8192"),
    ("num_hidden_layers", -1, "num_hidden_layers is -1; it must be an integer from 1 to 1024"),
    ("num_hidden_layers", 0, "num_hidden_layers is 0; it must be an integer from 1 to 1024"),
    ("pos_embed_max_size", 10**6, "pos_embed_max_size is 1000000; it must be an integer from 1 to 1024"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "message"), BAD_VALUES, ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES]
)
def test_an_absurd_config_value_is_refused(key, value, message):
    with pytest.raises(ModelLoadError) as info:
        check_config_values({key: value}, "c/config.json")
    assert str(info.value).startswith(f"c/config.json: {message}")


def test_sane_values_lists_and_nulls_pass():
    check_config_values(
        {"hidden_size": 768, "attention_head_dim": [5, 10, 20, 20], "num_attention_heads": None,
         "num_decoder_layers": 0, "patch_size": [1, 2, 2], "freq_shift": 0, "unrelated": -1},
        "c",
    )  # fmt: skip


# ---- config against the weights' shapes --------------------------------------------------------

CLIP = {
    "embeddings.token_embedding.weight": (54, 32),
    "embeddings.position_embedding.weight": (16, 32),
    "encoder.layers.0.mlp.fc1.weight": (64, 32),
    "encoder.layers.1.mlp.fc1.weight": (64, 32),
}
CLIP_CONFIG = {"vocab_size": 54, "hidden_size": 32, "max_position_embeddings": 16,
               "num_hidden_layers": 2}  # fmt: skip
UNET = {
    "conv_in.weight": (32, 4, 3, 3),
    "down_blocks.0.resnets.0.conv1.weight": (32, 32, 3, 3),
    "down_blocks.1.resnets.0.conv1.weight": (64, 32, 3, 3),
}
UNET_CONFIG = {"block_out_channels": [32, 64], "in_channels": 4}
T5 = {"shared.weight": (42, 32), "encoder.block.0.layer.0.SelfAttention.q.weight": (32, 32)}
T5_CONFIG = {"vocab_size": 42, "d_model": 32, "num_layers": 1, "num_decoder_layers": 1}
FLUX = {"transformer_blocks.0.ff.net.0.proj.weight": (1, 1),
        "single_transformer_blocks.0.proj_out.weight": (1, 1),
        "single_transformer_blocks.1.proj_out.weight": (1, 1)}  # fmt: skip
FLUX_CONFIG = {"num_layers": 1, "num_single_layers": 2}
SD3 = {"pos_embed.pos_embed": (1, 256, 32), "transformer_blocks.0.attn.to_q.weight": (32, 32)}
WHISPER = {
    "model.encoder.embed_positions.weight": (1500, 16),
    "model.decoder.embed_positions.weight": (16, 16),
    "model.decoder.embed_tokens.weight": (51864, 16),
    "model.encoder.layers.0.fc1.weight": (32, 16),
    "model.decoder.layers.0.fc1.weight": (32, 16),
}
WHISPER_CONFIG = {"d_model": 16, "vocab_size": 51864, "max_source_positions": 1500,
                  "max_target_positions": 16, "encoder_layers": 1, "decoder_layers": 1}  # fmt: skip

MATCHING = [
    ("clip", CLIP_CONFIG, CLIP),
    ("unet", UNET_CONFIG, UNET),
    ("t5", T5_CONFIG, T5),
    ("flux", FLUX_CONFIG, FLUX),
    ("sd3", {"pos_embed_max_size": 16, "num_layers": 1}, SD3),
    ("whisper", WHISPER_CONFIG, WHISPER),
    ("rules that do not apply", {"hidden_size": 7, "num_layers": 3}, UNET),
]


@pytest.mark.parametrize(
    ("config", "shapes"), [m[1:] for m in MATCHING], ids=[m[0] for m in MATCHING]
)
def test_a_config_that_describes_its_weights_passes(config, shapes):
    check_config_against_weights(config, shapes, "c", "w.safetensors")


MISMATCHED = [
    ("hidden_size vs the embedding", CLIP_CONFIG | {"hidden_size": 64}, CLIP,
     "hidden_size is 64, but embeddings.token_embedding.weight in w.safetensors has shape [54, 32]"),
    ("vocab_size vs the embedding", CLIP_CONFIG | {"vocab_size": 10**6}, CLIP,
     "vocab_size is 1000000, but embeddings.token_embedding.weight"),
    ("positions", CLIP_CONFIG | {"max_position_embeddings": 77}, CLIP,
     "max_position_embeddings is 77, but embeddings.position_embedding.weight"),
    ("fewer layers than the weights", CLIP_CONFIG | {"num_hidden_layers": 1}, CLIP,
     "num_hidden_layers is 1, but w.safetensors has the layers encoder.layers.N for N = 0..1"),
    ("more layers than the weights", CLIP_CONFIG | {"num_hidden_layers": 24}, CLIP,
     "num_hidden_layers is 24, but w.safetensors has the layers encoder.layers.N for N = 0..1"),
    ("block_out_channels[0] vs conv_in", UNET_CONFIG | {"block_out_channels": [10**6, 64]}, UNET,
     "block_out_channels[0] is 1000000, but conv_in.weight in w.safetensors has shape [32, 4, 3, 3]"),
    ("block_out_channels[1] vs its block", UNET_CONFIG | {"block_out_channels": [32, 128]}, UNET,
     "block_out_channels[1] is 128, but down_blocks.1.resnets.0.conv1.weight"),
    ("in_channels", UNET_CONFIG | {"in_channels": 9}, UNET, "in_channels is 9, but conv_in.weight"),
    ("d_model vs T5's embedding", T5_CONFIG | {"d_model": 4096}, T5, "d_model is 4096, but shared.weight"),
    ("T5 blocks", T5_CONFIG | {"num_layers": 24}, T5, "num_layers is 24, but w.safetensors has the layers encoder.block.N for N = 0"),
    ("FLUX single blocks", FLUX_CONFIG | {"num_single_layers": 38}, FLUX, "num_single_layers is 38, but w.safetensors has the layers single_transformer_blocks.N for N = 0..1"),
    ("SD3's position grid", {"pos_embed_max_size": 192}, SD3, "pos_embed_max_size is 192, but pos_embed.pos_embed"),
    ("Whisper decoder layers", WHISPER_CONFIG | {"decoder_layers": 4}, WHISPER, "decoder_layers is 4, but w.safetensors has the layers decoder.layers.N for N = 0"),
    ("Whisper decoder positions", WHISPER_CONFIG | {"max_target_positions": 448}, WHISPER,
     "max_target_positions is 448, but model.decoder.embed_positions.weight"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "shapes", "message"), [m[1:] for m in MISMATCHED], ids=[m[0] for m in MISMATCHED]
)
def test_a_config_that_does_not_describe_its_weights_is_refused(config, shapes, message):
    with pytest.raises(ModelLoadError) as info:
        check_config_against_weights(config, shapes, "c/config.json", "w.safetensors")
    assert str(info.value).startswith(f"c/config.json: {message}")
    assert str(info.value).endswith("the config does not describe these weights")


def test_layers_with_a_gap_are_refused():
    shapes = {"encoder.layers.0.w": (1,), "encoder.layers.2.w": (1,)}
    with pytest.raises(ModelLoadError, match=r"for N = \[0, 2\]"):
        check_config_against_weights({"num_hidden_layers": 3}, shapes, "c", "w")


# ---- classes ---------------------------------------------------------------------------------


def test_the_index_names_its_classes():
    index = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.42.1",
             "unet": ["diffusers", "UNet2DConditionModel"], "safety_checker": [None, None],
             "requires_safety_checker": False}  # fmt: skip
    assert index_entries(index, "i") == {
        "_class_name": ("diffusers", "StableDiffusionPipeline"),
        "unet": ("diffusers", "UNet2DConditionModel"),
    }


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({"unet": ["diffusers"]}, "unet is ['diffusers']; a component is [library, class]"),
        (
            {"unet": ["diffusers", None]},
            "unet is ['diffusers', None]; a component is [library, class] (two strings)",
        ),
        ({"../up": ["diffusers", "AutoencoderKL"]}, "'../up' is not a component name"),
    ],
)
def test_a_malformed_index_entry_is_refused(index, message):
    with pytest.raises(ModelLoadError) as info:
        index_entries(index, "i")
    assert str(info.value).startswith(f"i: {message}")


GOOD_CLASSES = {
    "_class_name": ("diffusers", "StableDiffusionPipeline"),
    "unet": ("diffusers", "UNet2DConditionModel"),
    "text_encoder": ("transformers", "CLIPTextModel"),
    "safety_checker": ("stable_diffusion", "StableDiffusionSafetyChecker"),  # SD 1.5's index
}


def test_classes_of_diffusers_transformers_and_its_pipeline_modules_pass():
    check_classes(GOOD_CLASSES, "i")


BAD_CLASSES = [
    ("_class_name", ("diffusers", "os.system"), "_class_name 'os.system' is not a class name"),
    ("_class_name", ("diffusers", "NoSuchPipeline"), "_class_name 'NoSuchPipeline' is not a class of diffusers"),
    ("_class_name", ("diffusers", 7), "_class_name 7 is not a class name"),
    ("unet", ("os", "system"), "unet names the library 'os'; a component is loaded from diffusers or transformers"),
    ("unet", ("os.path", "join"), "unet names the library 'os.path'"),
    ("unet", ("sys", "modules"), "unet names the library 'sys'"),
    ("unet", ("diffusers", "utils"), "unet's class 'utils' is not a class of diffusers"),
    ("unet", ("diffusers", "__builtins__"), "unet's class '__builtins__' is not a class of diffusers"),
    ("text_encoder", ("transformers", "CLIPTextModel.from_pretrained"), "text_encoder's class 'CLIPTextModel.from_pretrained' is not a class name"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "entry", "message"), BAD_CLASSES, ids=[f"{n}={e}" for n, e, _ in BAD_CLASSES]
)
def test_a_class_outside_the_libraries_is_refused(name, entry, message):
    with pytest.raises(ModelLoadError) as info:
        check_classes({name: entry}, "i")
    assert str(info.value).startswith(f"i: {message}")


# ---- files -----------------------------------------------------------------------------------


def _safetensors(path, tensors: dict[str, list[int]]) -> None:
    """An F32 safetensors file of zeros with these shapes."""
    header, at = {}, 0
    for name, shape in tensors.items():
        n = 4 * (shape[0] * shape[1] if len(shape) == 2 else shape[0])
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * at)


def test_the_weight_files_are_those_the_load_reads(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "model.fp16.safetensors").write_bytes(b"")
    assert weight_files(tmp_path) == [tmp_path / "model.safetensors"]
    (tmp_path / "model.safetensors").unlink()
    assert weight_files(tmp_path) == [tmp_path / "model.fp16.safetensors"]  # another layout: all


def test_sharded_weights_are_checked_shard_by_shard(tmp_path):
    _safetensors(tmp_path / "model-1.safetensors", {"encoder.layers.0.w": [2]})
    _safetensors(tmp_path / "model-2.safetensors", {"encoder.layers.1.w": [2]})
    index = {"weight_map": {"encoder.layers.0.w": "model-1.safetensors",
                            "encoder.layers.1.w": "model-2.safetensors"}}  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    assert [p.name for p in weight_files(tmp_path)] == [
        "model-1.safetensors",
        "model-2.safetensors",
    ]
    check_component(tmp_path, "transformers")
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 3}))
    with pytest.raises(ModelLoadError, match=r"model-1\.safetensors, model-2\.safetensors has the"):
        check_component(tmp_path, "transformers")


@pytest.mark.parametrize("shard", ["../model-1.safetensors", "missing.safetensors", ".hidden"])
def test_an_index_naming_a_shard_outside_the_directory_is_refused(tmp_path, shard):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(ModelLoadError, match=f"shard '{shard}' not found"):
        weight_files(tmp_path)


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    _safetensors(tmp_path / "a.safetensors", {"w": [2]})
    _safetensors(tmp_path / "b.safetensors", {"w": [2]})
    with pytest.raises(
        ModelLoadError, match=r"tensor w is in both a\.safetensors and b\.safetensors"
    ):
        check_component(tmp_path, "transformers")


def test_a_config_that_is_not_json_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ModelLoadError, match=r"config\.json is not valid JSON"):
        check_model_files(resolve_source(str(tmp_path)))


def test_the_zoo_models_and_what_is_no_model_directory_pass(tmp_path):
    for name in ("zoo:shapes-t2i", "zoo:shapes-dit"):
        check_model_files(resolve_source(str(model_path(name))))
    check_model_files(resolve_source("zoo:shapes-t2i"))
    check_model_files(resolve_source(str(tmp_path)))  # neither model_index.json nor config.json
    check_model_files(resolve_source(str(tmp_path / "missing")))


def test_load_adapter_checks_the_files_before_the_settings_read_their_limits(tmp_path):
    # num_train_timesteps -5 would otherwise read "steps: 20 is more than the -5 timesteps"
    import shutil

    from opsnn_quant.models import load_adapter

    shutil.copytree(model_path("zoo:shapes-t2i"), tmp_path / "m")
    config = tmp_path / "m" / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"num_train_timesteps": -5}))
    with pytest.raises(ModelLoadError, match="num_train_timesteps is -5; it must be an integer"):
        load_adapter("diffusers-sd", str(tmp_path / "m"))
