"""What every user-written configuration shares: recipes, suites, model settings, CLI counts.

One place for the checks that recipes (:mod:`opsnn_quant.pipeline.recipe`), suites
(:mod:`opsnn_quant.evaluation.suite`) and the CLI options that override them apply alike, so
that a value refused in a YAML file is refused with the same words on the command line:

* :class:`StrictModel`: no unknown key, frozen, and no NaN or infinity in a number (``.nan``
  and ``.inf`` are valid YAML floats; no threshold, limit or scale of ours means anything
  with them, and a NaN compares false with everything, so a NaN floor would pass every check).
* :data:`Seed` / :func:`check_seed`: 0..2**32-1, what ``numpy.random.seed`` accepts (torch
  takes more, numpy is the narrower one and both are seeded from the same value).
* :data:`SampleLimit` / :func:`check_limit`: how many samples a run may use.
* :func:`yaml_error`: a YAML syntax error as one ``file:line: message`` line.

Kept free of torch: configs validate before any model library loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict

from opsnn_quant.errors import ConfigError

SEED_MAX = 2**32 - 1
# More samples than any calibration or evaluation run uses by orders of magnitude, and few
# enough that a generated zoo split or a list of records of that length still fits in memory:
# a larger number is a typo (the issue: 10**11 asked numpy for 279 TiB).
MAX_SAMPLES = 1_000_000


class StrictModel(BaseModel):
    """Base of the user-written config schemas: unknown keys, NaN and infinities refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def seed_problem(value: int) -> str | None:
    """Why ``value`` is not a seed, or None if it is one."""
    if 0 <= value <= SEED_MAX:
        return None
    return f"must be between 0 and {SEED_MAX} (2**32-1, the seeds numpy accepts), got {value}"


def limit_problem(value: int) -> str | None:
    """Why ``value`` is not a sample count, or None if it is one."""
    if 1 <= value <= MAX_SAMPLES:
        return None
    return f"must be between 1 and {MAX_SAMPLES} samples, got {value}"


def _seed(value: int) -> int:
    problem = seed_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _limit(value: int) -> int:
    problem = limit_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Seed = Annotated[int, AfterValidator(_seed)]
SampleLimit = Annotated[int, AfterValidator(_limit)]


def check_seed(value: int | None, option: str = "--seed") -> int | None:
    """``value`` (None passes) if it is a seed: the CLI's form of :data:`Seed`.

    Raises:
        ConfigError: out of 0..2**32-1; the message names ``option``.
    """
    problem = None if value is None else seed_problem(value)
    if problem:
        raise ConfigError(f"{option} {problem}")
    return value


def check_limit(value: int | None, option: str = "--limit") -> int | None:
    """``value`` (None passes) if it is a sample count: the CLI's form of :data:`SampleLimit`.

    Raises:
        ConfigError: out of 1..:data:`MAX_SAMPLES`; the message names ``option``.
    """
    problem = None if value is None else limit_problem(value)
    if problem:
        raise ConfigError(f"{option} {problem}")
    return value


def yaml_error(path: Path | str, exc: yaml.YAMLError) -> ConfigError:
    """``exc`` as one line, ``<path>:<line>: not valid YAML: <problem> (<context>)``.

    PyYAML's own text spans several lines (each mark with the offending source line and a caret)
    and names the stream ``<unicode string>``, not the file.
    """
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}")
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None:
        problem += f" ({context} at line {context_mark.line + 1})"
    elif context:
        problem += f" ({context})"
    return ConfigError(f"{path}:{mark.line + 1}: not valid YAML: {problem}")


def known_fields(root: type[BaseModel], loc: list[str], data: object) -> list[str]:
    """The field names a config allows at ``loc``'s parent (``loc`` as a pydantic error gives
    it, ``data`` the raw mapping it was validated from; a tagged union takes the member the
    data names); empty where the parent is no model (a mapping of free keys)."""
    cls: object = root
    node = data
    for key in loc[:-1]:
        if (
            not (isinstance(cls, type) and issubclass(cls, BaseModel))
            or key not in cls.model_fields
        ):
            return []
        node = node.get(key) if isinstance(node, dict) else None
        cls = _member(cls.model_fields[key].annotation, node)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(cls.model_fields)
    return []


def _member(annotation: object, node: object) -> object:
    """The model class of a field's annotation: ``X | None`` -> ``X``; a union of models -> the
    one whose required literal fields (its tag) match ``node``'s values."""
    import typing

    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if not args:
        return annotation
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    for m in models:
        tags = {
            name: typing.get_args(f.annotation)
            for name, f in m.model_fields.items()
            if typing.get_origin(f.annotation) is typing.Literal and f.is_required()
        }
        if tags and isinstance(node, dict) and all(node.get(k) in v for k, v in tags.items()):
            return m
    return models[0] if len(models) == 1 else None


def did_you_mean(name: str, known: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` to ``name``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def keys_hint(name: str, known: list[str], what: str = "the keys") -> str:
    """``did_you_mean`` and then every key ``known`` (a family's settings are few: a user who
    typed one that does not exist sees them all), or ``""`` without known keys."""
    if not known:
        return ""
    return f"{did_you_mean(name, known)}; {what}: {', '.join(known)}"
