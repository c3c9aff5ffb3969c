"""Progress of long work, reported to whoever listens (the CLI), silent by default.

The library announces phases (:func:`phase`) and counts work inside them (:func:`iterate`, e.g.
the calibration batches of a forward loop). The CLI installs a :class:`Reporter` for the length
of a command with :func:`reporting`: rich progress bars on a terminal, one line per phase with
the elapsed time otherwise, nothing when quiet. Library users see nothing unless they install one.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Sized
from typing import Protocol, TypeVar

_T = TypeVar("_T")


class Reporter(Protocol):
    """What a progress display does with the library's announcements."""

    def phase(self, description: str) -> None:
        """A new phase of work starts (the previous one ends)."""
        ...

    def start(self, total: int | None, unit: str) -> None:
        """Counted work starts inside the current phase (``total`` items, if known)."""
        ...

    def advance(self, n: int = 1) -> None:
        """``n`` more items of the counted work are done."""
        ...


class _Silent:
    def phase(self, description: str) -> None:
        pass

    def start(self, total: int | None, unit: str) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


_SILENT = _Silent()
_CURRENT: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar(
    "opsnn_quant_progress", default=None
)


def current() -> Reporter:
    """The reporter installed for this context (a silent one by default)."""
    return _CURRENT.get() or _SILENT


@contextlib.contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    """Install ``reporter`` for the block."""
    token = _CURRENT.set(reporter)
    try:
        yield reporter
    finally:
        _CURRENT.reset(token)


def phase(description: str) -> None:
    """Announce a phase to the installed reporter."""
    current().phase(description)


def iterate(items: Iterable[_T], unit: str = "batch") -> Iterator[_T]:
    """Yield ``items``, counting each one on the installed reporter."""
    reporter = current()
    reporter.start(len(items) if isinstance(items, Sized) else None, unit)
    for item in items:
        yield item
        reporter.advance()
