"""Calibration recipes (``calibrate/*.yaml``): model, data, probe settings, budget, target.

A recipe is a YAML file validated by pydantic before any model loads: an unknown field, a wrong
type, an unknown target or export format, a name that is not a plain identifier all fail with the
field and its YAML line. The CLI takes a recipe path or the name of a built-in one
(``shapes-t2i``, ``whisper-tiny-en``); built-ins ship inside the package (``opsnn_quant/recipes``,
which the repository's ``calibrate/`` points at).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from opsnn_quant.core.readers import read_text
from opsnn_quant.core.resources import builtin_files
from opsnn_quant.core.user_config import (
    SampleLimit,
    Seed,
    StrictModel,
    did_you_mean,
    keys_hint,
    known_fields,
    yaml_error,
)
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.registry import budget_problem
from opsnn_quant.formats.registry import exporters
from opsnn_quant.models.family import FamilySettings, family_names, find_family
from opsnn_quant.policy.baselines import Strategy
from opsnn_quant.policy.budget import Budget
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.sources import Source
from opsnn_quant.types import DEVICE_PATTERN, Modality

# A recipe name becomes the default output folder out/<name>: a plain identifier, never a path.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class ModelSection(StrictModel):
    """Which model, loaded by which family's adapter, run with which settings: the family's
    own settings model (:mod:`opsnn_quant.models.family`), so that a registered family's
    settings are validated as a built-in's are."""

    source: str = Field(description="zoo:<name> or a local model directory")
    device: str = Field(
        default="cpu", pattern=DEVICE_PATTERN, description="cpu, npu, npu:N, cuda or cuda:N"
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32", description="dtype the model is loaded in"
    )
    allow_pickle: bool = Field(
        default=False,
        description="read weights that exist as pickles only (*.bin, *.pt, *.pth, *.ckpt) with "
        "torch.load(weights_only=True); false: safetensors only, such a model is refused",
    )
    max_memory: int | None = Field(
        default=None,
        description="host memory the model may take, e.g. 2GiB (bytes once read): the "
        "transformer blocks beyond it are offloaded to disk and run one at a time (the same "
        "files as in memory); --max-memory overrides it",
    )

    @field_validator("max_memory", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int | None:
        from opsnn_quant.models.footprint import parse_size

        if v is None or (type(v) is int and v >= 1):
            return v
        if not isinstance(v, str):
            raise ValueError(f"takes a size such as 64GiB or 512MiB, got {v!r}")
        try:
            return parse_size(v, "model.max_memory")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    family: str = Field(
        description="a registered model family (diffusers-sd, diffusers-dit, whisper, or a "
        "team's own)"
    )
    # validated by the family's settings model (below); the instance kept, its fields written
    settings: SerializeAsAny[FamilySettings] = Field(
        default_factory=dict,  # validated into the family's settings model
        validate_default=True,
        description="the family's settings (see its settings model)",
    )

    @field_validator("family")
    @classmethod
    def _registered(cls, v: str) -> str:
        if find_family(v) is None:
            raise ValueError(family_choices())
        return v

    @field_validator("settings", mode="before")
    @classmethod
    def _family_settings(cls, v: Any, info: ValidationInfo) -> Any:
        family = find_family(info.data.get("family", ""))
        if family is None:  # the family's own error says what is wrong
            return FamilySettings()
        return family.validate(v)


def family_choices() -> str:
    """What a recipe's ``model.family`` may be (the message of a bad one)."""
    return f"must be one of {', '.join(sorted(family_names()))}"


def settings_keys(data: object) -> list[str]:
    """The settings keys of the family a raw recipe mapping names (empty for none known)."""
    family = find_family(_family(data))
    return list(family.settings.model_fields) if family is not None else []


class DataSection(StrictModel):
    """Calibration data (see :mod:`opsnn_quant.models.data` for the source forms)."""

    calibration: str
    limit: SampleLimit | None = None
    holdout: str | None = Field(default=None, description="held-out data to measure the result on")
    holdout_limit: SampleLimit | None = None
    column: str | None = Field(
        default=None,
        description="the column of a datasets source (calibration and holdout) to read "
        "(default: its audio column, else the first of prompt/text/caption/sentence)",
    )
    split: str | None = Field(
        default=None, description="the split of a datasets source with several (default: train)"
    )

    def load(self, source: str, limit: int | None) -> list[dict[str, Any]]:
        """The records of ``source`` (the calibration or held-out data) with this section's
        column and split (a named source, e.g. a zoo split beside a user's file, has neither:
        they apply to the other)."""
        from opsnn_quant.models.data import load_records
        from opsnn_quant.sources import is_named

        if is_named(source):
            return load_records(source, limit)
        return load_records(source, limit, column=self.column, split=self.split)


class ProbeSection(StrictModel):
    """Probe settings: fields of :class:`opsnn_quant.probe.config.ProbeConfig` (a field left out
    takes ProbeConfig's default; see :meth:`Recipe.probe_config`), plus ``data_limit``."""

    min_headroom: float | None = Field(default=None, ge=1.0)
    max_root_calls: int | None = Field(default=None, gt=0)
    estimator_batch: int | dict[str, int] | None = Field(
        default=None,
        description="samples per estimator replay, for every modality or per modality name "
        "(None / a modality left out: whole calls)",
    )
    estimator_samples: int | dict[str, int] | None = Field(
        default=None,
        description="samples of each recorded call the estimator replays (evenly spread over "
        "its batch), for every modality or per modality name (None / left out: all)",
    )
    estimator: Literal["structured", "diagonal"] | None = Field(
        default=None,
        description="end-to-end estimator: structured (each candidate's real noise) or diagonal "
        "(measured per-channel noise power; cheapest)",
    )
    exhaustive: bool | None = None
    local_errors: Literal["replayed", "forward_loop"] | None = Field(
        default=None,
        description="where the local int8 errors of modules inside recorded roots are measured: "
        "replayed (from the attribution's own candidate outputs; no second pass over the "
        "forward loop for them) or forward_loop (pass 2 over the forward loop)",
    )
    fp16: bool | None = Field(default=None, description="the fp16/bf16 overflow probe")
    bf16: bool | None = Field(default=None, description="also re-run modules in bf16")
    smoothquant_alphas: list[Annotated[float, Field(ge=0.0, le=1.0)]] | None = Field(
        default=None, min_length=1, description="SmoothQuant strengths searched per module"
    )
    timestep_groups: int | None = Field(
        default=None, gt=0, le=16,
        description="groups of denoising steps with their own static scales (w8a8_timestep); "
        "left out: chosen per module from the measured per-step ranges",
    )  # fmt: skip
    schemes: list[str] | None = Field(
        default=None, min_length=1,
        description="the candidate int8 schemes to measure and choose from (left out: every "
        "scheme the target runs), e.g. to compare a search without w8a8_timestep",
    )  # fmt: skip
    data_limit: SampleLimit | None = Field(default=None, description="use only the first N samples")

    @field_validator("estimator_batch", "estimator_samples")
    @classmethod
    def _check_per_modality_count(
        cls, v: int | dict[str, int] | None, info: ValidationInfo
    ) -> int | dict[str, int] | None:
        values = v.values() if isinstance(v, dict) else [] if v is None else [v]
        if any(n <= 0 for n in values):
            raise ValueError(f"{info.field_name} must be positive")
        if isinstance(v, dict):
            known = {m.value for m in Modality}
            unknown = sorted(set(v) - known)
            if unknown:
                raise ValueError(f"unknown modality {unknown} (known: {sorted(known)})")
        return v


Search = Literal["first", "full"]
SEARCHES: tuple[str, ...] = get_args(Search)


class Recipe(StrictModel):
    """A calibration recipe."""

    name: str = Field(pattern=NAME_PATTERN, description="plain identifier; default out/<name>")
    model: ModelSection
    data: DataSection
    probe: ProbeSection = Field(default_factory=ProbeSection)
    budget: Budget = Field(default_factory=Budget)
    target: str = "cpu-reference"
    strategy: Strategy = Field(
        default="search", description="search the policy, or a reference baseline to compare with"
    )
    search: Search = Field(
        default="first",
        description=(
            "first: the naive full-coverage baselines are measured before any estimate and "
            "decide every modality they meet the budget in (the estimators run only for the "
            "others); full: the estimators run and the search decides every modality"
        ),
    )
    exports: list[str] = Field(default_factory=lambda: [e.name for e in exporters()])
    seed: Seed = 0

    @model_validator(mode="after")
    def _timesteps_need_a_sampling_loop(self) -> Recipe:
        family = find_family(self.model.family)
        if self.probe.timestep_groups is not None and family is not None and not family.steps:
            raise ValueError(
                f"probe.timestep_groups: {self.model.family} models have no denoising steps"
            )
        return self

    @model_validator(mode="after")
    def _metric_bounds(self) -> Recipe:
        # the metric table's check (its task's, once the run has read the suite)
        metric = self.budget.metric
        if metric is not None:
            problem = budget_problem(metric.bounds(), others=list(type(metric).model_fields))
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _metric_needs_the_search(self) -> Recipe:
        if self.budget.metric is not None and self.strategy != "search":
            raise ValueError(
                f"budget.metric: strategy {self.strategy} is not searched; leave the metric out "
                "to compare with this baseline"
            )
        return self

    @model_validator(mode="after")
    def _schemes_the_target_runs(self) -> Recipe:
        if self.probe.schemes is None:
            return self
        runs = get_target(self.target).schemes()
        unknown = [s for s in self.probe.schemes if s not in runs]
        if unknown:
            raise ValueError(
                f"probe.schemes: {self.target} cannot run {', '.join(unknown)} "
                f"(it runs {', '.join(runs)})"
            )
        return self

    @field_validator("target")
    @classmethod
    def _known_target(cls, v: str) -> str:
        try:
            get_target(v)  # the recipe is where a target's name enters (earlier names read too)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("exports")
    @classmethod
    def _known_exports(cls, v: list[str]) -> list[str]:
        known = [e.name for e in exporters()]  # the format table as it is (registered ones too)
        unknown = [f for f in v if f not in known]
        if unknown:
            raise ValueError(f"unknown export format(s) {unknown}; choose from {', '.join(known)}")
        return v

    def probe_settings(self) -> dict[str, Any]:
        """The recipe's probe section as :class:`ProbeConfig` fields (those it sets)."""
        fields = self.probe.model_dump(exclude={"data_limit"}, exclude_none=True)
        for name in ("smoothquant_alphas", "schemes"):
            if name in fields:
                fields[name] = tuple(fields[name])
        return fields

    def probe_config(self, seed: int | None = None, **overrides: Any) -> ProbeConfig:
        """The :class:`ProbeConfig` of this recipe (``seed`` defaults to the recipe's).

        Args:
            seed: the probe's seed.
            **overrides: ProbeConfig fields that win over the recipe (e.g. ``exhaustive=True``).
        """
        seed = self.seed if seed is None else seed
        return ProbeConfig(**{**self.probe_settings(), **overrides, "seed": seed})

    def settings_dict(self) -> dict[str, Any]:
        """The model settings as keyword arguments of :func:`opsnn_quant.models.load_adapter`."""
        return self.model.settings.model_dump()

    def with_strategy(self, strategy: str) -> Recipe:
        """A copy deciding its policy by ``strategy`` (``--strategy``): a naive baseline drops
        ``budget.metric``, which only the search measures (the old behaviour, to compare)."""
        budget = self.budget if strategy == "search" else self.budget.model_copy(
            update={"metric": None, "max_evaluations": None}
        )  # fmt: skip
        # a copy, not a re-validation: the CLI checked the name against STRATEGIES
        return self.model_copy(update={"strategy": strategy, "budget": budget})

    def with_max_memory(self, max_memory: int | None) -> Recipe:
        """A copy whose model may take ``max_memory`` bytes of host memory (``--max-memory``:
        the blocks beyond it offloaded); None keeps the recipe's ``model.max_memory``."""
        if max_memory is None:
            return self
        return self.model_copy(
            update={"model": self.model.model_copy(update={"max_memory": max_memory})}
        )

    def with_placement(self, device: str | None, dtype: str | None) -> Recipe:
        """A copy placed on ``device`` in ``dtype`` (None keeps the recipe's), validated.

        Raises:
            ConfigError: a device or dtype name the recipe schema refuses.
        """
        update = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
        if not update:
            return self
        try:
            model = type(self.model).model_validate({**self.model.model_dump(), **update})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(x) for x in err["loc"])
            raise ConfigError(f"--{field}: {err['msg']} (got {err['input']!r})") from exc
        return self.model_copy(update={"model": model})


