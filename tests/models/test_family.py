"""The family table (opsnn_quant/models/family.py): a family is one registration, the built-ins
and a team's own alike. A toy family defined here, outside the package (its own config file, a
trivial adapter), is calibrated by the command line once registered, and found by detection."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import Field
from safetensors.torch import load_file, save_file
from torch import nn

from opsnn_quant import Family, FamilySettings, ModelAdapter, register_family
from opsnn_quant.cli import main
from opsnn_quant.errors import CalibrationError, ConfigError, ModelLoadError
from opsnn_quant.models import (
    check_weights,
    family_names,
    guess_family,
    load_adapter,
    unregister_family,
)
from opsnn_quant.models import family as family_table
from opsnn_quant.models.data import check_records
from opsnn_quant.pipeline.recipe import Recipe
from opsnn_quant.sources import resolve_source
from opsnn_quant.types import ForwardLoop, Modality

CONFIG = "toy.cfg"  # the toy's own format: key = value lines


class ToySettings(FamilySettings):
    """The toy's run settings."""

    batch_size: int = Field(default=2, gt=0)
    gain: float = Field(default=1.0, gt=0.0)


def _read_cfg(path: Path) -> dict[str, int]:
    pairs = (line.split("=") for line in path.read_text().splitlines() if "=" in line)
    return {k.strip(): int(v) for k, v in pairs}


def _inputs(prompts: Sequence[str], width: int, gain: float) -> torch.Tensor:
    """A prompt as ``width`` numbers from its characters (a deterministic toy embedding)."""
    rows = [[(ord(c) % 17) / 8.0 * gain for c in p[:width].ljust(width)] for p in prompts]
    return torch.tensor(rows, dtype=torch.float32)


class ToyAdapter(ModelAdapter):
    """Two Linear layers over a prompt's characters."""

    family = "toy"
    task = "toy"

    def __init__(self, model: nn.Module, width: int, settings: ToySettings, model_id: str):
        self.model, self.width, self.settings, self.model_id = model, width, settings, model_id
        self.net: nn.Module = model.get_submodule("net")

    @classmethod
    def load(cls, source, settings, dtype, *, allow_pickle=False, skeletons=None) -> ToyAdapter:
        cfg = _read_cfg(Path(source) / CONFIG)
        width = cfg["width"]
        net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        model = nn.Module()
        model.net = net
        model.load_state_dict(load_file(str(Path(source) / "model.safetensors")))
        return cls(model.to(dtype), width, settings, source)

    def modalities(self) -> dict[str, Modality]:
        return {"net": Modality.DENOISER}

    def roots(self) -> dict[str, Modality]:
        return {"net": Modality.DENOISER}

    def forward_loop(self, data, limit=None, first_batch=0) -> ForwardLoop:
        prompts = [r["prompt"] for r in data][:limit]
        size = self.settings.batch_size

        def loop(model: nn.Module) -> None:
            for i in range(0, len(prompts), size):
                model.get_submodule("net")(
                    _inputs(prompts[i : i + size], self.width, self.settings.gain)
                )

        return loop

    def generate(self, inputs: Sequence[Any], seed: int = 0) -> list[Any]:
        x = _inputs([r["prompt"] for r in inputs], self.width, self.settings.gain)
        with torch.no_grad():
            return list(self.net(x))


def _prompts(records: Sequence[Any]) -> list[str]:
    bad = [i for i, r in enumerate(records) if not 0 < len(str(r.get("prompt", ""))) <= 64]
    if bad:
        raise CalibrationError(f"sample {bad[0]} is no prompt of 1 to 64 characters")
    return [r["prompt"] for r in records]


def _weights(source: str, path: Path, allow_pickle: bool) -> None:
    if not (path / "model.safetensors").is_file():
        raise ModelLoadError(f"{source}: a toy model keeps its weights in model.safetensors")


TOY = Family(
    name="toy",
    adapter=ToyAdapter,
    settings=ToySettings,
    detect=lambda path: (path / CONFIG).is_file(),
    layout=CONFIG,
    check_weights=_weights,
    takes="prompts of text",
    check_records=_prompts,
)


@pytest.fixture
def toy(tmp_path):
    """The toy family registered (and removed after), a model directory of it and prompts."""
    register_family(TOY)
    model = tmp_path / "toy-model"
    model.mkdir()
    (model / CONFIG).write_text("width = 16\n")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    save_file({f"net.{k}": v.contiguous() for k, v in net.state_dict().items()},
              str(model / "model.safetensors"))  # fmt: skip
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\na green star\na pink cross\n")
    yield model, prompts
    unregister_family("toy")


