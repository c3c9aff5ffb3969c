"""Malformed model directories (issue 41 §4): one ``error:`` line and exit 2 before the model
loads, never a traceback, never an allocation of the size a file claims, no output created.

Each case copies a tiny pipeline (or Whisper), breaks one file of it, and runs ``probe`` on it
(``calibrate`` for a few) with the loaders replaced by a function that fails the test.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opsnn_quant.cli import main
from tests.tiny_pipelines import save_tiny_sd, save_tiny_whisper


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny SD pipeline and a tiny Whisper, saved once; each case breaks a copy."""
    root = tmp_path_factory.mktemp("models")
    save_tiny_sd(root / "sd")
    (root / "prompts.txt").write_text("a red circle\na blue square\n")
    return root


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper")
    return save_tiny_whisper(root / "whisper")


def _safetensors(path: Path, header: bytes, data: bytes = b"", declared: int | None = None) -> None:
    """Replace ``path`` by a file of a hand-made header (``declared``: the length it claims)."""
    size = len(header) if declared is None else declared
    path.write_bytes(struct.pack("<Q", size) + header + data)


def _tensor(dtype: str, shape: list[Any], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def _unet_weights(header: object, data: bytes = b"", declared: int | None = None):
    def edit(model: Path) -> None:
        raw = header if isinstance(header, bytes) else json.dumps(header).encode()
        _safetensors(model / "unet" / "diffusion_pytorch_model.safetensors", raw, data, declared)

    return edit


def _config(component: str, key: str, value: Any, file: str = "config.json"):
    def edit(model: Path) -> None:
        path = model / component / file if component else model / file
        config = json.loads(path.read_text())
        config[key] = value
        path.write_text(json.dumps(config))

    return edit


def _raw_config(component: str, key: str, text: str):
    """A config value written as JSON text (``1e9`` stays a JSON number, as a user writes it)."""

    def edit(model: Path) -> None:
        path = model / component / "config.json"
        config = json.loads(path.read_text())
        config[key] = "@@"
        path.write_text(json.dumps(config).replace('"@@"', text))

    return edit


def _index(key: str, value: Any):
    return _config("", key, value, "model_index.json")


def _empty(relative: str):
    def edit(model: Path) -> None:
        (model / relative).write_bytes(b"")

    return edit


@dataclass
class Case:
    """How to break the model, the expected line, the model (``sd`` / ``whisper``), the
    command (``probe`` / ``calibrate``)."""

    name: str
    edit: Callable[[Path], None]
    line: str
    model: str = "sd"
    command: str = "probe"


ST = "unet/diffusion_pytorch_model.safetensors"
W = _tensor("F32", [2], 0, 8)

CASES = [
    # malformed safetensors in a component
    Case("header length 2^63", _unet_weights(b"{}", declared=2**63),
         f"{ST}: safetensors header of {2**63} bytes refused (limit "),
    Case("header length past the end", _unet_weights(b'{"w": {}}', declared=1000),
         f"{ST}: safetensors header of 1000 bytes refused (limit 9 for this 17-byte file)"),
    Case("header not JSON", _unet_weights(b"{not json"),
         f"{ST}: safetensors header is not valid JSON"),
    Case("header not an object", _unet_weights(b"[1, 2]"),
         f"{ST}: safetensors header is not a JSON object"),
    Case("overlapping offsets", _unet_weights({"a": W, "b": _tensor("F32", [2], 4, 12)}, b"\0" * 12),
         f"{ST}: tensors a and b overlap (data bytes 4 to 8)"),
    Case("offsets out of the file", _unet_weights({"w": _tensor("F32", [2], 0, 800)}, b"\0" * 8),
         f"{ST}: tensor w has data offsets [0, 800] outside the file (its data section is 8 bytes)"),
    Case("unknown dtype", _unet_weights({"w": _tensor("F99", [2], 0, 8)}, b"\0" * 8),
         f"{ST}: tensor w has unsupported dtype 'F99'"),
    Case("shape 1e9 x 1e9", _unet_weights({"w": _tensor("F32", [10**9, 10**9], 0, 8)}, b"\0" * 8),
         f"{ST}: tensor w: data size does not match its shape and dtype (F32 1000000000x1000000000 "
         "is 4000000000000000000 bytes, its data offsets hold 8)"),
    Case("negative shape", _unet_weights({"w": _tensor("F32", [-2], 0, 8)}, b"\0" * 8),
         f"{ST}: tensor w has a malformed shape [-2] (a list of non-negative integers)"),
    Case("0-byte file", _empty(ST),
         f"{ST}: not a safetensors file (0 bytes, shorter than 8 bytes)"),
    Case("0-byte whisper weights", _empty("model.safetensors"),
         "model.safetensors: not a safetensors file (0 bytes, shorter than 8 bytes)",
         model="whisper"),
    Case("0-byte file, calibrate", _empty(ST),
         f"{ST}: not a safetensors file (0 bytes, shorter than 8 bytes)", command="calibrate"),
    # config values absurd or of the wrong type
    Case("hidden_size 1e9", _raw_config("text_encoder", "hidden_size", "1e9"),
         "text_encoder/config.json: hidden_size is 1000000000.0; it must be an integer from 1 "
         "to 131072"),
    Case("hidden_size 'abc'", _config("text_encoder", "hidden_size", "abc"),
         "text_encoder/config.json: hidden_size is 'abc'; it must be an integer from 1 to 131072"),
    Case("hidden_size not the embedding's", _config("text_encoder", "hidden_size", 64),
         "text_encoder/config.json: hidden_size is 64, but "
         "embeddings.token_embedding.weight in model.safetensors has shape [54, 32]"),
    Case("vocab_size 1e10", _raw_config("text_encoder", "vocab_size", "1e10"),
         "text_encoder/config.json: vocab_size is 10000000000.0; it must be an integer from 1 "
         "to 4194304"),
    Case("whisper vocab_size 1e10", _raw_config("", "vocab_size", "1e10"),
         "config.json: vocab_size is 10000000000.0; it must be an integer from 1 to 4194304",
         model="whisper"),
    Case("block_out_channels [1e6]", _raw_config("unet", "block_out_channels", "[1e6]"),
         "unet/config.json: block_out_channels is [1000000.0]; it must be a list of integers "
         "from 1 to 131072"),
    Case("block_out_channels not the weights'", _config("unet", "block_out_channels", [32, 128]),
         "unet/config.json: block_out_channels[1] is 128, but "
         "down_blocks.1.resnets.0.conv1.weight in diffusion_pytorch_model.safetensors has shape "
         "[64, 32, 3, 3]"),
    Case("num_train_timesteps 1e12", _config("scheduler", "num_train_timesteps", 10**12,
                                             "scheduler_config.json"),
         "scheduler/scheduler_config.json: num_train_timesteps is 1000000000000; it must be an "
         "integer from 1 to 1000000"),
    Case("num_train_timesteps -5", _config("scheduler", "num_train_timesteps", -5,
                                           "scheduler_config.json"),
         "scheduler/scheduler_config.json: num_train_timesteps is -5; it must be an integer "
         "from 1 to 1000000"),
    Case("num_train_timesteps -5, calibrate",
         _config("scheduler", "num_train_timesteps", -5, "scheduler_config.json"),
         "scheduler/scheduler_config.json: num_train_timesteps is -5", command="calibrate"),
    Case("sample_size 1e6", _raw_config("unet", "sample_size", "1e6"),
         "unet/config.json: sample_size is 1000000.0; it must be an integer from 1 to 8192"),
    Case("num_hidden_layers -1", _config("text_encoder", "num_hidden_layers", -1),
         "text_encoder/config.json: num_hidden_layers is -1; it must be an integer from 1 to 1024"),
    Case("num_hidden_layers not the weights'", _config("text_encoder", "num_hidden_layers", 3),
         "text_encoder/config.json: num_hidden_layers is 3, but model.safetensors has the layers "
         "encoder.layers.N for N = 0"),
    Case("whisper decoder_layers not the weights'", _config("", "decoder_layers", 2),
         "config.json: decoder_layers is 2, but model.safetensors has the layers "
         "decoder.layers.N for N = 0", model="whisper"),
    # classes
    Case("pipeline _class_name os.system", _index("_class_name", "os.system"),
         "model_index.json: _class_name 'os.system' is not a class name (a plain identifier, "
         "e.g. StableDiffusionPipeline or AutoencoderKL)"),
    Case("pipeline _class_name not a diffusers class", _index("_class_name", "NoSuchPipeline"),
         "model_index.json: _class_name 'NoSuchPipeline' is not a class of diffusers"),
    Case("component library os", _index("unet", ["os", "system"]),
         "model_index.json: unet names the library 'os'; a component is loaded from diffusers or "
         "transformers (or a diffusers pipeline module) only"),
    Case("component class a module", _index("unet", ["diffusers", "utils"]),
         "model_index.json: unet's class 'utils' is not a class of diffusers"),
    Case("component config _class_name os.system", _config("unet", "_class_name", "os.system"),
         "unet/config.json: _class_name 'os.system' is not a class name"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_malformed_model_is_one_line_before_it_loads(
    case, models, tmp_path, monkeypatch, capsys, request
):
    source = models / "sd" if case.model == "sd" else request.getfixturevalue("whisper")
    model = tmp_path / "model"
    shutil.copytree(source, model)
    case.edit(model)
    import opsnn_quant.models
    import opsnn_quant.pipeline.context  # before the patch: it binds load_adapter on import,
    # and imported first under the patch it would keep the stand-in for every later test

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before its files were checked")

    monkeypatch.setattr(opsnn_quant.models, "load_adapter", refuse)
    monkeypatch.setattr("opsnn_quant.pipeline.context.load_adapter", refuse)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    if case.command == "probe":
        data = str(models / "prompts.txt")
        argv = ["probe", str(model), "--data", data, "-o", str(out), "--quiet"]
    else:
        argv = ["calibrate", "--model", str(model), "--data", str(models / "prompts.txt"),
                "--target", "ascend910b-atc", "-o", str(out), "--quiet"]  # fmt: skip
    capsys.readouterr()  # what building the fixture printed
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert err[0].startswith(f"error: {model}/{case.line}"), err[0]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
