"""Named model and data sources (``<scheme>:<name>``, e.g. ``zoo:shapes-t2i``), by plug-in.

A source string is a local path, or ``<scheme>:<name>`` resolved by the provider registered for
``scheme`` in the ``opsnn_quant.sources`` entry-point group (``pyproject.toml``). The library
never imports a provider by name: the demo zoo is one provider (``zoo``), a team's model store
can be another, installed beside it. A provider turns a model name into a local directory in its
library's standard layout (a diffusers pipeline, a transformers model), which the adapters load
as any other directory, and a data name into records.

A command resolves the model source it was given once (:func:`resolve_source`): the library
functions that check, fingerprint or place a model take that :class:`Source`, which carries its
split and prepares its directory once; a family's adapter, a plug-in, takes the text
(:func:`model_path`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

from opsnn_quant.errors import ConfigError, ModelLoadError

GROUP = "opsnn_quant.sources"
BUILTIN_SCHEME = "zoo"
"""The scheme of the models and data shipped with the package (its demo zoo's provider): what a
suite's bare dataset or CLIP name stands for (:func:`builtin_source`)."""
# A scheme is a short lowercase word; anything else with a colon (C:\...) is a path.
_SCHEME = re.compile(r"^([a-z][a-z0-9_-]*):(.+)$")


class SourceProvider(Protocol):
    """What a source plug-in provides."""

    def model_names(self) -> list[str]:
        """The model names it knows."""
        ...

    def model_dir(self, name: str) -> Path:
        """A local directory holding model ``name`` in its library's standard layout."""
        ...

    def records(self, name: str, limit: int | None) -> list[dict[str, Any]]:
        """The records of data source ``name`` (e.g. ``shapes/calibration``), first ``limit``."""
        ...

    # optional: ``family(name) -> str | None``, the model family of ``name`` (see
    # :func:`named_family`); without it the family is guessed from the model's directory


@functools.cache
def providers() -> dict[str, SourceProvider]:
    """Scheme -> provider, from the installed entry points (loaded once)."""
    out: dict[str, SourceProvider] = {}
    for ep in entry_points(group=GROUP):
        provider = ep.load()
        out[ep.name] = provider() if isinstance(provider, type) else provider
    return out


@dataclass(frozen=True)
class Source:
    """A model or data source resolved once (:func:`resolve_source`).

    Attributes:
        text: the source as given: what outputs record (``description.json``'s source model)
            and what a family's adapter loads.
        scheme, name: a named source's parts (``zoo``, ``shapes-t2i``); None for a path.
    """

    text: str
    scheme: str | None = None
    name: str | None = None

    @property
    def named(self) -> bool:
        """Whether it is a named source (``<scheme>:<name>``), not a path."""
        return self.scheme is not None

    @functools.cached_property
    def path(self) -> Path:
        """The local directory of the model: a path as given; a named model's from its
        provider (prepared on first use, once).

        Raises:
            ConfigError: an unknown scheme.
            ModelLoadError: the provider does not know the name.
        """
        if self.scheme is None or self.name is None:
            return Path(self.text)
        return _model_dir(self.scheme, self.name)

    def __str__(self) -> str:
        return self.text


def resolve_source(text: str) -> Source:
    """``text`` (a path, or ``<scheme>:<name>``) as a :class:`Source`: split once, here."""
    named = split_source(text)
    return Source(text) if named is None else Source(text, *named)


def builtin_source(name: str) -> str:
    """The named source of ``name`` among the package's own (``shapes-clip`` ->
    ``zoo:shapes-clip``); a ``<scheme>:<name>`` is already one."""
    return name if ":" in name else f"{BUILTIN_SCHEME}:{name}"


def split_source(source: str) -> tuple[str, str] | None:
    """``(scheme, name)`` of a named source, or None for a path."""
    m = _SCHEME.match(source)
    if m is None or Path(source).exists():
        return None
    return m.group(1), m.group(2)


def is_named(source: str) -> bool:
    """Whether ``source`` has the form of a named source (``<scheme>:<name>``), whatever exists
    on disk (a recipe's relative paths are resolved against its directory, not the CWD)."""
    return _SCHEME.match(source) is not None


def provider_for(scheme: str) -> SourceProvider:
    """The provider of ``scheme``.

    Raises:
        ConfigError: no installed provider has that scheme.
    """
    known = providers()
    if scheme not in known:
        names = (
            ", ".join(sorted(known)) or "none (is opsnn-quant installed, e.g. pip install -e .?)"
        )
        raise ConfigError(f"unknown source scheme {scheme!r}; installed: {names}")
    return known[scheme]


def model_path(source: str) -> Path:
    """The local directory of a model source (a path is returned as is).

    Raises:
        ConfigError: an unknown scheme.
        ModelLoadError: the provider does not know the name.
    """
    named = split_source(source)
    if named is None:
        return Path(source)
    return _model_dir(*named)


def _model_dir(scheme: str, name: str) -> Path:
    provider = provider_for(scheme)
    if name not in provider.model_names():
        known = ", ".join(provider.model_names())
        raise ModelLoadError(f"unknown {scheme} model {name!r}; known: {known}")
    return provider.model_dir(name)


def named_family(source: Source) -> str | None:
    """The model family of a named model source, when its provider says (an optional
    ``family(name)`` method: telling it needs no directory, which a provider may have to build);
    None for a path or a provider that does not say.

    Raises:
        ConfigError: an unknown scheme.
    """
    if source.scheme is None or source.name is None:
        return None
    family = getattr(provider_for(source.scheme), "family", None)
    return family(source.name) if callable(family) else None


def named_records(source: str, limit: int | None) -> list[dict[str, Any]] | None:
    """The records of a named data source, or None when ``source`` is a path."""
    named = split_source(source)
    if named is None:
        return None
    scheme, name = named
    return provider_for(scheme).records(name, limit)


def local_paths(source: Source) -> list[Path]:
    """The local paths a model or data source reads, for the rule that no output replaces an
    input: a path is itself; a named model is its provider's directory (resolved, as the
    adapters load it); a named data source is what its provider's optional
    ``data_paths(name)`` lists (none otherwise: the data is generated).

    Raises:
        ConfigError: an unknown scheme.
        ModelLoadError: the provider cannot prepare the named model.
    """
    if source.scheme is None or source.name is None:
        return [Path(source.text)]
    provider = provider_for(source.scheme)
    if source.name in provider.model_names():
        return [source.path]
    data_paths = getattr(provider, "data_paths", None)
    return [Path(p) for p in data_paths(source.name)] if callable(data_paths) else []
