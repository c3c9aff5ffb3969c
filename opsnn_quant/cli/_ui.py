"""Shared CLI pieces: progress display (quiet when asked or not a terminal), tables."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

# Tables keep their columns when piped (rich would wrap to 80 columns off a terminal).
console = Console(stderr=False, width=None if sys.stdout.isatty() else 120)


@contextlib.contextmanager
def phases(quiet: bool) -> Iterator[Callable[[str], None]]:
    """A callback that shows the current phase on a rich progress line (silent when quiet/no TTY)."""
    if quiet or not sys.stderr.isatty():
        yield lambda msg: None
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=None)
        yield lambda msg: progress.update(task, description=msg)
