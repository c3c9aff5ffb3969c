"""Safetensors files read safely (header first, bounded, never unpickled) and written in shards.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``), then the
data (https://github.com/huggingface/safetensors, "Format"). :func:`read_header` checks all of it
from the header alone: a huge or malformed header is refused before anything else is read, and
tensors are then read one at a time through ``safetensors.safe_open`` (memory-mapped).

Sharding follows msModelSlim's ``BufferedSafetensorsWriter`` / ``get_index_json``
(``msmodelslim/core/quant_service/modelslim_v1/save/utils/safetensors.py``): shards
``<prefix>-{i:05d}-of-{N:05d}.safetensors`` and ``<prefix>.safetensors.index.json`` =
``{"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from opsnn_quant.core.safetensors_header import MAX_HEADER_BYTES, read_safetensors_header
from opsnn_quant.errors import CheckpointError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
TensorInfo = tuple[torch.dtype, tuple[int, ...]]
Refusal = type[CheckpointError]
"""The error a reader raises (a format's own, e.g. ``AscendV1Error``; ``CheckpointError`` by
default): the message is one line naming the file or tensor."""


def read_header(
    path: Path, max_header_bytes: int = MAX_HEADER_BYTES, *, error: Refusal = CheckpointError
) -> dict[str, TensorInfo]:
    """Tensor name -> (dtype, shape) from a safetensors header, every entry checked
    (:func:`~opsnn_quant.core.safetensors_header.read_safetensors_header`: only the first ``8 + N``
    bytes are read, after ``N`` is checked against ``max_header_bytes`` and the file size).

    Raises:
        CheckpointError: (``error``) unreadable file, a header too large or malformed, a dtype
            that is not one of :data:`DTYPES`, or data offsets that do not fit the file or the
            tensor's size.
    """
    header = read_safetensors_header(path, error=error, max_header_bytes=max_header_bytes)
    out: dict[str, TensorInfo] = {}
    for name, entry in header.tensors.items():
        dtype = DTYPES.get(entry.dtype)
        if dtype is None:
            raise error(f"{path}: tensor {name} has unsupported dtype {entry.dtype!r}")
        out[name] = dtype, entry.shape
    return out


class TensorFiles:
    """The tensors of a set of safetensors files: names -> file, header info, lazy reads.

    Attributes:
        info: tensor name -> (dtype, shape).
        files: tensor name -> the file holding it.
        error: what a read that fails raises.
    """

    def __init__(
        self,
        files: Mapping[str, Path],
        info: Mapping[str, TensorInfo],
        error: Refusal = CheckpointError,
    ) -> None:
        self.files = dict(files)
        self.info = dict(info)
        self.error = error

    def load(self, name: str) -> torch.Tensor:
        """One tensor, read from its file (memory-mapped, nothing else is read)."""
        from safetensors import SafetensorError, safe_open

        path = self.files[name]
        try:
            with safe_open(str(path), framework="pt") as f:
                return f.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise self.error(f"{path}: cannot read tensor {name}: {exc}") from exc


def open_tensor_files(
    directory: Path, index: Path | None, files: list[Path], *, error: Refusal = CheckpointError
) -> TensorFiles:
    """Read a sharded set (``index``) or a list of safetensors files, checking every header.

    Raises:
        CheckpointError: (``error``) an index naming a missing shard or a tensor its shard lacks, a tensor in
            two files, or any header error of :func:`read_header`.
    """
    where: dict[str, Path] = {}
    info: dict[str, TensorInfo] = {}
    if index is not None:
        weight_map = _weight_map(index, error)
        headers: dict[str, dict[str, TensorInfo]] = {}
        for name, shard in sorted(weight_map.items()):
            path = directory / shard
            if shard not in headers:
                if "/" in shard or shard.startswith(".") or not path.is_file():
                    raise error(f"{index.name}: shard {shard!r} of {name} not found")
                headers[shard] = read_header(path, error=error)
            if name not in headers[shard]:
                raise error(f"{name}: named in {index.name} but not in {shard}")
            where[name], info[name] = path, headers[shard][name]
        for shard, header in headers.items():
            extra = sorted(set(header) - set(weight_map))
            if extra:
                raise error(f"{extra[0]}: in {shard} but not in {index.name}")
        return TensorFiles(where, info, error)
    for path in files:
        for name, entry in read_header(path, error=error).items():
            if name in where:
                raise error(f"{name}: in both {where[name].name} and {path.name}")
            where[name], info[name] = path, entry
    return TensorFiles(where, info, error)


def _weight_map(index: Path, error: Refusal) -> dict[str, str]:
    try:
        doc = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{index}: not a readable JSON index") from exc
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise error(f"{index}: 'weight_map' must map tensor names to shard file names")
    return weight_map


@dataclass(frozen=True)
class LazyTensor:
    """A tensor made only when it is written, and dropped right after.

    The AscendV1 writer holds these for the float weights it derives (a dequantized Conv2d):
    made all at once they were a second float copy of those layers (1.7 GB on an SD 1.5 UNet).

    Attributes:
        dtype: the tensor's dtype.
        shape: its shape.
        make: returns the tensor (called once per write).
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    make: Callable[[], torch.Tensor]

    def materialize(self) -> torch.Tensor:
        """The tensor, checked against the declared dtype and shape.

        Raises:
            CheckpointError: ``make`` returned another dtype or shape.
        """
        t = self.make()
        if t.dtype != self.dtype or tuple(t.shape) != self.shape:
            raise CheckpointError(
                f"a lazy tensor declared {self.dtype} {list(self.shape)} made "
                f"{t.dtype} {list(t.shape)}"
            )
        return t


