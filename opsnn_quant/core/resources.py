"""Files shipped inside the package: built-in recipes (``recipes/``) and suites (``suites/``).

Found through :mod:`importlib.resources`, so they are there in a normal (non-editable) install
as in a checkout (where the repository's ``calibrate/`` and ``evaluate/`` point at them).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal


def builtin_dir(kind: Literal["recipes", "suites"]) -> Path:
    """The package folder of built-in ``kind`` files."""
    return Path(str(resources.files("opsnn_quant") / kind))


def builtin_files(kind: Literal["recipes", "suites"]) -> dict[str, Path]:
    """Name (file stem) -> path of the built-in ``kind`` YAML files, sorted by name."""
    folder = builtin_dir(kind)
    if not folder.is_dir():
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}
