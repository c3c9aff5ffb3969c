"""The recipe a command line means: a recipe file with flags over its fields, or no recipe at all.

``calibrate --model DIR --data SRC`` needs no recipe: the family is guessed from the model's files
(as ``probe`` does), the target is the family's usual engine (its ``target``), the probe
settings its family's (its ``probe``: Whisper's encoder replayed one utterance at a time) and
``--set KEY=VALUE`` gives model settings. With a recipe, the same flags override its fields. The
result is validated as a recipe file is, and written into the output as ``recipe.yaml``
(:func:`recipe_yaml`) so that the run can be repeated exactly with ``calibrate OUT/recipe.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from opsnn_quant.core.user_config import check_limit, keys_hint
from opsnn_quant.errors import ConfigError
from opsnn_quant.models.family import find_family
from opsnn_quant.models.settings import parse_set_options
from opsnn_quant.pipeline.recipe import (
    SEARCHES,
    Recipe,
    family_choices,
    is_suite_path,
    load_recipe,
    settings_keys,
)
from opsnn_quant.policy.baselines import STRATEGIES

DEFAULT_RECIPE = "shapes-t2i"


@dataclass(frozen=True)
class RecipeFlags:
    """Command-line flags over a recipe's fields (None / empty: the recipe's own).

    Attributes:
        model: ``model.source`` (a directory or ``zoo:NAME``).
        data: ``data.calibration``.
        family: ``model.family`` (guessed from the model's files when the model changes).
        target: ``target``.
        limit: ``data.limit``.
        sets: ``KEY=VALUE`` items over ``model.settings``.
        column: ``data.column`` (of a ``datasets`` source).
        split: ``data.split``.
        holdout: ``data.holdout`` (held-out records the quantized model is measured on).
        budget: ``budget``, replaced whole: a YAML file's path or inline YAML (e.g.
            ``{metric: {suite: whisper-tiny-en, wer_delta_max_points: 0.5}}``).
    """

    model: str | None = None
    data: str | None = None
    family: str | None = None
    target: str | None = None
    limit: int | None = None
    sets: tuple[str, ...] = ()
    column: str | None = None
    split: str | None = None
    holdout: str | None = None
    budget: str | None = None

    def any(self) -> bool:
        """Whether a flag is given."""
        return any(
            (self.model, self.data, self.family, self.target, self.limit, self.sets,
             self.column, self.split, self.holdout, self.budget)
        )  # fmt: skip


@dataclass(frozen=True)
class RecipeEdits:
    """What the command line changes of a recipe beyond its fields' values (None / False: the
    recipe's own), applied after the flags (:meth:`apply`).

    Attributes:
        device, dtype: where and in which dtype the model loads (``--device``, ``--dtype``).
        strategy: how the policy is decided (``--strategy``: the search or a naive baseline).
        allow_pickle: pickle-only weights may be read (``--allow-pickle``).
        max_memory: host memory (bytes) the model may take (``--max-memory``).
        search: ``first`` or ``full`` (``--search``: the recipe's ``search``).

    Raises:
        ConfigError: an unknown strategy or search (when made: before the recipe is read).
    """

    device: str | None = None
    dtype: str | None = None
    strategy: str | None = None
    allow_pickle: bool = False
    max_memory: int | None = None
    search: str | None = None

    def __post_init__(self) -> None:
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise ConfigError(
                f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        if self.search is not None and self.search not in SEARCHES:
            raise ConfigError(f"--search must be one of {', '.join(SEARCHES)}, got {self.search!r}")

    def apply(self, recipe: Recipe) -> Recipe:
        """``recipe`` with these edits.

        Raises:
            ConfigError: a device or dtype name the recipe schema refuses.
        """
        edited = recipe.with_placement(self.device, self.dtype)
        if self.strategy is not None:
            edited = edited.with_strategy(self.strategy)
        if self.search is not None:
            edited = edited.model_copy(update={"search": self.search})
        if self.allow_pickle:  # as the recipe's model.allow_pickle: true
            model = edited.model.model_copy(update={"allow_pickle": True})
            edited = edited.model_copy(update={"model": model})
        return edited.with_max_memory(self.max_memory)


def effective_recipe(recipe: str | None, flags: RecipeFlags) -> Recipe:
    """The recipe ``recipe`` (a path or built-in name; None: none, or the demo's without
    ``--model``) with ``flags`` over its fields, validated.

    Raises:
        ConfigError: a bad recipe, ``--model`` without ``--data`` and without a recipe, a model
            whose family cannot be told, or a field the flags make invalid (named by its flag).
    """
    check_limit(flags.limit)
    if recipe is None and flags.model is None:
        recipe = DEFAULT_RECIPE
    if recipe is None:
        assert flags.model is not None
        if flags.data is None:
            raise ConfigError("--model without a recipe needs --data (e.g. prompts.txt)")
        data = _with_family_probe(_apply(_bare(flags.model), flags))
        return _validated(data)
    else:
        base = load_recipe(recipe)
        if not flags.any():
            return base
        data = base.model_dump(mode="json", exclude_none=True)
    return _validated(_apply(data, flags))


def _with_family_probe(recipe: dict[str, Any]) -> dict[str, Any]:
    """A recipe without a file gets its family's probe settings (:attr:`Family.probe`: what the
    family's shipped recipes set for memory), as a recipe file would write them."""
    family = find_family(recipe["model"]["family"])
    if family is None or not family.probe:
        return recipe
    return {**recipe, "probe": {**family.probe, **recipe.get("probe", {})}}


def _bare(model: str) -> dict[str, Any]:
    """A recipe's fields for ``model`` alone (the flags fill in the rest)."""
    stem = Path(model.split(":", 1)[-1].rstrip("/")).name or "model"
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", stem).lstrip("-._") or "model"
    return {"name": name, "model": {"source": model}, "data": {}}


def _apply(data: dict[str, Any], flags: RecipeFlags) -> dict[str, Any]:
    """``data`` (a recipe's fields) with the flags applied."""
    from opsnn_quant.models import check_model_source, guess_family
    from opsnn_quant.sources import resolve_source

    model = dict(data.get("model", {}))
    if flags.model is not None and flags.model != model.get("source"):
        check_model_source(resolve_source(flags.model))
        model = {k: v for k, v in model.items() if k not in ("source", "family", "settings")}
        model["source"] = flags.model
    if flags.model is not None:  # absolute, as recipe.yaml records it (from_cwd)
        model["source"] = from_cwd(model["source"])
    if flags.family is not None:
        model["family"] = flags.family
    elif "family" not in model:
        model["family"] = guess_family(resolve_source(model["source"]))
    model["settings"] = {**model.get("settings", {}), **parse_set_options(flags.sets)}
    recipe = {**data, "model": model}
    section = dict(recipe.get("data", {}))
    if flags.data is not None:
        section["calibration"] = from_cwd(flags.data)
    holdout = from_cwd(flags.holdout) if flags.holdout is not None else None
    for key, value in (("limit", flags.limit), ("column", flags.column), ("split", flags.split),
                       ("holdout", holdout)):  # fmt: skip
        if value is not None:
            section[key] = value
    recipe["data"] = section
    if flags.budget is not None:
        recipe["budget"] = budget_flag(flags.budget)
        metric = recipe["budget"].get("metric")
        for key in ("data", "suite") if isinstance(metric, dict) else ():
            value = metric.get(key)
            if isinstance(value, str) and (key == "data" or is_suite_path(value)):
                metric[key] = from_cwd(value)
    if flags.target is not None:
        recipe["target"] = flags.target
    family = find_family(model["family"])  # the engine its models are usually served by
    recipe.setdefault("target", family.target if family is not None else "cpu-reference")
    return recipe


def from_cwd(value: str) -> str:
    """A command-line path made absolute against the working directory, as the recipe written
    into the output records it (``calibrate OUT/recipe.yaml`` then repeats the run from any
    directory); a named source (``zoo:...``), an absolute path and a path that does not exist
    (refused later, as typed) are returned as they are."""
    from opsnn_quant.sources import is_named

    path = Path(value)
    if is_named(value) or path.is_absolute() or not path.exists():
        return value
    return str(Path.cwd() / path)


def budget_flag(text: str) -> dict[str, Any]:
    """``--budget``: the YAML mapping of a file (``*.yaml``, ``*.yml``) or of the text itself.

    Raises:
        ConfigError: not YAML, or not a mapping.
    """
    from opsnn_quant.core.readers import read_text

    raw = read_text(Path(text)) if text.endswith((".yaml", ".yml")) else text
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--budget is not YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            "--budget takes a mapping, e.g. '{metric: {suite: whisper-tiny-en, "
            f"wer_delta_max_points: 0.5}}}}', got {text!r}"
        )
    return data


