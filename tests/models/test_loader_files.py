"""Which files of a model directory the loaders read (issue 58 §1, §5): the helper and weight
files at the top of a transformers model or of each component a pipeline's index names; a
dotfile, a ``.git``, a key, a README, a folder the index does not name are read by none. Every
file read must be a regular file inside the directory, weights included: checked before any
work (a hub cache snapshot's links into its ``blobs/`` count as inside)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.models import check_weights
from opsnn_quant.models.loader_files import (
    CACHE_STAMP,
    check_model_sources,
    is_helper,
    model_files,
)
from opsnn_quant.sources import resolve_source


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _rel(root: Path, paths: list[Path]) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


def test_the_files_of_a_transformers_model_its_loaders_read(tmp_path):
    _write(tmp_path, {
        "config.json": "{}", "generation_config.json": "{}", "tokenizer.json": "{}",
        "merges.txt": "", "spiece.model": "", "chat_template.jinja": "", "modeling_x.py": "",
        "model.safetensors": "", "pytorch_model.bin": "", "flax_model.msgpack": "",
        "README.md": "", "id_rsa": "", ".env": "", ".git/config": "", ".git/lfs/objects/b": "",
        "runs/events.json": "", CACHE_STAMP: "{}", ".opsnn-quant.json": "{}",
    })  # fmt: skip
    found = model_files(tmp_path)
    assert not found.pipeline
    assert _rel(tmp_path, found.read[""]) == [
        "chat_template.jinja", "config.json", "generation_config.json", "merges.txt",
        "model.safetensors", "modeling_x.py", "pytorch_model.bin", "spiece.model",
        "tokenizer.json",
    ]  # fmt: skip
    # our own files (the cache's stamp, a marker) are neither read nor reported
    assert found.left_out == {
        ".env": "hidden file", ".git/": "VCS tree", "README.md": "not read by the engine",
        "flax_model.msgpack": "not read by the engine", "id_rsa": "not read by the engine",
        "runs/": "not read by the engine",
    }  # fmt: skip


def test_the_files_of_a_pipeline_are_those_of_the_components_its_index_names(tmp_path):
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "U"],
             "tokenizer": ["transformers", "T"], "safety_checker": [None, None]}  # fmt: skip
    _write(tmp_path, {
        "model_index.json": json.dumps(index), "v1-5-pruned.safetensors": "", "README.md": "",
        "unet/config.json": "{}", "unet/diffusion_pytorch_model.safetensors": "",
        "unet/.cache/x.json": "", "unet/notes.md": "", "unet/old/config.json": "",
        "tokenizer/vocab.json": "{}", "tokenizer/merges.txt": "",
        "safety_checker/config.json": "{}", "_tok/vocab.json": "{}", ".huggingface/x": "",
    })  # fmt: skip
    found = model_files(tmp_path)
    assert found.pipeline
    assert {k: _rel(tmp_path, v) for k, v in found.read.items()} == {
        "": ["model_index.json"],
        "tokenizer": ["tokenizer/merges.txt", "tokenizer/vocab.json"],
        "unet": ["unet/config.json", "unet/diffusion_pytorch_model.safetensors"],
    }
    assert found.left_out == {
        ".huggingface/": "hidden directory", "README.md": "not read by the engine",
        "_tok/": "not a component named in model_index.json",
        "safety_checker/": "not a component named in model_index.json",
        "unet/.cache/": "hidden directory", "unet/notes.md": "not read by the engine",
        "unet/old/": "not read by the engine",
        "v1-5-pruned.safetensors": "not read by the engine",
    }  # fmt: skip


def test_helpers_are_msmodelslims_copy_files_globs_and_tokenizer_models():
    # msModelSlim save/ascendv1.py copy_files: *.json, *.py, *.txt, *.jinja (the floor)
    for name in ("config.json", "modeling.py", "merges.txt", "chat_template.jinja",
                 "tokenizer.model", "spiece.model", "cl100k.tiktoken"):  # fmt: skip
        assert is_helper(name), name
    for name in (".env", ".config.json", "id_rsa", "README.md", "model.safetensors", "a.yaml"):
        assert not is_helper(name), name


def test_the_zoo_caches_stamp_is_ours():
    from opsnn_quant.zoo.whisper import STAMP_NAME

    assert CACHE_STAMP == STAMP_NAME


def _pipeline(root: Path) -> Path:
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "U"],
             "scheduler": ["diffusers", "S"]}  # fmt: skip
    _write(root, {"model_index.json": json.dumps(index), "unet/config.json": "{}",
                  "scheduler/scheduler_config.json": "{}"})  # fmt: skip
    return root


def test_a_weight_file_linked_out_of_the_model_is_refused(tmp_path):
    model = _pipeline(tmp_path / "m")
    elsewhere = tmp_path / "elsewhere" / "u.safetensors"
    _write(tmp_path, {"elsewhere/u.safetensors": "x"})
    (model / "unet" / "diffusion_pytorch_model.safetensors").symlink_to(elsewhere)
    want = (
        f"model file {model}/unet/diffusion_pytorch_model.safetensors resolves to {elsewhere}, "
        f"outside {model}; opsnn-quant reads (and exports) only regular files inside the model "
        "directory: replace it with the file itself (a copy or a hard link) or remove it"
    )
    with pytest.raises(ModelLoadError) as err:
        check_model_sources(resolve_source(str(model)))
    assert str(err.value) == want
    with pytest.raises(ModelLoadError) as err:  # the check every command makes first
        check_weights(resolve_source(str(model)), allow_pickle=True)
    assert str(err.value) == want
    # a link inside the model directory is the file it names; a hard link is a regular file
    (model / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    (model / "unet" / "w.safetensors").write_text("x")
    (model / "unet" / "diffusion_pytorch_model.safetensors").symlink_to("w.safetensors")
    check_model_sources(resolve_source(str(model)))
    (model / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    os.link(elsewhere, model / "unet" / "diffusion_pytorch_model.safetensors")
    check_model_sources(resolve_source(str(model)))


@pytest.mark.parametrize(
    "rel, make, said",
    [
        ("unet/diffusion_pytorch_model.safetensors", "fifo", "is a named pipe (FIFO), not a regular file"),
        ("unet/diffusion_pytorch_model.bin", "dangling", "is a link to a missing file"),
        ("scheduler/scheduler_config.json", "fifo", "is a named pipe (FIFO), not a regular file"),
        ("unet/config.json", "devzero", "resolves to /dev/zero, outside"),
        ("model_index.json", "passwd", "resolves to /etc/passwd, outside"),
    ],
)  # fmt: skip
def test_a_file_the_loaders_read_that_is_no_regular_file_inside_is_refused(
    tmp_path, rel, make, said
):
    model = _pipeline(tmp_path / "m")
    path = model / rel
    path.unlink(missing_ok=True)
    {"fifo": lambda: os.mkfifo(path), "dangling": lambda: path.symlink_to("gone"),
     "devzero": lambda: path.symlink_to("/dev/zero"),
     "passwd": lambda: path.symlink_to("/etc/passwd")}[make]()  # fmt: skip
    with pytest.raises(ModelLoadError, match="^" + re.escape(f"model file {path} {said}")):
        check_model_sources(resolve_source(str(model)))


def test_a_component_folder_linked_out_is_refused_an_unread_one_is_not_looked_at(tmp_path):
    model = _pipeline(tmp_path / "m")
    _write(tmp_path, {"shared/config.json": "{}"})
    (model / "scheduler" / "scheduler_config.json").unlink()
    (model / "scheduler").rmdir()
    (model / "scheduler").symlink_to(tmp_path / "shared")
    with pytest.raises(ModelLoadError, match=f"model file {model}/scheduler resolves to "):
        check_model_sources(resolve_source(str(model)))
    (model / "scheduler").unlink()
    # what no loader reads may be anything: a key linked out, a FIFO, a .git of links
    (model / "id_rsa").symlink_to("/etc/passwd")
    os.mkfifo(model / "README.md")
    (model / ".git").mkdir()
    (model / ".git" / "config.json").symlink_to("/etc/passwd")
    (model / "not_in_index").symlink_to(tmp_path / "shared")
    check_model_sources(resolve_source(str(model)))


def test_a_hub_cache_snapshot_links_its_weights_into_its_blobs(tmp_path):
    repo = tmp_path / "hub" / "models--me--tiny"
    snap = repo / "snapshots" / "0123abc"
    _write(repo, {"blobs/h1": "{}", "blobs/h2": "x"})
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/h1")
    (snap / "model.safetensors").symlink_to("../../blobs/h2")
    check_model_sources(resolve_source(str(snap)))
    (repo / "blobs" / "h2").unlink()
    (repo / "blobs" / "h2").symlink_to(tmp_path / "elsewhere.safetensors")
    (tmp_path / "elsewhere.safetensors").write_text("x")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors resolves to .*elsewhere"):
        check_model_sources(resolve_source(str(snap)))


def test_a_model_directory_that_cannot_be_listed_is_one_line(tmp_path, monkeypatch):
    def refused(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("opsnn_quant.models.loader_files.os.scandir", refused)
    with pytest.raises(
        ModelLoadError, match=f"^{tmp_path}: cannot be read \\(Permission denied\\)$"
    ):
        check_model_sources(resolve_source(str(tmp_path)))
