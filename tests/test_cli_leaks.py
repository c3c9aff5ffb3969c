"""Issue 41: user data files and the files copied into exports, at the CLI.

Each case: one ``error:`` line, exit 2, before a model loads and before anything is written.
§1 a metadata file naming a file out of its folder (``..``, an absolute path) or a FIFO; §2 a
prompt that is not a string; §5 a prompts file with one huge line; §3 a model whose
``tokenizer/merges.txt`` links out of the model directory (calibrate and export-weights).
"""

from __future__ import annotations

import json
import os
import re
import wave
from pathlib import Path

import numpy as np
import pytest

from opsnn_quant.cli import main
from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny SD pipeline and its recipe (two prompts from ``prompts.txt``)."""
    root = tmp_path_factory.mktemp("leaks")
    save_tiny_sd(root / "pipe")
    return root, tiny_sd_recipe(root, "tiny")


def _errors(stderr: str) -> list[str]:
    """stderr without the progress lines (printed when not a terminal)."""
    return [
        ln for ln in stderr.strip().splitlines() if not re.match(r"^\[\s*\d+\.\d s\]|^\s+\d", ln)
    ]


def _no_load(monkeypatch) -> None:
    import opsnn_quant.models
    import opsnn_quant.pipeline.context  # imported before the patch: it binds load_adapter

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(opsnn_quant.models, "load_adapter", refuse)
    monkeypatch.setattr("opsnn_quant.pipeline.context.load_adapter", refuse)


def _refused(argv: list[str], capsys, out: Path) -> str:
    assert main(argv) == 2
    err = _errors(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists() and not list(out.parent.glob(f"{out.name}.tmp-*"))
    return err[0]


def _with_data(recipe: Path, d: Path, source: Path) -> str:
    text = recipe.read_text()
    path = d / "r.yaml"
    path.write_text(re.sub(r"calibration: [^}]*\}", f"calibration: {source}}}", text))
    return str(path)


def _wav(path: Path) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.zeros(160, "<i2").tobytes())


@pytest.mark.parametrize("name", ["../outside/secret.wav", "ABS", "../" * 32 + "etc/passwd"])
def test_metadata_naming_a_file_out_of_its_folder(name, tmp_path, monkeypatch, capsys):
    _no_load(monkeypatch)
    folder = tmp_path / "speech"
    folder.mkdir()
    (tmp_path / "outside").mkdir()
    _wav(folder / "a.wav")
    _wav(tmp_path / "outside" / "secret.wav")
    name = str(tmp_path / "outside" / "secret.wav") if name == "ABS" else name
    rows = [{"file_name": "a.wav", "text": "hi"}, {"file_name": name, "text": "yo"}]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    line = _refused(["probe", "zoo:whisper-tiny.en", "--data", str(folder), "-o", str(out)],
                    capsys, out)  # fmt: skip
    target = os.path.realpath(folder / name)  # /etc/passwd, or outside/secret.wav
    assert line == (
        f"error: {folder}/metadata.jsonl line 2: file_name {name!r} resolves to {target}, "
        f"outside {folder}; a metadata file names files inside its folder"
    )


def test_metadata_naming_a_fifo(tmp_path, monkeypatch, capsys):
    _no_load(monkeypatch)
    folder = tmp_path / "speech"
    folder.mkdir()
    os.mkfifo(folder / "a.wav")  # before: the read waited on it forever
    (folder / "metadata.jsonl").write_text(json.dumps({"file_name": "a.wav", "text": "x"}) + "\n")
    out = tmp_path / "o"
    line = _refused(["probe", "zoo:whisper-tiny.en", "--data", str(folder), "-o", str(out)],
                    capsys, out)  # fmt: skip
    assert line == (
        f"error: {folder}/metadata.jsonl line 1: file_name 'a.wav' is a named pipe (FIFO), not "
        "a regular file; a metadata file names files inside its folder"
    )


def test_an_audio_folder_file_linked_out(tmp_path, monkeypatch, capsys):
    _no_load(monkeypatch)
    folder = tmp_path / "wavs"
    folder.mkdir()
    _wav(tmp_path / "secret.wav")
    (folder / "a.wav").symlink_to(tmp_path / "secret.wav")
    out = tmp_path / "o"
    line = _refused(["probe", "zoo:whisper-tiny.en", "--data", str(folder), "-o", str(out)],
                    capsys, out)  # fmt: skip
    assert line == (
        f"error: {folder}/a.wav resolves to {tmp_path}/secret.wav, outside {folder}; an audio "
        "folder's files must be regular files inside it"
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [(None, "null"), (5, "a number (5)"), (["x", "y"], "a list")],
)
def test_a_prompt_that_is_not_a_string(value, said, tiny, tmp_path, monkeypatch, capsys):
    _no_load(monkeypatch)
    _, recipe = tiny
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "a red circle"}) + "\n" + json.dumps({"prompt": value}))
    out = tmp_path / "o"
    line = _refused(["calibrate", _with_data(recipe, tmp_path, data), "-o", str(out)], capsys, out)
    assert line == f"error: {data} line 2: prompt is {said}, not a string"


def test_a_json_prompt_that_is_not_a_string(tiny, tmp_path, monkeypatch, capsys):
    _no_load(monkeypatch)
    _, recipe = tiny
    data = tmp_path / "p.json"
    data.write_text(json.dumps([{"prompt": "a red circle"}, {"prompt": None}]))
    out = tmp_path / "o"
    line = _refused(["calibrate", _with_data(recipe, tmp_path, data), "-o", str(out)], capsys, out)
    assert line == f"error: {data} record 2: prompt is null, not a string"


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_prompts_file_of_one_huge_line(suffix, tiny, tmp_path, monkeypatch, capsys):
    # before: read whole (a 1 GiB line: the OOM killer); now refused after 1 MiB of it
    _no_load(monkeypatch)
    _, recipe = tiny
    data = tmp_path / f"p{suffix}"
    with data.open("w") as f:
        f.write('{"prompt": "' if suffix == ".jsonl" else "")
        f.write("a" * (8 * 2**20))
    out = tmp_path / "o"
    line = _refused(["calibrate", _with_data(recipe, tmp_path, data), "-o", str(out)], capsys, out)
    assert line == (
        f"error: {data} line 1 is longer than 1048576 bytes (1 MiB), the most one record may "
        "hold; split it or shorten it"
    )


def _leaky_model(tmp: Path, root: Path) -> Path:
    """The tiny pipeline with its tokenizer's merges.txt a link to a file outside it."""
    import shutil

    pipe = tmp / "pipe"
    shutil.copytree(root / "pipe", pipe)
    secret = tmp / "secret.txt"
    secret.write_text((pipe / "_tok" / "merges.txt").read_text())  # loads fine as merges
    (pipe / "tokenizer" / "merges.txt").symlink_to(secret)
    return pipe


