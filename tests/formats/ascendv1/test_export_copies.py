"""Files the AscendV1 export copies from the model directory (issue 41 §3): regular files inside
it only. A link leading out of it (``tokenizer/merges.txt -> /etc/passwd``), a FIFO, a broken
link are refused with one line before the output is written; a link inside is copied as the
regular file it names; a hub cache snapshot's links into its ``blobs/`` count as inside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.folding.smooth_fold import Call
from opsnn_quant.formats.ascendv1 import export_ascendv1
from opsnn_quant.io import atomic_dir
from opsnn_quant.models import check_weights
from opsnn_quant.models.confine import check_export_sources
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
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
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "tokenizer" / "vocab.json").write_text("{}")
    return src


def _export(model: TinyAttention, src: Path, out: Path) -> None:
    calls: dict[str, list[Call]] = {"": [(model.example_inputs(), {})]}
    export_ascendv1(Stub(model), out, calls=calls, source_dir=src)  # type: ignore[arg-type]


def test_a_helper_linked_out_of_the_model_directory_is_refused_before_writing(model, tmp_path):
    src = _source(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's secret\n")
    (src / "tokenizer" / "merges.txt").symlink_to(secret)
    want = (
        f"model file {src}/tokenizer/merges.txt resolves to {secret}, outside {src}; an export "
        "copies only regular files inside the model directory: replace it with the file itself "
        "(or remove it)"
    )
    with pytest.raises(ModelLoadError) as err:
        _export(model, src, tmp_path / "av1")
    assert str(err.value) == want
    assert not (tmp_path / "av1").exists() and not list(tmp_path.glob("av1.tmp-*"))
    # the same refusal from the check the commands run before any work
    with pytest.raises(ModelLoadError) as err:
        check_weights(str(src))
    assert str(err.value) == want
    # /etc/passwd by an absolute link, and a folder linked out of the model
    (src / "tokenizer" / "merges.txt").unlink()
    (src / "tokenizer" / "merges.txt").symlink_to("/etc/passwd")
    with pytest.raises(ModelLoadError, match=r"merges\.txt resolves to /etc/passwd, outside"):
        check_export_sources(str(src))
    (src / "tokenizer" / "merges.txt").unlink()
    (src / "extra").symlink_to(tmp_path)
    with pytest.raises(ModelLoadError, match=f"model file {src}/extra resolves to {tmp_path},"):
        _export(model, src, tmp_path / "av1")


def test_a_link_inside_is_copied_as_the_regular_file_it_names(model, tmp_path):
    src = _source(tmp_path)
    (src / "tokenizer" / "real.txt").write_text("#version: 0.2\n")
    (src / "tokenizer" / "merges.txt").symlink_to("real.txt")
    check_weights(str(src))
    _export(model, src, tmp_path / "av1")
    copied = tmp_path / "av1" / "tokenizer" / "merges.txt"
    assert not copied.is_symlink() and copied.read_text() == "#version: 0.2\n"


def test_a_fifo_or_a_broken_link_is_refused_not_waited_on(model, tmp_path):
    src = _source(tmp_path)
    os.mkfifo(src / "tokenizer" / "merges.txt")
    with pytest.raises(ModelLoadError, match=r"merges.txt is a named pipe \(FIFO\), not a regular"):
        _export(model, src, tmp_path / "av1")  # before: blocked forever in shutil.copyfile
    with pytest.raises(ModelLoadError, match="is a named pipe"):
        check_weights(str(src))
    (src / "tokenizer" / "merges.txt").unlink()
    (src / "tokenizer" / "merges.txt").symlink_to("gone.txt")
    with pytest.raises(ModelLoadError, match=r"merges\.txt is a link to a missing file"):
        check_export_sources(str(src))
    assert not (tmp_path / "av1").exists()


def test_a_hub_cache_snapshot_links_into_its_blobs(model, tmp_path):
    repo = tmp_path / "hub" / "models--me--tiny"
    snap = repo / "snapshots" / "0123abc"
    (snap / "tokenizer").mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "h1").write_text("{}")
    (repo / "blobs" / "h2").write_text("#version: 0.2\n")
    (snap / "config.json").symlink_to("../../blobs/h1")
    (snap / "tokenizer" / "merges.txt").symlink_to("../../../blobs/h2")
    check_weights(str(snap))
    _export(model, snap, tmp_path / "av1")
    assert (tmp_path / "av1" / "tokenizer" / "merges.txt").read_text() == "#version: 0.2\n"
    # a blob that is itself a link out of the cache is still out
    (repo / "blobs" / "h2").unlink()
    (repo / "blobs" / "h2").symlink_to("/etc/passwd")
    with pytest.raises(ModelLoadError, match="resolves to /etc/passwd"):
        check_weights(str(snap))


class _Pipe(nn.Module):
    def __init__(self, den: nn.Module) -> None:
        super().__init__()
        self.den, self.vae = den, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.den(x)


def test_a_copied_components_weights_linked_out_are_refused_when_copied(model, tmp_path):
    # weights are not looked at before the work (a loader reads them; users link big files
    # from a shared store), but a component copied whole copies its weights: checked there
    src = tmp_path / "pipe"
    for c in ("den", "vae", "scheduler"):
        (src / c).mkdir(parents=True)
        (src / c / "config.json").write_text("{}")
    (src / "model_index.json").write_text("{}")
    outside = tmp_path / "shared.safetensors"
    save_file({"weight": torch.zeros(4, 4), "bias": torch.zeros(4)}, str(outside))
    (src / "vae" / "diffusion_pytorch_model.safetensors").symlink_to(outside)
    check_weights(str(src), allow_pickle=True)  # passes: weights are the loader's
    pipe = _Pipe(model)
    calls: dict[str, list[Call]] = {"": [(model.example_inputs(), {})]}
    # as the commands write it: into their atomic directory, which a refusal leaves behind
    linked = r"diffusion_pytorch_model\.safetensors resolves to"
    with (
        pytest.raises(ModelLoadError, match=linked),
        atomic_dir(tmp_path / "av1", "ascendv1") as tmp,
    ):
        export_ascendv1(Stub(pipe), tmp, calls=calls, source_dir=src)  # type: ignore[arg-type]
    assert not (tmp_path / "av1").exists() and not list(tmp_path.glob("av1.tmp-*"))
    # a FIFO in a folder copied whole (the scheduler) is refused too
    (src / "vae" / "diffusion_pytorch_model.safetensors").unlink()
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
