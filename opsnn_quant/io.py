"""Atomic file and directory writes: a crash leaves the previous output intact or none at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from opsnn_quant.errors import ConfigError

_M = TypeVar("_M", bound=BaseModel)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temporary sibling of ``path`` and rename it into place."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a directory in ``<path>.tmp-*`` and swap it into place when the block succeeds.

    On an exception (Ctrl-C included) the temporary directory is removed and ``path`` keeps its
    previous contents. The swap renames the old directory aside first, so at no point is a
    half-written ``path`` visible.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{target.name}.old-", dir=target.parent))
        old.rmdir()
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def load_json_model(cls: type[_M], path: str | os.PathLike[str]) -> _M:
    """Read a JSON file and validate it as the pydantic model ``cls``.

    Raises:
        ConfigError: Missing file, bad JSON or a schema violation; the message names the file and
            the first offending field.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p} not found")
    try:
        return cls.model_validate_json(p.read_text())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{p}: {where}: {first['msg']}") from exc
