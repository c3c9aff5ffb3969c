"""The MindIE-SD reader checks a weight file's safetensors header before it maps the file (issue
58 §11): a tampered export is one line naming the file, never a ``SafetensorError`` traceback."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from opsnn_quant.cli import main
from opsnn_quant.formats.mindie_sd.reader import MindieSdError, read_mindie_sd
from tests.formats.mindie_sd.test_export import _export, _quantized
from tests.tiny_pipelines import tiny_t2i_suite

WEIGHTS = "quant_model_weight_w8a8.safetensors"
DESCRIPTION = "quant_model_description_w8a8.json"


def _rewrite(path: Path, edit: Callable[[dict], dict]) -> None:
    """Rewrite ``path``'s header by ``edit`` (its length prefix follows), its data unchanged."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.dumps(edit(json.loads(raw[8 : 8 + n]))).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n :])


def _past_the_data(header: dict) -> dict:
    header["a.weight"]["data_offsets"][1] += 4096
    return header


def _unknown_dtype(header: dict) -> dict:
    header["a.weight"]["dtype"] = "F99"
    return header


def _not_json(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[8:12] = b"{{{{"
    path.write_bytes(bytes(raw))


def _huge_length(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 2**62) + raw[8:])


TAMPERED = {
    "offsets past the data": (lambda p: _rewrite(p, _past_the_data), "tensor a.weight has data "
                              "offsets"),
    "unknown dtype": (lambda p: _rewrite(p, _unknown_dtype), "tensor a.weight has unsupported "
                      "dtype 'F99'"),
    "header not JSON": (_not_json, "safetensors header is not valid JSON"),
    "header length 2^62": (_huge_length, f"safetensors header of {2**62} bytes refused"),
}  # fmt: skip


def _tampered(tmp_path: Path, how: str) -> Path:
    _, model = _quantized()
    _export(model, tmp_path)
    directory = tmp_path / "mindie-sd"
    TAMPERED[how][0](directory / WEIGHTS)
    os.chmod(directory / WEIGHTS, 0o640)
    return directory


@pytest.mark.parametrize("how", list(TAMPERED))
def test_a_tampered_weight_header_is_one_line(how, tmp_path):
    directory = _tampered(tmp_path, how)
    with pytest.raises(MindieSdError) as err:
        read_mindie_sd(directory / DESCRIPTION)
    assert str(err.value).startswith(f"{directory / WEIGHTS}: {TAMPERED[how][1]}"), str(err.value)


