"""The MindIE-SD reader checks a weight file's safetensors header before it maps the file (issue
58 §11): a tampered export is one line naming the file, never a ``SafetensorError`` traceback."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

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
