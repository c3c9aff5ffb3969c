"""The table of model families: one :class:`Family` per kind of model, looked up by name.

A family is everything opsnn-quant knows about a kind of model, in one registration: the adapter
that loads and runs it, its settings (a pydantic model: what a recipe's ``model.settings`` and
``--set`` take), how to tell a directory of it (``--family`` left out), how its weight files
are checked before anything loads, what its records are, the target its models usually deploy
to, whether its forward loop has sampling steps, the shipped recipe and suite to start from, and
the host-memory floor of one call where it can be estimated. Loading, detection, settings
validation, record and weight checks, recipes and the command line all read the entry; nothing
tests a family by name.

The built-in families (:mod:`opsnn_quant.models.families`) register with
:func:`register_family` when :mod:`opsnn_quant.models` is imported; a team's own family
registers the same way, from Python or from an installed package's ``opsnn_quant.families``
entry point (its value: a :class:`Family`), as source providers do (:mod:`opsnn_quant.sources`).

A team's family, e.g.::

    class MySettings(FamilySettings):
        batch_size: int = Field(default=4, gt=0)

    register_family(Family(
        name="my-family", adapter=MyAdapter,  # MyAdapter.load(source, settings, dtype, ...)
        settings=MySettings, detect=lambda path: (path / "my_config.yaml").is_file(),
    ))

after which ``calibrate --model DIR --data SRC`` finds it in ``DIR`` (or ``--family my-family``),
``--set batch_size=8`` is validated by ``MySettings`` and a recipe names it as a built-in.

Kept free of torch and of the adapters' libraries: an adapter is imported when a model loads.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from opsnn_quant.errors import ConfigError, InputError

if TYPE_CHECKING:
    from opsnn_quant.models.base import ModelAdapter

GROUP = "opsnn_quant.families"
NAME = re.compile(r"^[a-z][a-z0-9_-]*$")  # a family's name, as a recipe and --family spell it


class FamilySettings(BaseModel):
    """The base of every family's settings model: strict (an unknown key or a wrong type is an
    error that names the field, never a silently ignored key), frozen, finite numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    def check_fits(self, model_dir: Path, where: str) -> None:
        """Refuse settings the model in ``model_dir`` cannot run, from its config files alone
        (a value beyond a limit a file states), before it loads; ``where`` goes before a
        setting's name in the message (``model.settings.``, ``--set ``). The base states no
        limit.

        Raises:
            ConfigError: a setting beyond the model's limit, named with the limit and its file.
        """


class AdapterClass(Protocol):
    """What a family's adapter class provides: a constructor from a model source."""

    def load(
        self,
        source: str,
        settings: Any,
        dtype: Any,
        *,
        allow_pickle: bool = False,
        skeletons: list[Any] | None = None,
    ) -> ModelAdapter:
        """The model at ``source`` (a directory, or a named source), loaded in ``dtype`` (a
        ``torch.dtype``) and run with ``settings`` (the family's validated settings).
        ``allow_pickle``: pickle weights may be read (``torch.load(weights_only=True)``);
        ``skeletons``: a list to which a streamed model appends its sources (``--max-memory``,
        :mod:`opsnn_quant.models.streamed`); an adapter that cannot stream leaves it empty."""
        ...


