"""The safetensors header validator on hand-built files (issue 41 §4): each malformation is one
line naming the file and the tensor, read from the first ``8 + N`` bytes only."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from opsnn_quant.core.safetensors_header import (
    check_safetensors_header,
    read_safetensors_header,
)
from opsnn_quant.errors import CheckpointError, ModelLoadError


def _file(path, header: object, data: bytes = b"", declared: int | None = None, size=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw) if declared is None else declared) + raw + data)
        if size is not None:
            f.truncate(size)  # sparse: never written, never read
    return path


def _t(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_a_file_safetensors_wrote_reads_back(tmp_path):
    path = tmp_path / "ok.safetensors"
    tensors = {
        "a": torch.zeros(3, 2),
        "b": torch.zeros(4, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 5),
        "scalar": torch.tensor(1, dtype=torch.int64),
        "f8": torch.zeros(3, dtype=torch.float8_e4m3fn),
    }
    save_file(tensors, str(path), metadata={"format": "pt"})
    header = read_safetensors_header(path)
    assert {n: (e.dtype, e.shape) for n, e in header.tensors.items()} == {
        "a": ("F32", (3, 2)), "b": ("BF16", (4,)), "empty": ("F32", (0, 5)),
        "scalar": ("I64", ()), "f8": ("F8_E4M3", (3,)),
    }  # fmt: skip
    assert header.metadata == {"format": "pt"}
    assert header.data_bytes == 24 + 8 + 0 + 8 + 3


def test_a_header_padded_with_spaces_is_valid(tmp_path):
    path = _file(
        tmp_path / "p.safetensors", json.dumps({"w": _t("U8", [2], 0, 2)}).encode() + b"   ", b"ab"
    )
    assert read_safetensors_header(path).tensors["w"].shape == (2,)


def test_a_huge_header_length_is_refused_from_the_first_8_bytes(tmp_path):
    # a 1 TB sparse file claiming a 2^63-byte header: nothing past byte 8 is read
    path = _file(tmp_path / "huge.safetensors", b"{}", declared=2**63, size=2**40)
    with pytest.raises(
        ModelLoadError, match=rf"header of {2**63} bytes refused \(limit 100000000 "
    ):
        read_safetensors_header(path)


def test_a_header_length_past_the_end_of_the_file_is_refused(tmp_path):
    path = _file(tmp_path / "short.safetensors", b"{}", declared=50)
    with pytest.raises(
        ModelLoadError, match=r"header of 50 bytes refused \(limit 2 for this 10-byte"
    ):
        read_safetensors_header(path)


@pytest.mark.parametrize("data", [b"", b"\0" * 7], ids=["0 bytes", "7 bytes"])
def test_a_file_shorter_than_its_length_field_is_refused(tmp_path, data):
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    with pytest.raises(
        ModelLoadError, match=rf"not a safetensors file \({len(data)} bytes, shorter"
    ):
        read_safetensors_header(path)


def test_the_error_class_is_the_callers(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError):
        read_safetensors_header(path, error=CheckpointError)


W = _t("F32", [2], 0, 8)
BAD = [
    ("not JSON", b"{not json", b"", "header is not valid JSON"),
    ("not UTF-8", b'{"\xff": 1}', b"", "header is not valid JSON"),
    ("a list", b"[1, 2]", b"", "header is not a JSON object"),
    ("a number", b"7", b"", "header is not a JSON object"),
    ("an entry not an object", {"w": [1]}, b"", "header entry 'w' is not an object"),
    ("dtype F99", {"w": _t("F99", [2], 0, 8)}, b"\0" * 8, "tensor w has unsupported dtype 'F99'"),
    ("dtype missing", {"w": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "unsupported dtype None"),
    ("negative shape", {"w": _t("F32", [-2], 0, 8)}, b"\0" * 8, r"malformed shape \[-2\]"),
    ("float shape", {"w": _t("F32", [1e9], 0, 8)}, b"\0" * 8, r"malformed shape \[1000000000.0\]"),
    ("bool shape", {"w": _t("F32", [True], 0, 4)}, b"\0" * 4, r"malformed shape \[True\]"),
    ("shape a string", {"w": _t("F32", "2", 0, 8)}, b"\0" * 8, "malformed shape '2'"),
    ("shape 1e9 x 1e9", {"w": _t("F32", [10**9, 10**9], 0, 8)}, b"\0" * 8,
     r"tensor w: data size does not match its shape and dtype \(F32 1000000000x1000000000 is "
     r"4000000000000000000 bytes, its data offsets hold 8\)"),
    ("size short of the shape", {"w": _t("F32", [2], 0, 4)}, b"\0" * 4, "data size does not match"),
    ("offsets past the data", {"w": _t("F32", [2], 0, 800)}, b"\0" * 8,
     r"data offsets \[0, 800\] outside the file \(its data section is 8 bytes\)"),
    ("offsets reversed", {"w": _t("F32", [0], 8, 0)}, b"\0" * 8, "outside the file"),
    ("offsets negative", {"w": _t("F32", [2], -8, 0)}, b"\0" * 8, "outside the file"),
    ("offsets not two", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, "outside the file"),
    ("overlap", {"a": W, "b": _t("F32", [2], 4, 12)}, b"\0" * 12,
     r"tensors a and b overlap \(data bytes 4 to 8\)"),
    ("same bytes twice", {"a": W, "b": W}, b"\0" * 8, "tensors a and b overlap"),
    ("a hole", {"a": W, "b": _t("F32", [2], 12, 20)}, b"\0" * 20,
     "data bytes 8 to 12 belong to no tensor \\(before b\\)"),
    ("a hole at the start", {"a": _t("F32", [2], 4, 12)}, b"\0" * 12, "data bytes 0 to 4 belong"),
    ("bytes after the last tensor", {"a": W}, b"\0" * 12, "the tensors cover 8 of the 12 data bytes"),
    ("metadata not strings", {"__metadata__": {"a": 1}, "w": W}, b"\0" * 8,
     "__metadata__ is not an object of strings"),
    ("metadata a list", {"__metadata__": ["a"]}, b"", "__metadata__ is not an object of strings"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("header", "data", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_a_malformed_header_is_one_line_naming_the_file(tmp_path, header, data, message):
    path = _file(tmp_path / "x.safetensors", header, data)
    with pytest.raises(ModelLoadError, match=message) as info:
        read_safetensors_header(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and "\n" not in text


def test_the_pure_check_takes_a_parsed_header():
    header = {"b": _t("I8", [2], 2, 4), "a": _t("I8", [2], 0, 2), "z": _t("I8", [0], 2, 2)}
    checked = check_safetensors_header(header, 4, where="w")
    assert [checked.tensors[n].begin for n in "abz"] == [0, 2, 2]
    with pytest.raises(ModelLoadError, match=r"^w: the tensors cover 4 of the 5 data bytes"):
        check_safetensors_header(header, 5, where="w")


def test_a_quantized_checkpoint_with_a_lying_header_is_a_checkpoint_error(tmp_path):
    from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
    from opsnn_quant.quant.api import quantize
    from tests.tiny_models import TinyMLP, forward_loop_for

    model = TinyMLP()
    quantize(model, {"*": "w8a16"}, forward_loop_for(model, batches=1))
    save_quantized(model, tmp_path / "q")
    _file(tmp_path / "q" / "model.safetensors", b"{}", declared=2**63)
    with pytest.raises(CheckpointError, match=rf"model.safetensors: safetensors header of {2**63}"):
        load_quantized(TinyMLP(), tmp_path / "q")