@pytest.mark.parametrize("named", [True, False], ids=["--family toy", "detected"])
def test_a_family_registered_from_outside_calibrates_from_the_command_line(
    toy, tmp_path, named, capsys
):
    model, prompts = toy
    out = tmp_path / "out"
    argv = ["calibrate", "--model", str(model), "--data", str(prompts), "--set", "gain=0.5",
            "--limit", "4", "--target", "cpu-reference", "-o", str(out), "--quiet"]  # fmt: skip
    assert main(argv + (["--family", "toy"] if named else [])) == 0, capsys.readouterr().err
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    # the toy's settings model gave the settings: its defaults, the --set value over them
    assert recipe["model"]["family"] == "toy"
    assert recipe["model"]["settings"] == {"batch_size": 2, "gain": 0.5}
    probe = json.loads((out / "probe.json").read_text())
    assert probe["config"]["family"] == "toy"
    names = {m["name"] for m in probe["modules"]}
    assert {"net.0", "net.2"} <= names
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    assert policy["target"] == "cpu-reference"
    # the quantized weights are the toy's own, int8 per output channel (rint(w / (amax / 127)))
    saved = load_file(str(model / "model.safetensors"))
    quant = load_file(str(out / "quant" / "model.safetensors"))
    modules = json.loads((out / "quant" / "description.json").read_text())["modules"]
    assert set(modules) == {"net.0", "net.2"}
    plain = [m for m, d in modules.items()
             if d["spec"]["smoothquant_alpha"] is None and "weight_rounding" not in d["spec"]]  # fmt: skip
    assert plain  # a layer neither smoothed nor GPTQ-rounded: its int8 weight is the stored one
    for m in plain:
        w = saved[f"{m}.weight"]
        scale = w.abs().amax(dim=1) / 127
        torch.testing.assert_close(quant[f"{m}.weight_quantizer.scale"], scale)
        assert torch.equal(quant[f"{m}.weight"], torch.round(w / scale[:, None]).to(torch.int8))


def test_the_command_line_refuses_what_the_family_refuses_before_any_work(toy, tmp_path, capsys):
    model, prompts = toy
    out = tmp_path / "out"
    base = ["calibrate", "--model", str(model), "--data", str(prompts), "-o", str(out), "--quiet"]
    assert main([*base, "--set", "gian=2"]) == 2  # the toy's settings model lists its keys
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: --set gian: Extra inputs are not permitted; did you mean 'gain'?; "
        "toy settings are: batch_size, gain"
    )
    prompts.write_text("a red circle\n" + "a long line " * 8 + "\n")  # the toy's records check
    assert main(base) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: the calibration data {prompts}: sample 1 is no prompt of 1 to 64 characters "
        "(a toy model takes prompts of text)"
    )
    (model / "model.safetensors").rename(model / "weights.safetensors")  # its weight check
    with pytest.raises(
        ModelLoadError, match=r"a toy model keeps its weights in model\.safetensors"
    ):
        check_weights(resolve_source(str(model)))
    assert main(base) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()


def test_the_tables_read_the_registration(toy):
    model, prompts = toy
    assert family_names()[-1] == "toy" and guess_family(resolve_source(str(model))) == "toy"
    adapter = load_adapter(None, str(model), gain=2.0)
    assert isinstance(adapter, ToyAdapter) and adapter.settings == ToySettings(gain=2.0)
    with pytest.raises(ConfigError, match=r"toy settings: gian: .*the keys: batch_size, gain"):
        load_adapter("toy", str(model), gian=2.0)
    with pytest.raises(
        CalibrationError, match=r"^X: sample 1 is no .* \(a toy model takes prompts of text\)$"
    ):
        check_records("toy", [{"prompt": "a"}, {"prompt": ""}], "X")
    with pytest.raises(ConfigError, match="'toy' is registered already"):
        register_family(TOY)
    with pytest.raises(ConfigError, match="settings model ToySettings is toy's"):
        register_family(dataclasses.replace(TOY, name="toy-2"))
    with pytest.raises(ConfigError, match="must subclass FamilySettings"):
        register_family(dataclasses.replace(TOY, name="toy-2", settings=dict))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lower-case letters"):
        register_family(dataclasses.replace(TOY, name="Toy 2"))
    recipe = {"name": "t", "model": {"family": "toy", "source": str(model)},
              "data": {"calibration": str(prompts)}, "probe": {"timestep_groups": 2}}  # fmt: skip
    with pytest.raises(ValueError, match="toy models have no denoising steps"):
        Recipe.model_validate(recipe)  # no sampling steps (Family.steps)
    unregister_family("toy")
    with pytest.raises(ModelLoadError, match="unknown model family 'toy'"):
        load_adapter("toy", str(model))
    with pytest.raises(ModelLoadError, match="cannot tell the model family"):
        guess_family(resolve_source(str(model)))


def test_a_plugin_registers_by_entry_point_and_is_listed(monkeypatch, capsys):
    class EntryPoint:
        name = "toy"

        def load(self):
            return TOY

    monkeypatch.setattr(family_table, "entry_points", lambda group: [EntryPoint()])
    family_table._load_plugins.cache_clear()
    try:
        assert "toy" in family_names()
        assert main(["builtins"]) == 0
        listed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("family")]
        assert listed[0].split() == [
            "family",
            "diffusers-sd",
            "recipe",
            "sd15-template,",
            "suite",
            "sd15-template;",
            "target",
            "ascend910b-mindie-sd",
        ]
        assert listed[-1].split() == ["family", "toy", "-;", "target", "cpu-reference"]
    finally:
        unregister_family("toy")
        family_table._load_plugins.cache_clear()
