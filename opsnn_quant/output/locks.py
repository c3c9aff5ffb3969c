"""The lock every writer of an output holds, and those of the outputs it lies in: a second
writer is refused, never kept waiting."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from opsnn_quant.errors import OutputError
from opsnn_quant.output.ownership import MARKER, enclosing_outputs, is_live

# The output directories this thread holds locked: (device, inode) -> how many holders. A
# writer nested in another one of the same run (export-weights' exports inside OUT, calibrate's
# quant/ inside its output) takes the same lock again: flock would refuse a second open file of
# the same process, so the lock is taken once and counted. Another thread is another writer.
_HELD = threading.local()


def _held() -> dict[tuple[int, int], int]:
    held: dict[tuple[int, int], int] | None = getattr(_HELD, "locks", None)
    if held is None:
        held = _HELD.locks = {}
    return held


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold, while the block runs, the lock every command writing into the output ``path``
    takes (a ``calibrate`` replacing it, an ``export-weights`` redoing its exports, an
    ``evaluate`` writing its report), and the lock of every output ``path`` lies in, outermost
    first: ``evaluate -o OUT/report`` and ``calibrate -o OUT`` exclude each other. The second
    writer is refused, never kept waiting. Nothing is held for ``path`` itself where it is not an
    existing directory (a loose file, or nothing to mix into yet; the swap checks it again). A
    thread already holding one of the locks holds it again (nested writers of one run).

    Raises:
        OutputError: another opsnn-quant run holds one of the locks.
    """
    target = Path(path)
    with contextlib.ExitStack() as stack:
        for outer, _ in reversed(list(enclosing_outputs(target))):
            stack.enter_context(_dir_lock(outer, target))
        stack.enter_context(_dir_lock(target, target))
        yield


@contextlib.contextmanager
def _dir_lock(directory: Path, target: Path) -> Iterator[None]:
    """An exclusive flock on the directory itself (not a file in it: the output is replaced
    whole), for ``target``'s writer (named in the refusal)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the temporary directory's lock still holds
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # absent, a file or a link: refused or replaced by the checks, not locked
        yield
        return
    try:
        held = os.fstat(fd)
        key = (held.st_dev, held.st_ino)
        locks = _held()
        if key not in locks:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(target, directory) from None
            now = os.stat(directory, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != key:
                raise _busy(target, directory)  # swapped for another directory meanwhile
        locks[key] = locks.get(key, 0) + 1
        try:
            yield
        finally:
            locks[key] -= 1
            if not locks[key]:
                del locks[key]
    finally:
        os.close(fd)  # the first holder's close releases the lock


def _locked_by_another(directory: Path) -> bool:
    """Whether another writer (another process or thread) holds ``directory``'s output lock or
    its marker's (a run building it)."""
    if is_live(directory):
        return True
    try:
        import fcntl

        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (ImportError, OSError):
        return False
    try:
        held = os.fstat(fd)
        if (held.st_dev, held.st_ino) in _held():
            return False  # this writer's own
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def live_nested(directory: Path) -> str | None:
    """The first output inside ``directory`` (relative path) that another run is writing."""
    for root, dirs, _ in os.walk(directory):
        dirs.sort()
        for name in dirs:
            inner = Path(root) / name
            if not inner.is_symlink() and (inner / MARKER).is_file() and _locked_by_another(inner):
                return inner.relative_to(directory).as_posix()
    return None


def _busy(target: Path, locked: Path | None = None) -> OutputError:
    if locked is not None and locked.absolute() != target.absolute():
        return OutputError(
            f"output {target} lies in the output {locked}, which another opsnn-quant run is "
            "writing; wait for it to finish or choose another output"
        )
    return OutputError(
        f"output {target} is being written by another opsnn-quant run; wait for it to finish "
        "or choose another output"
    )
