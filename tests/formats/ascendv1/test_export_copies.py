"""Files the AscendV1 export copies from the model directory (issues 41 §3, 58 §1): what the
engines read (configs, tokenizer and processor files, ``model_index.json``, scheduler configs, the
weights of a component copied untouched; msModelSlim's ``copy_files`` globs as the floor), nothing
else: no dotfile, key, ``.git``, README, folder the index does not name. Each a regular file inside
the model directory, written with a mode no wider than its source's; a link leading out of it
(``merges.txt -> /etc/passwd``), a FIFO, a broken link are refused with one line before the output
is written; a link inside is copied as the regular file it names; a hub cache snapshot's links into
its ``blobs/`` count as inside. The notes say what was copied and what was left out, and why."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.folding.smooth_fold import Call
from opsnn_quant.formats.ascendv1.export import AscendV1Export, export_ascendv1
from opsnn_quant.models import check_weights
from opsnn_quant.models.loader_files import check_model_sources
from opsnn_quant.output.directories import atomic_dir
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.sources import resolve_source
from opsnn_quant.types import Precision
from tests.folding.test_smooth_fold import Stub
from tests.tiny_models import TinyAttention, forward_loop_for


@pytest.fixture(scope="module")
def model() -> TinyAttention:
    m = TinyAttention()
    quantize(m, {"*": QuantSpec(Precision.W8A8)}, forward_loop_for(m, batches=1))
    return m


def _source(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "vocab.json").write_text("{}")
    return src


def _export(model: TinyAttention, src: Path, out: Path) -> AscendV1Export:
    calls: dict[str, list[Call]] = {"": [(model.example_inputs(), {})]}
    return export_ascendv1(Stub(model), out, calls=calls, source_dir=src)  # type: ignore[arg-type]


def _tree(root: Path) -> dict[str, int]:
    """Relative path -> permission bits of every file under ``root`` (our marker apart)."""
    return {
        p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".opsnn-quant.json"
    }  # fmt: skip


def _write(root: Path, files: dict[str, str], mode: int = 0o644) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        (root / rel).chmod(mode)


LEAKS = {".env": "TOKEN=hunter2\n", "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
         ".git/config": "[remote]\nurl = https://user:token@example.invalid/r.git\n",
         ".git/lfs/objects/ab/cd/blob": "x" * 4096, ".cache/huggingface/x.json": "{}",
         "README.md": "# my model\n"}  # fmt: skip


def test_an_export_holds_what_the_engine_reads_nothing_else(model, tmp_path):
    src = tmp_path / "src"
    _write(src, {"config.json": json.dumps({"d_model": 8}), "generation_config.json": "{}",
                 "tokenizer.json": "{}", "tokenizer_config.json": "{}", "vocab.json": "{}",
                 "chat_template.jinja": "{{ x }}", "notes.txt": "my notes\n"})  # fmt: skip
    _write(src, {"merges.txt": "#version: 0.2\n"}, 0o640)
    save_file({"w": torch.zeros(2)}, str(src / "model.safetensors"))  # the float weights
    _write(src, LEAKS)
    (src / "id_rsa").chmod(0o600)
    (src / "config.json").chmod(0o600)
    (src / "tokenizer.json").chmod(0o755)
    done = _export(model, src, tmp_path / "av1")
    files = _tree(tmp_path / "av1")
    # msModelSlim's copy_files floor takes every *.txt (merges.txt, vocab.txt): notes.txt too
    copied = ["chat_template.jinja", "config.json", "generation_config.json", "merges.txt",
              "notes.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]  # fmt: skip
    assert sorted(files) == sorted([*copied, "quant_model_description.json",
                                    "quant_model_weights.safetensors"])  # fmt: skip
    # no mode wider than its source's: the 0600 config stays 0600, 0640 stays 0640, no x bit
    for name in copied:
        assert files[name] & ~stat.S_IMODE((src / name).stat().st_mode) == 0, name
    assert files["config.json"] == 0o600 and files["merges.txt"] == 0o640
    assert files["tokenizer.json"] & 0o111 == 0
    assert done.helpers == copied
    assert done.notes[-2:] == [
        "copied from the model directory: " + ", ".join(copied),
        "left out (no engine reads them): .git/ (VCS tree); .cache/ (hidden directory); "
        ".env (hidden file); README.md, id_rsa (not read by the engine)",
    ]
    assert "hunter2" not in "".join(p.read_text(errors="replace") for p in
                                    (tmp_path / "av1").rglob("*.json"))  # fmt: skip


class _Pipe(nn.Module):
    def __init__(self, den: nn.Module) -> None:
        super().__init__()
        self.den, self.vae = den, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.den(x)


def _pipeline_source(root: Path) -> Path:
    index = {"_class_name": "StableDiffusionPipeline", "den": ["diffusers", "UNet2DModel"],
             "vae": ["diffusers", "AutoencoderKL"], "scheduler": ["diffusers", "DDIMScheduler"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "safety_checker": [None, None]}  # fmt: skip
    _write(root, {"model_index.json": json.dumps(index), "den/config.json": "{}",
                  "vae/config.json": "{}", "scheduler/scheduler_config.json": "{}",
                  "tokenizer/vocab.json": "{}", "tokenizer/merges.txt": "#version: 0.2\n"})  # fmt: skip
    save_file({"weight": torch.zeros(4, 4), "bias": torch.zeros(4)},
              str(root / "vae" / "diffusion_pytorch_model.safetensors"))  # fmt: skip
    return root


def test_a_pipeline_export_copies_the_components_its_index_names(model, tmp_path):
    src = _pipeline_source(tmp_path / "pipe")
    _write(src, LEAKS)
    _write(src, {"vae/.env": "K=1\n", "vae/old/config.json": "{}", "tokenizer/id_rsa": "k",
                 "_tok/vocab.json": "{}", "samples/a.json": "{}", "v1-5.ckpt": "x",
                 "v1-5.safetensors": "x", "safety_checker/config.json": "{}"})  # fmt: skip
    pipe = _Pipe(model)
    calls: dict[str, list[Call]] = {"": [(model.example_inputs(), {})]}
    check_weights(resolve_source(str(src)))
    done = export_ascendv1(Stub(pipe), tmp_path / "av1", calls=calls, source_dir=src)  # type: ignore[arg-type]
    assert sorted(_tree(tmp_path / "av1")) == [
        "den/config.json", "den/quant_model_description.json",
        "den/quant_model_weights.safetensors", "model_index.json",
        "scheduler/scheduler_config.json", "tokenizer/merges.txt", "tokenizer/vocab.json",
        "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
    ]  # fmt: skip
    assert (tmp_path / "av1" / "vae" / "diffusion_pytorch_model.safetensors").read_bytes() == (
        src / "vae" / "diffusion_pytorch_model.safetensors"
    ).read_bytes()
    assert done.copied == ["vae"]
    assert done.notes[-2:] == [
        "copied from the model directory: den/config.json, model_index.json, scheduler/, "
        "tokenizer/, vae/",
        "left out (no engine reads them): .git/ (VCS tree); .cache/ (hidden directory); "
        ".env, vae/.env (hidden file); _tok/, safety_checker/, samples/ (not a component named "
        "in model_index.json); README.md, id_rsa, tokenizer/id_rsa, v1-5.ckpt, v1-5.safetensors, "
        "vae/old/ (not read by the engine)",
    ]


def test_what_no_engine_reads_is_not_looked_at(model, tmp_path):
    # a key linked out, a FIFO named README.md, a .git of links: left out, never opened
    src = _source(tmp_path)
    (src / "id_rsa").symlink_to("/etc/passwd")
    os.mkfifo(src / "README.md")
    (src / ".git").mkdir()
    (src / ".git" / "config.json").symlink_to("/etc/passwd")
    (src / "extra").symlink_to(tmp_path)
    check_weights(resolve_source(str(src)))
    done = _export(model, src, tmp_path / "av1")
    assert sorted(_tree(tmp_path / "av1")) == [
        "config.json", "quant_model_description.json", "quant_model_weights.safetensors",
        "vocab.json",
    ]  # fmt: skip
    assert done.left_out == {".git/": "VCS tree", "README.md": "not read by the engine",
                             "extra/": "not read by the engine",
                             "id_rsa": "not read by the engine"}  # fmt: skip


def _refusal(path: Path, why: str) -> str:
    return (
        f"model file {path} {why}; opsnn-quant reads (and exports) only regular files inside the "
        "model directory: replace it with the file itself (a copy or a hard link) or remove it"
    )


def test_a_helper_linked_out_of_the_model_directory_is_refused_before_writing(model, tmp_path):
    src = _source(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's secret\n")
    (src / "merges.txt").symlink_to(secret)
    want = _refusal(src / "merges.txt", f"resolves to {secret}, outside {src}")
    with pytest.raises(ModelLoadError) as err:
        _export(model, src, tmp_path / "av1")
    assert str(err.value) == want
    assert not (tmp_path / "av1").exists() and not list(tmp_path.glob("av1.tmp-*"))
    # the same refusal from the check the commands run before any work
    with pytest.raises(ModelLoadError) as err:
        check_weights(resolve_source(str(src)))
    assert str(err.value) == want
    # /etc/passwd by an absolute link
    (src / "merges.txt").unlink()
    (src / "merges.txt").symlink_to("/etc/passwd")
    with pytest.raises(ModelLoadError, match=r"merges\.txt resolves to /etc/passwd, outside"):
        check_model_sources(resolve_source(str(src)))


def test_a_link_inside_is_copied_as_the_regular_file_it_names(model, tmp_path):
    src = _source(tmp_path)
    (src / "real.txt").write_text("#version: 0.2\n")
    (src / "merges.txt").symlink_to("real.txt")
    check_weights(resolve_source(str(src)))
    _export(model, src, tmp_path / "av1")
    copied = tmp_path / "av1" / "merges.txt"
    assert not copied.is_symlink() and copied.read_text() == "#version: 0.2\n"


def test_a_fifo_or_a_broken_link_is_refused_not_waited_on(model, tmp_path):
    src = _source(tmp_path)
    os.mkfifo(src / "merges.txt")
    with pytest.raises(ModelLoadError, match=r"merges.txt is a named pipe \(FIFO\), not a regular"):
        _export(model, src, tmp_path / "av1")  # before: blocked forever in shutil.copyfile
    with pytest.raises(ModelLoadError, match="is a named pipe"):
        check_weights(resolve_source(str(src)))
    (src / "merges.txt").unlink()
    (src / "merges.txt").symlink_to("gone.txt")
    with pytest.raises(ModelLoadError, match=r"merges\.txt is a link to a missing file"):
        check_model_sources(resolve_source(str(src)))
    assert not (tmp_path / "av1").exists()


def test_a_hub_cache_snapshot_links_into_its_blobs(model, tmp_path):
    repo = tmp_path / "hub" / "models--me--tiny"
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "h1").write_text("{}")
    (repo / "blobs" / "h2").write_text("#version: 0.2\n")
    (snap / "config.json").symlink_to("../../blobs/h1")
    (snap / "merges.txt").symlink_to("../../blobs/h2")
    check_weights(resolve_source(str(snap)))
    _export(model, snap, tmp_path / "av1")
    assert (tmp_path / "av1" / "merges.txt").read_text() == "#version: 0.2\n"
    # a blob that is itself a link out of the cache is still out
    (repo / "blobs" / "h2").unlink()
    (repo / "blobs" / "h2").symlink_to("/etc/passwd")
    with pytest.raises(ModelLoadError, match="resolves to /etc/passwd"):
        check_weights(resolve_source(str(snap)))


def test_a_components_weights_linked_out_are_refused_before_any_work(model, tmp_path):
    # issue 58 §5: weights linking out of the model directory were read (and quantized), or
    # refused only when a component copied whole copied them, after the whole probe
    src = _pipeline_source(tmp_path / "pipe")
    outside = tmp_path / "shared.safetensors"
    (src / "vae" / "diffusion_pytorch_model.safetensors").rename(outside)
    (src / "vae" / "diffusion_pytorch_model.safetensors").symlink_to(outside)
    want = _refusal(src / "vae" / "diffusion_pytorch_model.safetensors",
                    f"resolves to {outside}, outside {src}")  # fmt: skip
    with pytest.raises(ModelLoadError) as err:
        check_weights(
            resolve_source(str(src)), allow_pickle=True
        )  # what every command checks first
    assert str(err.value) == want
    pipe = _Pipe(model)
    calls: dict[str, list[Call]] = {"": [(model.example_inputs(), {})]}
    # the exporter refuses too, before writing (as the commands write it: into their atomic
    # directory, which a refusal leaves behind)
    with (
        pytest.raises(ModelLoadError, match=r"diffusion_pytorch_model\.safetensors resolves to"),
        atomic_dir(tmp_path / "av1", "ascendv1") as tmp,
    ):
        export_ascendv1(Stub(pipe), tmp, calls=calls, source_dir=src)  # type: ignore[arg-type]
    assert not (tmp_path / "av1").exists() and not list(tmp_path.glob("av1.tmp-*"))
    # a FIFO in a folder copied whole (the scheduler) is refused too
    (src / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    (src / "scheduler" / "scheduler_config.json").unlink()
    os.mkfifo(src / "scheduler" / "scheduler_config.json")
    with pytest.raises(ModelLoadError, match=r"scheduler_config\.json is a named pipe"):
        export_ascendv1(Stub(pipe), tmp_path / "av1", calls=calls, source_dir=src)  # type: ignore[arg-type]


def test_config_json_names_the_dtype_the_quantized_linears_were_written_for(model, tmp_path):
    # vLLM's --dtype auto reads config.json alone (vllm 0.23.0 model_arch_config_convertor.py
    # get_torch_dtype): a source's float16 made `vllm serve` run a bfloat16 export in fp16,
    # where vllm-ascend's static deq_scale is an int64 parameter and our float32 values became
    # 0. The export's config says the params dtype of what it wrote (here the spec's float16).
    import json

    src = _source(tmp_path)
    (src / "config.json").write_text(
        json.dumps({"torch_dtype": "float32", "quantization_config": {"x": 1}, "d_model": 8})
    )
    _export(model, src, tmp_path / "av1")
    doc = json.loads((tmp_path / "av1" / "config.json").read_text())
    desc = json.loads((tmp_path / "av1" / "quant_model_description.json").read_text())
    assert desc["metadata"]["opsnn_quant"]["params_dtype"] == "float16"
    assert doc == {"d_model": 8, "dtype": "float16", "torch_dtype": "float16"}