# recipe fields -> the flag that set them, for error messages
_FLAG_OF = {
    "model.source": "--model",
    "model.family": "--family",
    "data.calibration": "--data",
    "data.limit": "--limit",
    "data.column": "--data-column",
    "data.split": "--split",
    "data.holdout": "--holdout",
    "target": "--target",
}


def _validated(data: dict[str, Any]) -> Recipe:
    """``data`` as a Recipe; an error names the flag (or the recipe field) it comes from."""
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if loc == "model.family":  # not a string or not registered
            msg = family_choices()
        if loc.startswith("model.settings."):
            key = loc.removeprefix("model.settings.")
            where = f"--set {key}"
            if err["type"] == "extra_forbidden":
                family = data.get("model", {}).get("family", "the model's")
                msg += keys_hint(key, settings_keys(data), f"{family} settings are")
        elif loc == "budget" or loc.startswith("budget."):
            where = f"--budget {loc.removeprefix('budget').lstrip('.')}".rstrip()
        else:
            where = _FLAG_OF.get(loc, loc)
        raise ConfigError(f"{where}: {msg}" if where else msg) from exc


def recipe_yaml(recipe: Recipe) -> str:
    """The recipe as a file (every field, defaults included): ``calibrate`` writes it into its
    output, and loading it gives the same recipe."""
    header = (
        "# the effective recipe of this run: `opsnn-quant calibrate recipe.yaml` repeats it\n"
        "# its local paths are absolute (a relative one was resolved against the directory it was\n"
        "# given in: the recipe file's, or the working directory for a command-line flag), so it\n"
        "# repeats the run from any directory\n"
    )
    body = recipe.model_dump(mode="json", exclude_none=True)
    # where the weights live, not what is written: an offloaded run writes the same files
    body["model"].pop("max_memory", None)
    return header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True)