def recipe_inputs(recipe: Recipe, model: Source) -> list[str]:
    """The local paths a recipe reads (the model's directory, resolved for a named source:
    ``model``, the recipe's model source resolved, and the data): an output may not replace
    them, contain them or lie inside them."""
    from opsnn_quant.sources import local_paths, resolve_source

    data = [resolve_source(s) for s in (recipe.data.calibration, recipe.data.holdout) if s]
    return [str(p) for s in (model, *data) for p in local_paths(s)]


def builtin_recipes() -> dict[str, Path]:
    """Name -> path of the built-in recipes."""
    return builtin_files("recipes")


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
    text = read_text(path)
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a YAML mapping")
    data.setdefault("name", path.stem)
    _resolve_paths(data, path, node)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(x) for x in err["loc"]]
        msg = err["msg"].removeprefix("Value error, ")
        if loc == ["model", "family"]:  # missing, not a string or not registered
            msg = family_choices()
        if err["type"] == "extra_forbidden" and loc:
            if loc[:2] == ["model", "settings"]:  # a family's few settings: all of them
                msg += keys_hint(loc[-1], settings_keys(data), f"{_family(data)} settings are")
            else:
                msg += did_you_mean(loc[-1], known_fields(Recipe, loc, data))
        if not loc and ": " in msg and msg.split(": ", 1)[0].count(".") >= 1:
            # a whole-recipe check names its field first ("probe.timestep_groups: ...")
            field, msg = msg.split(": ", 1)
            loc = field.split(".")
        line = _line_of(node, loc)
        where = f"line {line}: " if line else ""
        raise ConfigError(f"{path}: {where}{'.'.join(loc)}: {msg}") from exc