@pytest.mark.parametrize("how", ["offsets past the data", "header not JSON"])
def test_evaluate_a_tampered_mindie_sd_export_is_one_error_line(how, tmp_path, capsys):
    directory = _tampered(tmp_path, how)
    suite = tiny_t2i_suite(tmp_path / "suite")
    out = tmp_path / "report"
    capsys.readouterr()
    argv = ["evaluate", "--candidate", str(directory), "--baseline", str(tmp_path),
            "--suite", str(suite), "-o", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # before: a SafetensorError traceback, exit 1
    assert err[0].startswith(f"error: {directory / WEIGHTS}: {TAMPERED[how][1]}"), err
    assert not out.exists() and not list(tmp_path.glob("report.tmp-*"))


# ---- the dtype MindIE-SD runs a directory in, and the module a flat description is for --------


def _write_component(directory: Path, qtype: str, tensors: dict, types: dict) -> Path:
    """A MindIE-SD component as msModelSlim's ``safe_tensor`` saver writes one (0o640 here)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    desc = directory / f"quant_model_description_{qtype.lower()}.json"
    desc.write_text(json.dumps({"model_quant_type": qtype, **types}))
    weights = directory / f"quant_model_weight_{qtype.lower()}.safetensors"
    save_file(tensors, str(weights))
    for f in (desc, weights):
        os.chmod(f, 0o640)
    return desc


def _op_takes(deq: torch.dtype, out: torch.dtype) -> bool:
    """Whether ``npu_quant_matmul`` (the CPU reference of torch_npu's op, the stand-in the
    conformance tests run MindIE-SD on) takes a ``deq_scale`` of ``deq`` for ``out`` output."""
    from opsnn_quant import ascend
    from opsnn_quant.errors import ShapeError

    x, w = torch.ones(2, 4, dtype=torch.int8), torch.ones(4, 3, dtype=torch.int8)
    scale = (
        ascend.npu_trans_quant_param(torch.ones(3))
        if deq == torch.int64
        else torch.ones(3, dtype=deq)
    )
    try:
        ascend.npu_quant_matmul(
            x, w, scale, bias=torch.zeros(3, dtype=torch.int32), output_dtype=out
        )
    except ShapeError:
        return False
    return True


DEQ = {"I64": torch.int64, "F32": torch.float32, "BF16": torch.bfloat16}
RUNS = ("bfloat16", "float16")  # MindIE-SD's QuantConfig.dtype: its default, then the other


@pytest.mark.parametrize(
    "deqs", [(), ("I64",), ("F32",), ("BF16",), ("I64", "F32"), ("I64", "BF16")]
)
@pytest.mark.parametrize("asked", ["float32", "bfloat16", "float16"])
def test_the_dtype_is_one_whose_matmul_takes_every_deq_scale(deqs, asked, tmp_path):
    from opsnn_quant.formats.mindie_sd.reader import engine_dtype

    tensors = {f"l{i}.deq_scale": torch.ones(3, dtype=DEQ[d]) for i, d in enumerate(deqs)}
    if not tensors:  # a dynamic file: no deq_scale
        tensors = {"l.weight_scale": torch.ones(3, 1)}
    _write_component(tmp_path / "c", "W8A8", tensors, dict.fromkeys(tensors, "W8A8"))
    takes = [r for r in RUNS if all(_op_takes(DEQ[d], getattr(torch, r)) for d in deqs)]
    want = asked if asked in takes else None if asked in RUNS else (takes or [None])[0]
    if want is not None:
        assert engine_dtype(tmp_path, asked) == want
        return
    with pytest.raises(MindieSdError) as err:
        engine_dtype(tmp_path, asked)
    msg = str(err.value)
    assert msg.startswith("c/l") and ".deq_scale: " in msg and "(the engine refuses it)" in msg
    assert (f"it runs in {takes[0]}" if takes else "no dtype takes them all") in msg


def _tiny_pipeline() -> torch.nn.Module:
    from torch import nn

    class Transformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 3))])

    model = nn.Module()
    model.text = nn.Sequential(nn.Linear(4, 4))
    model.transformer = Transformer()
    return model


def _dynamic_layer(name: str) -> tuple[dict, dict]:
    t = {f"{name}.weight": torch.tensor([[1, -2, 3, 0], [4, 5, -6, 7], [0, 1, 0, -1]],
                                        dtype=torch.int8),
         f"{name}.weight_scale": torch.tensor([[0.5], [0.25], [1.0]]),
         f"{name}.bias": torch.tensor([1.0, -1.0, 0.5])}  # fmt: skip
    return t, {k: "FLOAT" if k.endswith("bias") else "W8A8_DYNAMIC" for k in t}


def test_a_flat_description_is_for_the_component_its_names_fit(tmp_path):
    # msModelSlim writes a pipeline's transformer flat, its names relative to the transformer:
    # before, it was applied to the pipeline, where no name matched: nothing was quantized
    from opsnn_quant.formats.mindie_sd.reader import MindieSdLinear, apply_mindie_sd_dir

    _write_component(tmp_path, "W8A8_DYNAMIC", *_dynamic_layer("blocks.0.0"))
    model = _tiny_pipeline()
    assert apply_mindie_sd_dir(model, tmp_path) == ["transformer.blocks.0.0"]
    assert isinstance(model.transformer.blocks[0][0], MindieSdLinear)
    assert isinstance(model.text[0], torch.nn.Linear)


@pytest.mark.parametrize("sub", ["", "transformer"])
def test_a_description_naming_a_layer_the_model_lacks_is_one_line(sub, tmp_path):
    from opsnn_quant.formats.mindie_sd.reader import apply_mindie_sd_dir

    desc = _write_component(tmp_path / sub, "W8A8_DYNAMIC", *_dynamic_layer("blocks.7.0"))
    with pytest.raises(MindieSdError) as err:
        apply_mindie_sd_dir(_tiny_pipeline(), tmp_path)
    what = "component 'transformer'" if sub else "neither the model nor a component"
    assert str(err.value) == (
        f"{desc}: its layer names fit {what} (it names blocks.7.0; MindIE-SD would leave such a "
        "layer float): is the baseline the model it was made from?"
    )
