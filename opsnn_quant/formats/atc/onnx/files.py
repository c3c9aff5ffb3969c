"""ONNX files written atomically, and streamed past protobuf's 2 GiB.

The ``onnx`` package is imported inside the functions: importing this module stays light.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ONNX_EXTERNAL_DATA_BYTES = 1_800_000_000
"""Protobuf cannot serialize 2 GiB: from this size on a model's tensors go to a file beside it."""


SPILL_BYTES = 1024
"""Initializers of at least this many bytes are spilled to files by a marker rewrite (the size
from which :func:`save_onnx_atomic`'s streaming moves inline tensors into the data file too)."""
SPILL_PREFIX = "opsnn-init-"
"""The file names of spilled initializers begin so (:func:`unspill` takes back only those)."""
# dtypes whose raw data is the array's bytes (little endian); others (packed int4) stay inline
_SPILLED = {np.dtype(t) for t in ("float32", "float16", "int8", "uint8", "int32", "int64")}


def spillable(arr: np.ndarray) -> bool:
    """Whether :func:`spilled_tensor` can write ``arr`` (its raw data is its own bytes)."""
    return arr.dtype in _SPILLED


def spilled_tensor(onnx: Any, arr: np.ndarray, name: str, path: Path) -> Any:
    """The initializer ``name`` of ``arr`` with its data in the file ``path``: the proto never
    holds the bytes (protobuf keeps a cleared field's bytes in its arena until the whole model
    goes, so a tensor made inline and moved out would still cost its memory)."""
    np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tofile(path)
    tensor = onnx.TensorProto()
    tensor.dims.extend(arr.shape)
    tensor.name = name
    tensor.data_type = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", path.name
    tensor.data_location = onnx.TensorProto.EXTERNAL
    return tensor


def unspill(onnx: Any, proto: Any, spill: Path) -> None:
    """Load the initializers spilled into ``spill`` (:func:`spilled_tensor`) back into
    ``proto``: the same ModelProto, byte for byte, as one made in memory."""
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        if not info.get("location", "").startswith(SPILL_PREFIX):
            continue
        tensor.raw_data = (spill / info["location"]).read_bytes()
        del tensor.external_data[:]
        tensor.ClearField("data_location")  # proto2: a field set to its default is still written


def save_onnx_atomic(
    proto: object,
    path: str | os.PathLike[str],
    *,
    external_data_bytes: int = ONNX_EXTERNAL_DATA_BYTES,
    external_from: Path | None = None,
) -> Path:
    """Write an ONNX ``ModelProto`` into a temporary sibling directory, then rename it into place.

    A model of ``external_data_bytes`` or more is saved with all its tensors in one
    ``<name>.data`` file beside it (renamed into place first, so the ``.onnx`` never points at a
    missing file). A proto loaded without its external data (an exporter's output past 2 GiB)
    names the directory its tensor files are in as ``external_from``: they are streamed into
    ``<name>.data`` one at a time, with its larger inline tensors, never all in memory. Needs the
    ``onnx`` package (imported inside).

    Returns:
        The ``.onnx`` path.

    Raises:
        TypeError: ``proto`` is not an ``onnx.ModelProto``.
    """
    import onnx

    if not isinstance(proto, onnx.ModelProto):
        raise TypeError(f"save_onnx_atomic takes an onnx.ModelProto, not {type(proto).__name__}")
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        if external_from is not None:
            data = f"{dest.name}.data"
            _stream_tensors(proto, external_from, tmpdir / data)
            onnx.save_model(proto, tmpdir / dest.name)
            os.replace(tmpdir / data, dest.parent / data)
        elif proto.ByteSize() >= external_data_bytes:
            data = f"{dest.name}.data"
            onnx.save_model(proto, tmpdir / dest.name, save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data)  # fmt: skip
            os.replace(tmpdir / data, dest.parent / data)
        else:
            onnx.save_model(proto, tmpdir / dest.name)
        os.replace(tmpdir / dest.name, dest)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return dest


def _stream_tensors(proto: object, source: Path, data: Path, min_inline: int = 1024) -> None:
    """Move every initializer kept in a file under ``source``, and every inline one of
    ``min_inline`` bytes or more, into the one file ``data``, pointing the proto at it."""
    import onnx

    assert isinstance(proto, onnx.ModelProto)
    with open(data, "wb") as out:
        for t in proto.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                with open(source / info["location"], "rb") as f:
                    f.seek(int(info.get("offset", "0")))
                    raw = f.read(int(info["length"])) if "length" in info else f.read()
            elif len(t.raw_data) >= min_inline:
                raw = t.raw_data
                t.ClearField("raw_data")
            else:
                continue
            offset = out.tell()
            out.write(raw)
            del t.external_data[:]
            for key, value in (("location", data.name), ("offset", offset), ("length", len(raw))):
                entry = t.external_data.add()
                entry.key, entry.value = key, str(value)
            t.data_location = onnx.TensorProto.EXTERNAL
