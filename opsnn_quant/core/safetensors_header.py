"""A safetensors file's header, read and checked before any tensor is (standard library only).

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``),
then the data: a byte buffer that the tensors cover whole, without holes or overlaps, offsets
relative to its start (https://github.com/huggingface/safetensors, "Format"; the checks are
those of its Rust ``validate``). :func:`read_safetensors_header` reads the first ``8 + N``
bytes only, after ``N`` is checked against the file size and :data:`MAX_HEADER_BYTES`, so a
corrupt or hostile file is refused in one line before a loader memory-maps it or allocates a
tensor of the size it claims.

A neutral module: the model checks (:mod:`opsnn_quant.models.checks`), the quantized
checkpoint reader (:mod:`opsnn_quant.formats.checkpoint`) and the AscendV1 reader
(:mod:`opsnn_quant.formats.safetensors_io`) share it, each raising its own error class.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsnn_quant.errors import InputError, ModelLoadError

MAX_HEADER_BYTES = 100_000_000
"""safetensors itself refuses headers over 100 MB (``MAX_HEADER_SIZE`` in its Rust source)."""

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E5M2FNUZ": 8, "F8_E4M3FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}  # fmt: skip
"""Bits per element of each dtype the installed ``safetensors.torch`` reads (its ``_TYPES``)."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header, checked.

    Attributes:
        dtype: the safetensors dtype name (``F32``, ``BF16``, ...; a key of
            :data:`DTYPE_BITS`).
        shape: the tensor's shape (non-negative sizes).
        begin: first byte of its data, relative to the data section.
        end: one past its last byte (``end - begin`` is exactly its size).
    """

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked safetensors header.

    Attributes:
        tensors: tensor name -> its entry.
        metadata: the ``__metadata__`` strings (empty when there are none).
        data_bytes: the size of the data section (the file after ``8 + N``).
    """

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_bytes: int


def read_safetensors_header(
    path: str | Path,
    *,
    error: type[InputError] = ModelLoadError,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> SafetensorsHeader:
    """The checked header of the safetensors file ``path``; only its first ``8 + N`` bytes
    are read, after ``N`` is checked against ``max_header_bytes`` and the file size.

    Args:
        path: the file.
        error: the error class raised (the caller's: a model, a checkpoint, an export).
        max_header_bytes: the largest header accepted.

    Returns:
        The tensors' entries and the metadata (see :func:`check_safetensors_header`).

    Raises:
        InputError: (``error``) an unreadable file, one shorter than 8 bytes, a header length
            past the end of the file or over ``max_header_bytes``, or a header that
            :func:`check_safetensors_header` refuses; one line naming the file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise error(
                    f"{path}: not a safetensors file ({size} bytes, shorter than 8 bytes): "
                    "the file is truncated; save or download it again"
                )
            (n,) = struct.unpack("<Q", head)
            if n > max_header_bytes or n > size - 8:
                raise error(
                    f"{path}: safetensors header of {n} bytes refused (limit "
                    f"{min(max_header_bytes, size - 8)} for this {size}-byte file): the file is "
                    "truncated or not safetensors; save or download it again"
                )
            raw = f.read(n)
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{path}: safetensors header is not valid JSON (UTF-8)") from exc
    return check_safetensors_header(header, size - 8 - n, where=str(path), error=error)


def check_safetensors_header(
    header: Any,
    data_bytes: int,
    *,
    where: str = "safetensors file",
    error: type[InputError] = ModelLoadError,
) -> SafetensorsHeader:
    """Check a parsed safetensors header against the size of the data section it describes.

    Every entry needs a known dtype (:data:`DTYPE_BITS`), a shape of non-negative integers and
    ``data_offsets`` ``[begin, end]`` with ``0 <= begin <= end <= data_bytes`` and
    ``end - begin`` = the elements times the dtype's size; together the tensors cover the data
    section whole, in some order, without overlaps or holes. ``__metadata__``, when present,
    maps strings to strings.

    Args:
        header: the JSON header (any value: a non-object is refused).
        data_bytes: the size of the data section (the file's size less ``8 + N``).
        where: what the message names (the file's path).
        error: the error class raised.

    Returns:
        The checked header.

    Raises:
        InputError: (``error``) the first problem found, one line naming the tensor.
    """
    if not isinstance(header, dict):
        raise error(f"{where}: safetensors header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise error(f"{where}: safetensors __metadata__ is not an object of strings")
    tensors = {
        name: _entry(where, name, entry, data_bytes, error)
        for name, entry in header.items()
        if name != "__metadata__"
    }
    _check_coverage(where, tensors, data_bytes, error)
    return SafetensorsHeader(tensors, dict(metadata), data_bytes)


def _entry(
    where: str, name: str, entry: object, data_bytes: int, error: type[InputError]
) -> TensorEntry:
    if not isinstance(entry, dict):
        raise error(f"{where}: header entry {name!r} is not an object")
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise error(
            f"{where}: tensor {name} has unsupported dtype {dtype!r} (safetensors knows "
            f"{', '.join(DTYPE_BITS)})"
        )
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise error(
            f"{where}: tensor {name} has a malformed shape {shape!r} (a list of non-negative "
            "integers)"
        )
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_int(o) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise error(
            f"{where}: tensor {name} has data offsets {offsets!r} outside the file (its data "
            f"section is {data_bytes} bytes)"
        )
    begin, end = offsets
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits != (end - begin) * 8:
        raise error(
            f"{where}: tensor {name}: data size does not match its shape and dtype ({dtype} "
            f"{_shape_text(shape)} is {bits // 8} bytes, its data offsets hold {end - begin})"
        )
    return TensorEntry(dtype, tuple(shape), begin, end)


def _check_coverage(
    where: str, tensors: dict[str, TensorEntry], data_bytes: int, error: type[InputError]
) -> None:
    """The tensors' data cover ``[0, data_bytes)`` whole, each byte once, in the order of their
    offsets (a zero-size tensor between two others, at the end of the first)."""
    at, previous = 0, None
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin < at:
            raise error(
                f"{where}: tensors {previous} and {name} overlap (data bytes {t.begin} to "
                f"{at}): the file is corrupt; save or download it again"
            )
        if t.begin > at:
            raise error(
                f"{where}: data bytes {at} to {t.begin} belong to no tensor (before {name}): "
                "the file is corrupt; save or download it again"
            )
        if t.end > t.begin:
            at, previous = t.end, name
    if at != data_bytes:
        raise error(
            f"{where}: the tensors cover {at} of the {data_bytes} data bytes: the file is "
            "corrupt; save or download it again"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape_text(shape: list[int]) -> str:
    text = "x".join(str(d) for d in shape) or "scalar"
    return text if len(text) <= 60 else text[:57] + "..."
