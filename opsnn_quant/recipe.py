"""Calibration recipes (``calibrate/*.yaml``): model, data, probe settings, budget, target.

A recipe is a YAML file validated by pydantic. The CLI takes a recipe path or the name of a
built-in one (``shapes-t2i``, ``whisper-tiny-en``): built-ins live in the repository's
``calibrate/`` folder and are shipped inside the package as ``opsnn_quant/recipes/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.budget import Budget
from opsnn_quant.types import Modality

BUILTIN_DIRS = (
    Path(__file__).resolve().parent / "recipes",
    Path(__file__).resolve().parent.parent / "calibrate",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Strict):
    """Which model, loaded by which adapter, run with which settings."""

    family: Literal["diffusers-sd", "whisper"]
    source: str = Field(description="zoo:<name> or a local model directory")
    settings: dict[str, Any] = Field(default_factory=dict)


class DataSection(_Strict):
    """Calibration data (see :mod:`opsnn_quant.models.data` for the source forms)."""

    calibration: str
    limit: int | None = Field(default=None, gt=0)
    holdout: str | None = Field(default=None, description="held-out data to measure the result on")
    holdout_limit: int | None = Field(default=None, gt=0)


class ProbeSection(_Strict):
    """Probe settings (fields of :class:`opsnn_quant.probe.api.ProbeConfig`)."""

    min_headroom: float = Field(default=2.0, ge=1.0)
    max_root_calls: int = Field(default=8, gt=0)
    estimator_batch: int | dict[str, int] | None = Field(
        default=None,
        description="samples per estimator replay, for every modality or per modality name "
        "(None / a modality left out: whole calls)",
    )
    estimator: Literal["structured", "diagonal"] = Field(
        default="structured",
        description="end-to-end estimator: structured (each candidate's real noise) or diagonal "
        "(measured per-channel noise power; cheapest)",
    )
    exhaustive: bool = False
    data_limit: int | None = Field(default=None, gt=0, description="use only the first N samples")

    @field_validator("estimator_batch")
    @classmethod
    def _check_estimator_batch(cls, v: int | dict[str, int] | None) -> int | dict[str, int] | None:
        values = v.values() if isinstance(v, dict) else [] if v is None else [v]
        if any(n <= 0 for n in values):
            raise ValueError("estimator_batch must be positive")
        if isinstance(v, dict):
            known = {m.value for m in Modality}
            unknown = sorted(set(v) - known)
            if unknown:
                raise ValueError(f"unknown modality {unknown} (known: {sorted(known)})")
        return v


class Recipe(_Strict):
    """A calibration recipe."""

    name: str
    model: ModelSection
    data: DataSection
    probe: ProbeSection = Field(default_factory=ProbeSection)
    budget: Budget = Field(default_factory=Budget)
    target: str = "cpu-reference"
    strategy: Literal["search", "all-w8a8-minmax", "all-fp16"] = Field(
        default="search", description="search the policy, or a reference baseline to compare with"
    )
    exports: list[str] = Field(
        default_factory=lambda: [
            "amct-cfg",
            "amct-eager",
            "atc-keep-dtype",
            "atc-customize-dtypes",
            "atc-modify-mixlist",
        ]
    )
    seed: int = 0


def builtin_recipes() -> dict[str, Path]:
    """Name -> path of the built-in recipes."""
    out: dict[str, Path] = {}
    for d in BUILTIN_DIRS:
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                out.setdefault(p.stem, p)
    return out


def resolve_recipe(name_or_path: str) -> Path:
    """A recipe path from a path or a built-in name."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError(f"recipe {name_or_path} not found")
        return p
    known = builtin_recipes()
    if name_or_path not in known:
        raise ConfigError(
            f"unknown recipe {name_or_path!r}; built-in: {', '.join(sorted(known)) or 'none'}"
        )
    return known[name_or_path]


def load_recipe(name_or_path: str) -> Recipe:
    """Load and validate a recipe; errors name the field and its YAML line."""
    path = resolve_recipe(name_or_path)
    text = path.read_text()
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a YAML mapping")
    data.setdefault("name", path.stem)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(x) for x in err["loc"]]
        line = _line_of(node, loc)
        where = f"line {line}: " if line else ""
        raise ConfigError(f"{path}: {where}{'.'.join(loc)}: {err['msg']}") from exc


def _line_of(node: Any, loc: list[str]) -> int | None:
    """1-based line of the deepest YAML node on ``loc`` (None if not found)."""
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    line = k.start_mark.line + 1
                    node = v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            node = node.value[int(key)]
            line = node.start_mark.line + 1
        else:
            return line
    return line
