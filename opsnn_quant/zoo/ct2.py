"""Reader of CTranslate2 ``model.bin`` files (pure numpy, no ``ctranslate2`` dependency).

The format is the one written by ``ctranslate2.specs.model_spec.ModelSpec._serialize`` (binary
version 6 in current CTranslate2; versions 4-6 share the layout read here). All integers are
little-endian; a *string* is a ``uint16`` byte count that includes a trailing NUL, then the UTF-8
bytes, then the NUL::

    uint32  binary_version                      (4, 5 or 6 are accepted)
    string  spec_name                           e.g. "WhisperSpec"
    uint32  spec_revision                       e.g. 3
    uint32  num_variables
    num_variables times, sorted by name:
        string  name                            scope separated by "/", e.g. "encoder/conv1/weight"
        uint8   rank
        uint32  dims[rank]                      row-major shape; rank 0 is a scalar
        uint8   dtype_id                        0 float32, 1 int8, 2 int16, 3 int32, 4 float16,
                                                5 bfloat16 (CTranslate2's DataType enum order)
        uint32  num_bytes                       prod(dims) * itemsize
        bytes   data[num_bytes]                 raw little-endian values, C order
    uint32  num_aliases
    num_aliases times:
        string  alias                           e.g. "decoder/projection/weight"
        string  target                          an existing variable, e.g. "decoder/embeddings/weight"

Aliases are how CTranslate2 stores tied weights once (the converter aliases any variable whose
value equals another one). Scalars (rank 0) carry model options such as ``decoder/num_heads`` or
``decoder/pre_norm``; boolean options are stored as int8.

Versions 1-3 stored the dtype as an item size and are not produced by any converter in use
today, so they are refused rather than guessed.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from opsnn_quant.errors import ModelLoadError

logger = logging.getLogger(__name__)

SUPPORTED_BINARY_VERSIONS = (4, 5, 6)

# Index = CTranslate2 dtype id. bfloat16 has no numpy dtype: it is read as its raw uint16 bits and
# widened to float32 afterwards (bf16 is the upper half of an fp32 word, so this is exact).
_DTYPES: tuple[np.dtype, ...] = (
    np.dtype("<f4"),
    np.dtype("i1"),
    np.dtype("<i2"),
    np.dtype("<i4"),
    np.dtype("<f2"),
    np.dtype("<u2"),
)
DTYPE_NAMES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_BF16_ID = 5


@dataclass(frozen=True)
class CT2Variable:
    """One stored variable with its on-disk metadata.

    Attributes:
        name: Full scoped name, e.g. ``encoder/layer_0/ffn/linear_0/weight``.
        dtype_name: CTranslate2 dtype name (``float16``, ``int8``, ...).
        value: The data; ``float32`` for ``bfloat16`` variables, the stored dtype otherwise.
    """

    name: str
    dtype_name: str
    value: np.ndarray


@dataclass
class CT2Model:
    """The content of a ``model.bin``.

    Attributes:
        binary_version: Format version from the header.
        spec_name: Name of the CTranslate2 model specification, e.g. ``WhisperSpec``.
        spec_revision: Revision of that specification.
        variables: Stored variables by name, in file order.
        aliases: Alias name -> name of the variable it points to.
    """

    binary_version: int
    spec_name: str
    spec_revision: int
    variables: dict[str, CT2Variable] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.variables or name in self.aliases

    def array(self, name: str) -> np.ndarray:
        """Value of a variable or of the variable an alias points to.

        Raises:
            KeyError: No variable or alias has this name.
        """
        return self.variables[self.aliases.get(name, name)].value

    def scalar(self, name: str) -> int | float:
        """Python value of a rank-0 variable (model option)."""
        value = self.array(name)
        if value.ndim != 0:
            raise ValueError(f"{name} is not a scalar (shape {value.shape})")
        return value.item()


class _Cursor:
    """Bounds-checked sequential reader over the file bytes."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.data = data
        self.pos = 0
        self.path = path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise ModelLoadError(
                f"{self.path}: truncated CTranslate2 file (wanted {n} bytes at offset {self.pos}, "
                f"size {len(self.data)}); reinstall the package that ships it"
            )
        view = memoryview(self.data)[self.pos : self.pos + n]
        self.pos += n
        return view

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))
        return int(value)

    def string(self) -> str:
        length = self.unpack("H")
        raw = bytes(self.take(length))
        if length == 0 or raw[-1] != 0:
            raise ModelLoadError(f"{self.path}: malformed string at offset {self.pos - length}")
        return raw[:-1].decode("utf-8")


def read_ct2_model(path: str | Path) -> CT2Model:
    """Read every variable and alias of a CTranslate2 ``model.bin``.

    Args:
        path: The ``model.bin`` file (or the model directory holding it).

    Returns:
        The parsed model. Arrays own their memory (writable copies), so they can be handed to
        ``torch.from_numpy`` directly.

    Raises:
        ModelLoadError: The file is missing, truncated, of an unsupported binary version, or has
            inconsistent sizes.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "model.bin"
    if not path.is_file():
        raise ModelLoadError(f"{path}: CTranslate2 model file not found")
    cur = _Cursor(path.read_bytes(), path)

    version = cur.unpack("I")
    if version not in SUPPORTED_BINARY_VERSIONS:
        raise ModelLoadError(
            f"{path}: CTranslate2 binary version {version} is not supported "
            f"(supported: {', '.join(map(str, SUPPORTED_BINARY_VERSIONS))})"
        )
    model = CT2Model(binary_version=version, spec_name=cur.string(), spec_revision=cur.unpack("I"))

    for _ in range(cur.unpack("I")):
        name = cur.string()
        rank = cur.unpack("B")
        shape = tuple(cur.unpack("I") for _ in range(rank))
        dtype_id = cur.unpack("B")
        num_bytes = cur.unpack("I")
        if dtype_id >= len(_DTYPES):
            raise ModelLoadError(f"{path}: variable {name} has unknown dtype id {dtype_id}")
        dtype = _DTYPES[dtype_id]
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if num_bytes != expected:
            raise ModelLoadError(
                f"{path}: variable {name} stores {num_bytes} bytes, shape {shape} of "
                f"{DTYPE_NAMES[dtype_id]} needs {expected}"
            )
        value = np.frombuffer(cur.take(num_bytes), dtype=dtype).reshape(shape).copy()
        if dtype_id == _BF16_ID:
            value = (value.astype(np.uint32) << 16).view(np.float32)
        model.variables[name] = CT2Variable(name, DTYPE_NAMES[dtype_id], value)

    for _ in range(cur.unpack("I")):
        alias, target = cur.string(), cur.string()
        if target not in model.variables:
            raise ModelLoadError(f"{path}: alias {alias} points to missing variable {target}")
        model.aliases[alias] = target

    if cur.pos != len(cur.data):
        raise ModelLoadError(f"{path}: {len(cur.data) - cur.pos} unexpected trailing bytes")
    logger.debug(
        "read %s: %s rev %d, %d variables, %d aliases",
        path,
        model.spec_name,
        model.spec_revision,
        len(model.variables),
        len(model.aliases),
    )
    return model
