"""Issue 58 §5 at the CLI: a model whose weights (or configs, tokenizer files) link out of its
directory is refused before any work by every command that reads it (``calibrate``, ``probe``,
``export-weights``, ``evaluate --candidate`` / ``--baseline``): exit 2, one ``error:`` line naming
the file and where it leads, no model loaded, no output and no ``.tmp-`` sibling left. Before,
``unet/diffusion_pytorch_model.safetensors -> /elsewhere/u.safetensors`` was quantized (rc 0 on
``cpu-reference``) and other targets were refused only at the export, after the whole probe.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from opsnn_quant.cli import main
from opsnn_quant.formats.checkpoint import FORMAT, SCHEMA_VERSION
from tests.tiny_pipelines import save_tiny_sd, save_tiny_whisper, tiny_t2i_suite

WEIGHTS = "unet/diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny SD pipeline, its prompts and a two-prompt suite, saved once."""
    root = tmp_path_factory.mktemp("model-files")
    save_tiny_sd(root / "pipe")
    (root / "prompts.txt").write_text("a red circle\na blue square\n")
    tiny_t2i_suite(root)
    return root


def _linked_out(tiny: Path, tmp: Path, rel: str = WEIGHTS) -> tuple[Path, Path]:
    """A copy of the pipeline whose ``rel`` is a link to the same file kept elsewhere."""
    model = tmp / "model"
    shutil.copytree(tiny / "pipe", model)
    elsewhere = tmp / "elsewhere" / Path(rel).name
    elsewhere.parent.mkdir()
    (model / rel).rename(elsewhere)  # the same bytes: only where they live is wrong
    (model / rel).symlink_to(elsewhere)
    return model, elsewhere


def _calibrated(tmp: Path, source: Path) -> Path:
    """A calibrate output's files read before any model loads: its quantized checkpoint's
    description (naming the float model) and its policy."""
    out = tmp / "done"
    (out / "quant").mkdir(parents=True)
    description = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "modules": {},
                   "source_model": str(source)}  # fmt: skip
    (out / "quant" / "description.json").write_text(json.dumps(description))
    (out / "policy.yaml").write_text("")
    return out


def _no_load(monkeypatch) -> None:
    import opsnn_quant.models
    import opsnn_quant.pipeline.context  # imported before the patch: it binds load_adapter

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before its files were checked")

    monkeypatch.setattr(opsnn_quant.models, "load_adapter", refuse)
    monkeypatch.setattr("opsnn_quant.pipeline.context.load_adapter", refuse)


def _errors(stderr: str) -> list[str]:
    """stderr without the progress lines (printed when not a terminal)."""
    return [ln for ln in stderr.strip().splitlines() if not re.match(r"^\[\s*\d+\.\d s\]", ln)]


def _refused(argv: list[str], out: Path, capsys, monkeypatch) -> str:
    _no_load(monkeypatch)
    capsys.readouterr()
    assert main(argv) == 2
    err = _errors(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists() and not list(out.parent.glob(f"{out.name}.tmp-*"))
    return err[0]


def _line(path: Path, elsewhere: Path, model: Path) -> str:
    return (
        f"error: model file {path} resolves to {elsewhere}, outside {model}; opsnn-quant reads "
        "(and exports) only regular files inside the model directory: replace it with the file "
        "itself (a copy or a hard link) or remove it"
    )


COMMANDS = {
    "calibrate --model": lambda m, t, o: ["calibrate", "--model", str(m), "--data",
                                          str(t / "prompts.txt"), "--target", "cpu-reference",
                                          "-o", str(o)],
    "calibrate RECIPE": lambda m, t, o: ["calibrate", str(_recipe(m, t, o.parent)), "-o", str(o)],
    "probe": lambda m, t, o: ["probe", str(m), "--data", str(t / "prompts.txt"), "-o", str(o)],
    "export-weights": lambda m, t, o: ["export-weights", str(_calibrated(o.parent, m)), "-o",
                                       str(o)],
    "evaluate --candidate": lambda m, t, o: ["evaluate", "--candidate",
                                             str(_calibrated(o.parent, m)), "--suite",
                                             str(t / "suite.yaml"), "-o", str(o)],
    "evaluate --baseline": lambda m, t, o: ["evaluate", "--candidate",
                                            str(_calibrated(o.parent, t / "pipe")), "--baseline",
                                            str(m), "--suite", str(t / "suite.yaml"), "-o", str(o)],
}  # fmt: skip


def _recipe(model: Path, tiny: Path, d: Path) -> Path:
    recipe = d / "r.yaml"
    recipe.write_text(
        f"name: r\nmodel: {{family: diffusers-sd, source: {model}, settings: {{steps: 2}}}}\n"
        f"data: {{calibration: {tiny / 'prompts.txt'}}}\ntarget: ascend910b-vllm-ascend\n"
    )
    return recipe


@pytest.mark.parametrize("command", list(COMMANDS))
def test_weights_linked_out_of_the_model_are_refused_before_any_work(
    command, tiny, tmp_path, monkeypatch, capsys
):
    model, elsewhere = _linked_out(tiny, tmp_path)
    out = tmp_path / "out"
    line = _refused(COMMANDS[command](model, tiny, out), out, capsys, monkeypatch)
    assert line == _line(model / WEIGHTS, elsewhere, model)


@pytest.mark.parametrize(
    "rel",
    ["text_encoder/config.json", "tokenizer/tokenizer.json", "scheduler/scheduler_config.json"],
)
def test_a_config_or_tokenizer_file_linked_out_is_refused_the_same(
    rel, tiny, tmp_path, monkeypatch, capsys
):
    model, elsewhere = _linked_out(tiny, tmp_path, rel)
    out = tmp_path / "out"
    line = _refused(COMMANDS["probe"](model, tiny, out), out, capsys, monkeypatch)
    assert line == _line(model / rel, elsewhere, model)


def test_a_whisper_whose_weights_link_out_is_refused(tmp_path, monkeypatch, capsys):
    model = save_tiny_whisper(tmp_path / "whisper")
    elsewhere = tmp_path / "elsewhere.safetensors"
    (model / "model.safetensors").rename(elsewhere)
    (model / "model.safetensors").symlink_to(elsewhere)
    data = tmp_path / "clips"  # never read: the model is refused first
    out = tmp_path / "out"
    argv = ["probe", str(model), "--family", "whisper", "--data", str(data), "-o", str(out)]
    line = _refused(argv, out, capsys, monkeypatch)
    assert line == _line(model / "model.safetensors", elsewhere, model)
