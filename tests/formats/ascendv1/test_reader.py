"""Bad AscendV1 input: one line naming the tensor (or file), exit 2, nothing written."""

from __future__ import annotations

import json
import re
import struct

import pytest
import torch

from opsnn_quant.cli import main
from opsnn_quant.errors import CheckpointError
from opsnn_quant.formats.ascendv1.contract import AscendV1Error
from opsnn_quant.formats.ascendv1.reader import read_ascendv1
from opsnn_quant.formats.safetensors_io import read_header, write_tensors
from tests.formats.ascendv1 import handmade


def _broken(tmp_path, change):
    t = handmade.tensors()
    desc = handmade.description(t)
    change(t, desc)
    return handmade.write(tmp_path / "bad", t, desc)


def _drop_weights_tensor(t, d):
    del t["0.quant_bias"]


def _drop_from_both(t, d):
    del t["0.quant_bias"], d["0.quant_bias"]


def _bf16_weight(t, d):
    t["1.weight"] = t["1.weight"].to(torch.int32)


def _deq_shape(t, d):
    t["0.deq_scale"] = t["0.deq_scale"][:1]


def _unknown_type(t, d):
    d["1.weight_scale"] = "W9A9"


def _unsupported_type(t, d):
    d.update({k: "W4A8_DYNAMIC" for k in d if k.startswith("1.") and k != "1.bias"})


def _offset_not_zero(t, d):
    t["2.weight"] = torch.ones(2, 2, dtype=torch.int8)
    t["2.weight_scale"], t["2.weight_offset"] = torch.ones(2, 1), torch.ones(2, 1)
    d.update({"2.weight": "W8A8_DYNAMIC", "2.weight_scale": "W8A8_DYNAMIC",
              "2.weight_offset": "W8A8_DYNAMIC"})  # fmt: skip


def _stray_tensor(t, d):
    t["0.smooth"] = torch.ones(4)
    d["0.smooth"] = "W8A8"