def test_calibrate_a_model_whose_tokenizer_file_links_out(tiny, tmp_path, monkeypatch, capsys):
    _no_load(monkeypatch)
    root, recipe = tiny
    pipe = _leaky_model(tmp_path, root)
    r = tmp_path / "r.yaml"
    r.write_text(recipe.read_text().replace(str(root / "pipe"), str(pipe)))
    out = tmp_path / "o"
    line = _refused(["calibrate", str(r), "-o", str(out)], capsys, out)
    assert line == (
        f"error: model file {pipe}/tokenizer/merges.txt resolves to {tmp_path}/secret.txt, "
        f"outside {pipe}; opsnn-quant reads (and exports) only regular files inside the model "
        "directory: replace it with the file itself (a copy or a hard link) or remove it"
    )
    # the same with --model and no recipe
    line = _refused(["calibrate", "--model", str(pipe), "--data", str(root / "prompts.txt"),
                     "-o", str(out)], capsys, out)  # fmt: skip
    assert "merges.txt resolves to" in line


def test_export_weights_of_a_model_whose_tokenizer_file_links_out(
    tiny, tmp_path, monkeypatch, capsys
):
    root, recipe = tiny
    pipe = _leaky_model(tmp_path, root)
    (pipe / "tokenizer" / "merges.txt").unlink()
    (pipe / "tokenizer" / "merges.txt").write_text((tmp_path / "secret.txt").read_text())
    r = tmp_path / "r.yaml"
    r.write_text(recipe.read_text().replace(str(root / "pipe"), str(pipe)))
    done = tmp_path / "done"
    assert main(["calibrate", str(r), "-o", str(done), "--quiet"]) == 0
    capsys.readouterr()
    (pipe / "tokenizer" / "merges.txt").unlink()  # now the link the export would have copied
    (pipe / "tokenizer" / "merges.txt").symlink_to(tmp_path / "secret.txt")
    _no_load(monkeypatch)
    out = tmp_path / "exp"
    line = _refused(["export-weights", str(done), "-o", str(out), "--data",
                     str(root / "prompts.txt")], capsys, out)  # fmt: skip
    assert line.startswith(f"error: model file {pipe}/tokenizer/merges.txt resolves to ")


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_a_data_file_naming_audio_out_of_its_directory(kind, tmp_path, monkeypatch, capsys):
    # issue 58 case 6: before, /abs/private/secret.wav named in a .csv/.jsonl/.parquet was read
    from tests.models.test_hf_data import _data_file

    _no_load(monkeypatch)
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "private").mkdir()
    _wav(data / "a.wav")
    _wav(tmp_path / "private" / "secret.wav")
    secret = str(tmp_path / "private" / "secret.wav")
    file = _data_file(kind, data / "speech", [{"file_name": "a.wav", "text": "hi"},
                                              {"file_name": secret, "text": "yo"}])  # fmt: skip
    capsys.readouterr()  # datasets' progress bar, writing the parquet
    out = tmp_path / "o"
    line = _refused(["probe", "zoo:whisper-tiny.en", "--data", str(file), "-o", str(out)],
                    capsys, out)  # fmt: skip
    where = f"{file} line 2" if kind == "jsonl" else f"{file} record 2"
    assert line == (
        f"error: {where}: audio {secret!r} resolves to {secret}, outside {data}; a data file "
        f"names audio files inside the directory holding it ({data})"
    )
