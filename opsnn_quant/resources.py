"""Files shipped inside the package: built-in recipes (``recipes/``) and suites (``suites/``).

Found through :mod:`importlib.resources`, so they are there in a normal (non-editable) install
as in a checkout (where the repository's ``calibrate/`` and ``evaluate/`` point at them).
"""

from __future__ import annotations

import sys
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


def _main(argv: list[str]) -> int:
    """``python -m opsnn_quant.resources NAME...``: load each named built-in recipe and the suite
    of the same name where there is one (a check that an installed package ships them); prints
    each path."""
    from opsnn_quant.errors import OpsnnQuantError
    from opsnn_quant.evaluation.suite import load_suite
    from opsnn_quant.recipe import load_recipe

    try:
        for name in argv:
            recipe = load_recipe(name)
            print(builtin_files("recipes")[recipe.name])
            if name in builtin_files("suites"):
                load_suite(name)
                print(builtin_files("suites")[name])
    except OpsnnQuantError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