CASES = [
    ("a tensor the description names is not in the weights", _drop_weights_tensor,
     r"^0\.quant_bias: named in the description but not in the weights$"),
    ("a tensor the type needs is missing", _drop_from_both, r"^0\.quant_bias: missing \(W8A8 needs it\)$"),
    ("a dtype the contract forbids", _bf16_weight, r"^1\.weight: dtype int32 is not allowed for W8A16"),
    ("a shape the contract forbids", _deq_shape, r"^0\.deq_scale: shape \[1\] does not fit a W8A8 Linear"),
    ("an unknown quant type", _unknown_type, r"^1\.weight_scale: unknown quant type 'W9A9'$"),
    ("a type this consumer does not run", _unsupported_type, r"^1\.\w+: quant type W4A8_DYNAMIC is not supported"),
    ("a non-zero weight offset of a symmetric type", _offset_not_zero, r"^2\.weight_offset: must be zeros"),
    ("a tensor that is not part of its type", _stray_tensor, r"^0\.smooth: tagged W8A8 but belongs to no quantized Linear$"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "change", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_broken_directory_is_refused_naming_the_tensor(tmp_path, what, change, message):
    with pytest.raises(AscendV1Error, match=message):
        read_ascendv1(_broken(tmp_path, change))


def test_a_directory_without_description_is_not_ascendv1(tmp_path):
    d = handmade.write(tmp_path / "m")
    (d / "quant_model_description.json").unlink()
    with pytest.raises(AscendV1Error, match=r"no quant_model_description\.json"):
        read_ascendv1(d)


def _no_description(t, d):
    d.clear()  # written as {}, then removed below


@pytest.mark.parametrize(
    ("change", "message"),
    [(c[1], c[2]) for c in CASES] + [(_no_description, r"no quant_model_description\.json")],
    ids=[c[0] for c in CASES] + ["no description"],
)
def test_evaluate_refuses_a_broken_candidate_in_one_line_and_writes_nothing(
    tmp_path, capsys, change, message
):
    bad = _broken(tmp_path, change)
    if change is _no_description:
        (bad / "quant_model_description.json").unlink()
    out = tmp_path / "report"
    rc = main(["evaluate", "--candidate", str(bad), "--baseline", "zoo:shapes-t2i",
               "--suite", "shapes-t2i", "-o", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert re.search(message.lstrip("^"), err[0]), err[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def _header_file(path, header: bytes, size: int | None = None, declared: int | None = None):
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header) if declared is None else declared) + header)
        if size is not None:
            f.truncate(size)  # sparse: the bytes are never written, nor read
    return path


def test_a_huge_header_is_refused_before_reading_it(tmp_path):
    # a 1 TB sparse file claiming a 512 GB header: refused from its first 8 bytes
    path = _header_file(tmp_path / "huge.safetensors", b"{}", size=2**40, declared=2**39)
    with pytest.raises(
        AscendV1Error, match=r"header of 549755813888 bytes refused \(limit 100000000"
    ):
        read_header(path, error=AscendV1Error)


def test_a_header_longer_than_the_file_is_refused(tmp_path):
    path = _header_file(tmp_path / "short.safetensors", b"{}", declared=50)
    with pytest.raises(CheckpointError, match="header of 50 bytes refused"):
        read_header(path)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"{not json", "header is not valid JSON"),
        (b"[1, 2]", "header is not a JSON object"),
        (b'{"w": {"dtype": "F8_X", "shape": [1], "data_offsets": [0, 1]}}', "unsupported dtype"),
        (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 800]}}', "outside the file"),
        (
            b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}',
            "does not match its shape",
        ),
        (b'{"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}', "malformed shape"),
    ],
)
def test_a_malformed_header_is_refused(tmp_path, header, message):
    path = _header_file(tmp_path / "x.safetensors", header)
    with path.open("ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(CheckpointError, match=message):
        read_header(path)


def test_shards_and_index_follow_msmodelslims_naming_and_read_back(tmp_path):
    t = {f"l{i}.weight": torch.full((64,), float(i)) for i in range(5)}  # 256 bytes each
    names = write_tensors(t, tmp_path, "quant_model_weights", shard_bytes=600)
    assert names == [
        "quant_model_weights-00001-of-00003.safetensors",
        "quant_model_weights-00002-of-00003.safetensors",
        "quant_model_weights-00003-of-00003.safetensors",
        "quant_model_weights.safetensors.index.json",
    ]
    index = json.loads((tmp_path / names[-1]).read_text())
    assert index["metadata"] == {"total_size": 5 * 256}
    assert index["weight_map"]["l4.weight"] == names[2]
    assert list(index["weight_map"].values()).count(names[0]) == 2  # 512 < 600 <= 768 bytes


def test_an_index_naming_a_missing_shard_is_refused(tmp_path):
    d = handmade.write(tmp_path / "m")
    t = handmade.tensors()
    (d / "quant_model_weights.safetensors").unlink()
    write_tensors(t, d, "quant_model_weights", shard_bytes=40)
    index = d / "quant_model_weights.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["1.bias"] = "quant_model_weights-00009-of-00009.safetensors"
    index.write_text(json.dumps(doc))
    with pytest.raises(
        AscendV1Error,
        match=r"shard 'quant_model_weights-00009-of-00009\.safetensors' of 1\.bias not found",
    ):
        read_ascendv1(d)


def test_the_streaming_writer_gives_save_files_bytes_and_makes_lazy_tensors_once(tmp_path):
    # Byte-for-byte as safetensors.torch.save_file (the data laid out by descending dtype, then
    # by name; the header padded with spaces to 8 bytes), for every dtype we write.
    from safetensors.torch import save_file

    from opsnn_quant.formats.safetensors_io import LazyTensor, write_safetensors

    g = torch.Generator().manual_seed(0)
    t = {f"t{i}": (torch.randn(3, 5, generator=g) * 100).to(d)
         for i, d in enumerate((torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                torch.bool))}  # fmt: skip
    t["scalar"] = torch.tensor(2.5)
    t["empty"] = torch.zeros(0, 4)
    t["a.transposed"] = torch.arange(12.0).reshape(3, 4).t()  # not contiguous
    save_file({k: v.contiguous() for k, v in t.items()}, str(tmp_path / "ref.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    made = []

    def make() -> torch.Tensor:
        made.append(1)
        return t["t1"]

    mine = {**t, "t1": LazyTensor(torch.float32, (3, 5), make)}
    write_safetensors(mine, tmp_path / "ours.safetensors", {"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (
        tmp_path / "ref.safetensors"
    ).read_bytes()
    assert made == [1]
    bad = {"w": LazyTensor(torch.float32, (2, 2), lambda: torch.zeros(2, 3))}
    with pytest.raises(CheckpointError, match=r"declared torch.float32 \[2, 2\] made"):
        write_safetensors(bad, tmp_path / "bad.safetensors")