def _family(data: object) -> str:
    """The model family a raw recipe mapping names (for messages), else ``the model's``."""
    model = data.get("model") if isinstance(data, dict) else None
    family = model.get("family") if isinstance(model, dict) else None
    return str(family) if isinstance(family, str) else "the model's"


# The recipe fields that hold a local path (or a named source): resolved against the recipe's
# directory when relative, as a suite's paths are against the suite's.
PATH_FIELDS = (
    ("model", "source"),
    ("data", "calibration"),
    ("data", "holdout"),
    ("budget", "metric", "data"),
    ("budget", "metric", "suite"),
)


def is_suite_path(value: str) -> bool:
    """Whether a suite given by name or path (``budget.metric.suite``) is a path: a YAML file
    name or one with a directory; else a built-in suite's name."""
    return value.endswith((".yaml", ".yml")) or "/" in value


def _resolve_paths(data: dict[str, Any], path: Path, node: Any) -> None:
    """Make the relative paths of ``data`` (a recipe file's fields) relative to its directory,
    in place; one that does not exist there is an error naming that directory. A named source
    (``zoo:...``), an absolute path and a built-in suite name stay as they are."""
    from opsnn_quant.sources import is_named

    base = path.resolve().parent
    for keys in PATH_FIELDS:
        parent: Any = data
        for key in keys[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        value = parent.get(keys[-1]) if isinstance(parent, dict) else None
        if not isinstance(value, str) or not value or is_named(value) or Path(value).is_absolute():
            continue
        if keys[-1] == "suite" and not is_suite_path(value):
            continue  # a built-in suite's name
        resolved = base / value
        if not resolved.exists():
            line = _line_of(node, list(keys))
            where = f"line {line}: " if line else ""
            raise ConfigError(
                f"{path}: {where}{'.'.join(keys)}: {value} not found in {base} (a recipe's "
                "relative paths are relative to the recipe file)"
            )
        assert isinstance(parent, dict)
        parent[keys[-1]] = str(resolved)


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
