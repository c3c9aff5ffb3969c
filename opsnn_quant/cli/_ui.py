"""Shared CLI pieces: progress displays, tables that fit the terminal, numbers for people."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table
from rich.text import Text

from opsnn_quant.core import progress

# Off a terminal rich would assume 80 columns anyway; tables are built to fit in 80.
WIDTH = 80
# The command line of the running command (set by ``main``): ``--nproc`` relaunches it per rank.
ARGV: list[str] = []
console = Console(stderr=False, width=None if sys.stdout.isatty() else WIDTH)


class LineReporter:
    """One line per phase on ``stream``, with the time since the command started (CI logs)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.t0 = time.perf_counter()
        self.count: tuple[int | None, int, str] | None = None

    def _flush_count(self) -> None:
        # a count says something only past one item (no bare "1/1 batches" lines)
        if self.count is not None and self.count[1] > 1:
            total, done, unit = self.count
            of = f"/{total}" if total else ""
            self.stream.write(
                f"           {done}{of} {unit}{'es' if unit.endswith('h') else 's'}\n"
            )
        self.count = None

    def phase(self, description: str) -> None:
        """Print ``[  12.3 s] description``."""
        self._flush_count()
        self.stream.write(f"[{time.perf_counter() - self.t0:7.1f} s] {description}\n")
        self.stream.flush()

    def start(self, total: int | None, unit: str) -> None:
        """Remember the count; it is printed when the phase ends."""
        self._flush_count()
        self.count = (total, 0, unit)

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more items."""
        if self.count is not None:
            total, done, unit = self.count
            self.count = (total, done + n, unit)

    def close(self) -> None:
        """Print the last phase's count."""
        self._flush_count()
        self.stream.flush()


class RichReporter:
    """A rich progress line per phase: spinner, bar, count and ETA of the counted work; each
    finished phase stays on screen as one line with its start and duration (as in the piped
    log)."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.task: TaskID | None = None
        self.t0 = self.started = time.perf_counter()
        self.description = ""

    def _finish(self) -> None:
        if self.task is None:
            return
        self.bar.stop_task(self.task)
        self.bar.update(self.task, visible=False)
        took = time.perf_counter() - self.started
        self.bar.console.print(
            f"[{self.started - self.t0:7.1f} s] {self.description} ({took:.1f} s)",
            highlight=False,
        )
        self.task = None

    def phase(self, description: str) -> None:
        """Finish the current line (kept on screen) and start a new one."""
        self._finish()
        self.description, self.started = description, time.perf_counter()
        self.task = self.bar.add_task(description, total=None)

    def start(self, total: int | None, unit: str) -> None:
        """Counted work in the current phase: the bar gets its total."""
        if self.task is None:
            self.phase("working")
        assert self.task is not None
        self.bar.reset(self.task, total=total)

    def advance(self, n: int = 1) -> None:
        """Move the bar."""
        if self.task is not None:
            self.bar.advance(self.task, n)

    def close(self) -> None:
        """Keep the last phase's line."""
        self._finish()


class CountColumn(MofNCompleteColumn):
    """``done/total``; a phase without counted work shows nothing (not ``0/?``), one with an
    unknown total just its count."""

    def render(self, task: Task) -> Text:
        """The cell of ``task``."""
        if task.total is None:
            return Text(str(int(task.completed)) if task.completed else "")
        return super().render(task)


def progress_bar(console: Console) -> Progress:
    """The live bar: the description shrinks (ellipsis) before the counters do, so 80 columns
    keep the count, elapsed time and ETA."""
    return Progress(
        SpinnerColumn(),
        TextColumn(
            "{task.description}",
            table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis", min_width=10),
        ),
        BarColumn(bar_width=12),
        CountColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        expand=True,
    )


