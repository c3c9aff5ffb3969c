"""The zoo as a source provider (``zoo:<model>``, ``zoo:<dataset>/<split>``) for
:mod:`opsnn_quant.sources`, registered in ``pyproject.toml``'s ``opsnn_quant.sources`` entry
points: the library reaches the zoo only through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opsnn_quant import zoo
from opsnn_quant.errors import ConfigError

# the zoo's pipelines by family (a Whisper name is "whisper")
FAMILIES = {
    "shapes-t2i": "diffusers-sd",
    "shapes-dit": "diffusers-dit",
    "shapes-t2v": "diffusers-dit",
}


class ZooProvider:
    """Directories of the zoo models, their families, records of the zoo datasets."""

    def family(self, name: str) -> str:
        """The model family of zoo model ``name`` (without building its directory)."""
        return "whisper" if "whisper" in name else FAMILIES.get(name, "diffusers-sd")

    def model_names(self) -> list[str]:
        """The zoo's model names."""
        return zoo.list()

    def model_dir(self, name: str) -> Path:
        """The model's directory (converted into the cache first where needed)."""
        return zoo.model_dir(name)

    def records(self, name: str, limit: int | None) -> list[dict[str, Any]]:
        """Records of ``<dataset>/<split>``."""
        dataset, _, split = name.partition("/")
        if not split:
            raise ConfigError(f"zoo data source 'zoo:{name}' needs a split: zoo:<name>/<split>")
        return zoo.records(dataset, split, limit)
