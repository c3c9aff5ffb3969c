"""Named model and data sources (``<scheme>:<name>``, e.g. ``zoo:shapes-t2i``), by plug-in.

A source string is a local path, or ``<scheme>:<name>`` resolved by the provider registered for
``scheme`` in the ``opsnn_quant.sources`` entry-point group (``pyproject.toml``). The library
never imports a provider by name: the demo zoo is one provider (``zoo``), a team's model store
can be another, installed beside it. A provider turns a model name into a local directory in its
library's standard layout (a diffusers pipeline, a transformers model), which the adapters load
as any other directory, and a data name into records.
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

from opsnn_quant.errors import ConfigError, ModelLoadError

GROUP = "opsnn_quant.sources"
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
    scheme, name = named
    provider = provider_for(scheme)
    if name not in provider.model_names():
        known = ", ".join(provider.model_names())
        raise ModelLoadError(f"unknown {scheme} model {name!r}; known: {known}")
    return provider.model_dir(name)


def named_family(source: str) -> str | None:
    """The model family of a named model source, when its provider says (an optional
    ``family(name)`` method: telling it needs no directory, which a provider may have to build);
    None for a path or a provider that does not say.

    Raises:
        ConfigError: an unknown scheme.
    """
    named = split_source(source)
    if named is None:
        return None
    scheme, name = named
    family = getattr(provider_for(scheme), "family", None)
    return family(name) if callable(family) else None


def named_records(source: str, limit: int | None) -> list[dict[str, Any]] | None:
    """The records of a named data source, or None when ``source`` is a path."""
    named = split_source(source)
    if named is None:
        return None
    scheme, name = named
    return provider_for(scheme).records(name, limit)


def local_paths(source: str) -> list[Path]:
    """The local paths a model or data source reads, for the rule that no output replaces an
    input: a path is itself; a named model is its provider's directory (resolved, as the
    adapters load it); a named data source is what its provider's optional
    ``data_paths(name)`` lists (none otherwise: the data is generated).

    Raises:
        ConfigError: an unknown scheme.
        ModelLoadError: the provider cannot prepare the named model.
    """
    named = split_source(source)
    if named is None:
        return [Path(source)]
    scheme, name = named
    provider = provider_for(scheme)
    if name in provider.model_names():
        return [provider.model_dir(name)]
    data_paths = getattr(provider, "data_paths", None)
    return [Path(p) for p in data_paths(name)] if callable(data_paths) else []