@contextlib.contextmanager
def reporter(quiet: bool) -> Iterator[progress.Reporter]:
    """The progress display of a command, installed for the library to report to.

    Quiet: nothing. On a terminal: rich bars (transient). Otherwise: one line per phase on
    stderr with the elapsed time, so CI logs show where a long run is.
    """
    if quiet:
        with progress.reporting(progress.current()) as rep:
            yield rep
        return
    if not sys.stderr.isatty():
        lines = LineReporter(sys.stderr)
        try:
            with progress.reporting(lines) as rep:
                yield rep
        finally:
            lines.close()
        return
    bar = progress_bar(Console(stderr=True))
    rich = RichReporter(bar)
    with bar, progress.reporting(rich) as rep:
        try:
            yield rep
        finally:
            rich.close()


@contextlib.contextmanager
def phases(quiet: bool) -> Iterator[Callable[[str], None]]:
    """:func:`reporter`'s phase callback (for commands that only announce phases)."""
    with reporter(quiet) as rep:
        yield rep.phase


def one_line(text: str) -> str:
    """``text`` on one line: every character that is not printable (newlines, carriage
    returns, tabs, terminal escapes, Unicode line separators) written as its Python escape
    (``\\n``, ``\\x1b``, ``\\u2028``), as a path holding one would be in ``repr``."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def table(
    title: str,
    columns: list[tuple[str, str]],
    caption: str | None = None,
    first_width: int | None = None,
) -> Table:
    """A table that fits :data:`WIDTH` columns.

    Args:
        title: the title line.
        columns: ``(header, justify)`` pairs.
        caption: a legend under the table.
        first_width: a fixed width of the first column (module names pre-broken at dots with
            :func:`wrap_name` to this width are never cut mid-part).
    """
    t = Table(title=title, caption=caption, caption_justify="left", expand=False)
    for i, (header, justify) in enumerate(columns):
        if i == 0:
            t.add_column(header, overflow="fold", width=first_width)
        else:
            t.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return t


NAME_WIDTH = 30  # the module column of 80-column tables


def wrap_name(name: str, width: int = NAME_WIDTH) -> str:
    """A dotted module name broken at dots into lines of at most ``width`` (never mid-part)."""
    if len(name) <= width:
        return name
    lines, line = [], ""
    for part in name.split("."):
        piece = part if not line else f".{part}"
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = part if not lines else f".{part}"
        else:
            line += piece
    lines.append(line)
    return "\n".join(lines)


def print_table(t: Any) -> None:
    """Print a table on stdout."""
    console.print(t)


NPROC_HELP = (
    "processes on this host, one per device (launches torchrun's elastic agent; across hosts run "
    "torchrun -m opsnn_quant {command})"
)
DIST_BACKEND_HELP = "hccl | nccl | gloo [default: hccl on npu, nccl on cuda, gloo]"


CLI_ENTRY = "opsnn_quant.cli:main"
"""The command line's entry point (the ``opsnn-quant`` console script): what each rank that
``--nproc`` starts runs again, with the same arguments but ``--nproc``."""


def relaunch(nproc: int) -> int:
    """This command line again in ``nproc`` processes on this host (``--nproc N``: torchrun's
    elastic agent, :func:`~opsnn_quant.distributed.launch_local`); returns the run's exit
    code."""
    from opsnn_quant import distributed as dist

    return dist.launch_local(nproc, CLI_ENTRY, without_nproc(ARGV))


def without_nproc(argv: list[str]) -> list[str]:
    """``argv`` without its ``--nproc N`` / ``--nproc=N`` (each rank runs the rest)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


FORCE_HELP = (
    "replace OUT also when it is an opsnn-quant output of another command or one changed since "
    "(never what opsnn-quant did not write: a directory without its marker, a file, a home or "
    "root directory, a mount point, a directory holding .git)"
)
ALLOW_PICKLE_HELP = (
    "read model weights that exist as pickles only (*.bin, *.pt, *.pth, *.ckpt), with "
    "torch.load(weights_only=True), never a full unpickle; without it such a model is refused "
    "(convert it to safetensors)"
)