@dataclass(frozen=True)
class Family:
    """One model family: what every command needs to know about its models.

    Attributes:
        name: the family's name (a recipe's ``model.family``, ``--family``).
        adapter: the adapter class (see :class:`AdapterClass`), or ``"module:Class"``, imported
            when a model of the family loads (so that validating a recipe imports no model
            library).
        settings: the pydantic model of its settings (a subclass of :class:`FamilySettings`,
            its own: no two families share one); its ``check_fits`` checks them against a
            model's config files.
        detect: whether a local directory holds a model of this family (read its config files
            only; raise :class:`~opsnn_quant.errors.ModelLoadError` for a file that claims the
            family but is broken). The first registered family that says yes is the guess.
        layout: the file that marks a directory laid out as this family's (``model_index.json``
            for a diffusers pipeline): ``check_weights`` applies to any such directory, the
            family given by ``--family`` or not. None: no weight check before the load.
        check_weights: ``(source, directory, allow_pickle)``: refuse the directory's weight
            files before any work (pickles only and not ``allow_pickle``); the loader checks
            again.
        takes: what its model takes from a record, in words (``prompts``, ``16 kHz audio``).
        check_records: refuse records its model cannot take, before it loads
            (:class:`~opsnn_quant.errors.CalibrationError`); None: any record passes.
        target: the target its models usually deploy to (a command without a recipe).
        steps: its forward loop runs sampling steps (per-step scales, ``timestep_groups``).
        recipe: the shipped recipe a model of this family starts from (a template to copy).
        suite: the shipped acceptance suite that judges it (a template to copy).
        probe: the probe settings a command without a recipe starts from (a recipe's
            ``probe`` fields): what the family's shipped recipes set for memory.
        footprint: ``(directory, settings, records, where, max_memory, offload)``: refuse a call
            of the model that would not fit in host memory, before it loads (see
            :func:`~opsnn_quant.models.footprint.check_source_memory`); None: not estimated.
    """

    name: str
    adapter: str | AdapterClass
    settings: type[FamilySettings]
    detect: Callable[[Path], bool]
    layout: str | None = None
    check_weights: Callable[[str, Path, bool], object] | None = None
    takes: str = "records"
    check_records: Callable[[Sequence[Any]], object] | None = None
    target: str = "cpu-reference"
    steps: bool = False
    recipe: str | None = None
    suite: str | None = None
    footprint: Callable[..., None] | None = None
    probe: Mapping[str, Any] = field(default_factory=dict)

    def adapter_class(self) -> AdapterClass:
        """The adapter class, imported on first use when given as ``"module:Class"``."""
        if not isinstance(self.adapter, str):
            return self.adapter
        module, _, attr = self.adapter.partition(":")
        cls: AdapterClass = getattr(importlib.import_module(module), attr)
        return cls

    def validate(self, values: dict[str, Any] | FamilySettings) -> FamilySettings:
        """``values`` as this family's settings (an instance of them as it is).

        Raises:
            pydantic.ValidationError: an unknown key or a bad value.
        """
        if isinstance(values, self.settings):
            return values
        return self.settings.model_validate(values)


TABLE: dict[str, Family] = {}
"""Name -> family, in registration order (the order messages list them in)."""


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` to the table (``replace``: over a family of the same name).

    Raises:
        ConfigError: the name is taken or no plain name, its settings model is no
            :class:`FamilySettings`, or another family has the same settings model.
    """
    if not NAME.match(family.name):
        raise ConfigError(f"model family name {family.name!r}: lower-case letters, digits, - or _")
    if not (isinstance(family.settings, type) and issubclass(family.settings, FamilySettings)):
        raise ConfigError(
            f"model family {family.name!r}: its settings model must subclass FamilySettings"
        )
    if family.name in TABLE and not replace:
        raise ConfigError(f"model family {family.name!r} is registered already")
    for other in TABLE.values():
        if other.settings is family.settings and other.name != family.name:
            raise ConfigError(
                f"model family {family.name!r}: its settings model {family.settings.__name__} "
                f"is {other.name}'s; give each family its own"
            )
    TABLE[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove family ``name`` from the table (nothing when it is not there)."""
    TABLE.pop(name, None)


@functools.cache
def _load_plugins() -> None:
    """Register the families of the installed ``opsnn_quant.families`` entry points (once)."""
    for ep in entry_points(group=GROUP):
        family = ep.load()
        if family.name not in TABLE:
            register_family(family)


def families() -> list[Family]:
    """Every registered family, in registration order (built-ins, then plug-ins)."""
    _load_plugins()
    return list(TABLE.values())


def family_names() -> list[str]:
    """The names of the registered families, in registration order."""
    return [f.name for f in families()]


def find_family(name: str) -> Family | None:
    """The family ``name``, or None."""
    _load_plugins()
    return TABLE.get(name)


def get_family(name: str, error: type[InputError] = ConfigError) -> Family:
    """The family ``name``.

    Raises:
        ``error``: no such family (the message lists them).
    """
    family = find_family(name)
    if family is None:
        raise error(f"unknown model family {name!r}; known: {', '.join(family_names())}")
    return family


def family_of(settings: FamilySettings) -> Family | None:
    """The family whose settings model ``settings`` is an instance of (exactly), or None."""
    return next((f for f in families() if type(settings) is f.settings), None)


def detect_family(path: Path) -> Family | None:
    """The first family whose ``detect`` says the directory ``path`` holds one of its models."""
    return next((f for f in families() if f.detect(path)), None)


def layout_family(path: Path) -> Family | None:
    """The first family with a weight check whose layout file is in the directory ``path``."""
    return next(
        (f for f in families() if f.layout and f.check_weights and (path / f.layout).is_file()),
        None,
    )