Tensorish = torch.Tensor | LazyTensor
# safetensors' Rust writer (``prepare`` in ``safetensors/src/tensor.rs``) lays the data out by
# descending ``Dtype`` (its enum order) and then by name, so every tensor stays aligned; these
# ranks are that order for the dtypes we write (checked against ``save_file`` in the tests).
_DATA_ORDER = {"BOOL": 0, "U8": 1, "I8": 2, "I16": 3, "F16": 4, "BF16": 5, "I32": 6, "F32": 7,
               "F64": 8, "I64": 9}  # fmt: skip
_NAMES = {v: k for k, v in DTYPES.items()}


def tensor_bytes(t: Tensorish) -> int:
    """Bytes of a tensor's data."""
    return math.prod(t.shape) * torch.empty((), dtype=t.dtype).element_size()


def _raw(t: torch.Tensor) -> memoryview:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def write_safetensors(
    tensors: Mapping[str, Tensorish], path: Path, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` to ``path`` one at a time, byte for byte as ``safetensors.torch.save_file``.

    The header comes first from the dtypes and shapes alone; then each tensor's bytes are
    written from its memory (a :class:`LazyTensor` is made, written and dropped), so the peak is
    one tensor, not a serialized copy of the whole file.

    Raises:
        CheckpointError: a dtype safetensors has no name for.
    """
    for name, t in tensors.items():
        if t.dtype not in _NAMES:
            raise CheckpointError(
                f"tensor {name}: dtype {t.dtype} cannot be written to safetensors"
            )
    order = sorted(tensors, key=lambda n: (-_DATA_ORDER[_NAMES[tensors[n].dtype]], n))
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        t = tensors[name]
        size = tensor_bytes(t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in order:
            t = tensors[name]
            f.write(_raw(t.materialize() if isinstance(t, LazyTensor) else t))


def write_tensors(
    tensors: Mapping[str, Tensorish], directory: Path, prefix: str, shard_bytes: int | None
) -> list[str]:
    """Write ``tensors`` as ``<prefix>.safetensors``, or in shards of at most ``shard_bytes``.

    With ``shard_bytes`` (msModelSlim's ``part_file_size``, in bytes) the shard files and the
    index are always written, even for one shard (as ``BufferedSafetensorsWriter`` does); a
    shard closes when the next tensor would reach the limit. ``None``: one file, no index.
    Shards take the tensors in sorted name order, and each file is written as
    :func:`write_safetensors`, so equal inputs give equal bytes.

    Returns:
        The file names written.
    """
    names = sorted(tensors)
    meta = {"format": "pt"}
    if shard_bytes is None:
        write_safetensors(tensors, directory / f"{prefix}.safetensors", meta)
        return [f"{prefix}.safetensors"]
    groups: list[list[str]] = [[]]
    used = 0
    for name in names:
        size = tensor_bytes(tensors[name])
        if groups[-1] and used + size >= shard_bytes:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size
    total = len(groups)
    width = 5 if total <= 99999 else 0
    weight_map: dict[str, str] = {}
    written = []
    for i, group in enumerate(groups, 1):
        shard = f"{prefix}-{i:0{width}d}-of-{total:0{width}d}.safetensors"
        write_safetensors({n: tensors[n] for n in group}, directory / shard, meta)
        weight_map.update(dict.fromkeys(group, shard))
        written.append(shard)
    index = {
        "metadata": {"total_size": sum(tensor_bytes(t) for t in tensors.values())},
        "weight_map": weight_map,
    }
    (directory / f"{prefix}.safetensors.index.json").write_text(
        json.dumps(index, indent=2) + "\n", encoding="utf-8"
    )
    return [*written, f"{prefix}.safetensors.index.json"]
