"""Files a user gives, read strictly: a missing, unreadable or non-UTF-8 file, bad JSON or a
schema violation is one :class:`~opsnn_quant.errors.ConfigError` line naming the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from opsnn_quant.errors import ConfigError

_M = TypeVar("_M", bound=BaseModel)


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's contents.

    Raises:
        ConfigError: missing, unreadable or not UTF-8 (the message names the file and the byte).
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{p} not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{p} is a directory, not a file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc


def load_json_model(cls: type[_M], path: str | os.PathLike[str]) -> _M:
    """Read a JSON file and validate it as the pydantic model ``cls``.

    Raises:
        ConfigError: Missing file, bad JSON, not UTF-8 or a schema violation; the message names
            the file and the first offending field.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p} not found")
    try:
        return cls.model_validate_json(read_text(p))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{p}: {where}: {first['msg']}") from exc
