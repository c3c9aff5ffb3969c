"""Fingerprints of a probe's inputs: is this the same model and the same calibration data?

A probe is the expensive part of a run; a later run reuses it (``calibrate --from-probe``) only
when its model and data are the ones the probe saw. The fingerprints are sha256 digests:

* data: of every record's keys and values in order (text as UTF-8; arrays, tensors and PIL
  images as dtype, shape and bytes; lists item by item), so any changed prompt, sample or order
  changes it, and nothing depends on where an object sits in memory;
* model: of the model directory's files (relative path and size of each) and, per file, its
  first and last MiB and for ``.safetensors`` its whole header (the tensor names, shapes, dtypes
  and offsets): a retrained or re-saved checkpoint changes it without reading gigabytes. Two
  weight files that differ only strictly inside (past the first MiB and before the last) and keep
  every tensor's layout would collide; such an edit is not a checkpoint a tool writes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from opsnn_quant.sources import Source

_MIB = 1024 * 1024


def data_fingerprint(records: Sequence[Any]) -> str:
    """sha256 of the records (see the module docstring)."""
    h = hashlib.sha256()
    for record in records:
        items = record.items() if isinstance(record, dict) else [("", record)]
        for key, value in items:
            h.update(str(key).encode() + b"\0")
            _update(h, value)
        h.update(b"\1")
    return h.hexdigest()


def _update(h: Any, value: Any) -> None:
    if _is_image(value) or type(value).__name__ == "Tensor":
        # by content: a PIL image's or tensor's repr holds its address or a summary
        value = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, list | tuple):
        h.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _update(h, item)
    elif isinstance(value, dict):
        for k in sorted(value):
            h.update(str(k).encode() + b"\0")
            _update(h, value[k])
    elif isinstance(value, bytes):
        h.update(value)
    else:
        h.update(repr(value).encode())
    h.update(b"\0")


def _is_image(value: Any) -> bool:
    """A PIL image (duck-typed: PIL is not imported for this)."""
    return all(hasattr(value, a) for a in ("mode", "size", "getdata", "tobytes"))


def model_fingerprint(source: Source) -> str:
    """sha256 over the model directory's files (see the module docstring)."""
    root = source.path
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        h.update(f"{file.relative_to(root.parent if root.is_file() else root)}\0{size}\0".encode())
        with file.open("rb") as f:
            h.update(f.read(_MIB))
            if size > 2 * _MIB:
                f.seek(size - _MIB)
                h.update(f.read(_MIB))
            if file.suffix == ".safetensors" and size >= 8:
                f.seek(0)
                (n,) = struct.unpack("<Q", f.read(8))
                if 0 < n <= min(size - 8, 100 * _MIB):
                    h.update(f.read(n))
    return h.hexdigest()


def probe_inputs(source: Source, records: Sequence[Any]) -> dict[str, str]:
    """The fingerprints a probe report records: ``{"model": ..., "data": ...}``."""
    return {"model": model_fingerprint(source), "data": data_fingerprint(records)}


def differences(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """The inputs whose fingerprints differ (a missing one counts as different)."""
    return [k for k in sorted(set(recorded) | set(current)) if recorded.get(k) != current.get(k)]


def json_of(value: Any) -> str:
    """A config as canonical JSON (sorted keys): what two probe configs are compared by."""
    return json.dumps(value, sort_keys=True, default=str)


__all__ = ["data_fingerprint", "differences", "json_of", "model_fingerprint", "probe_inputs"]
