"""Files a user's folder names must be regular files inside that folder.

A data folder's ``metadata.jsonl`` names its audio files, a model directory holds the helper
files an export copies byte for byte: a name such as ``../../etc/passwd``, an absolute path, or
a symbolic link leading out of the folder would read (and, for an export, publish) a file the
user never meant to hand over; a FIFO or a device named there blocks forever or never ends.
:func:`escape` says what is wrong with such a file;
:func:`~opsnn_quant.models.loader_files.check_model_sources` checks every file the loaders read
(and an export copies) from a model directory before any work starts.

One exception: a Hugging Face hub cache snapshot (``<cache>/models--<org>--<name>/snapshots/
<revision>``, also ``datasets--``) keeps its files as links into the repository's own
``blobs/`` directory; a link resolving there counts as inside.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from opsnn_quant.output.ownership import LEDGER, MARKER

OURS = (MARKER, LEDGER)  # our bookkeeping in a model directory is not the model's


DIRECTORY = "is a directory, not a regular file"
""":func:`escape`'s reason for a folder inside (its files are looked at one by one)."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _roots(root: Path) -> list[Path]:
    """``root`` resolved, and the ``blobs/`` of the hub cache repository it is a snapshot of."""
    real = root.resolve()
    out = [real]
    for up in (real, *real.parents):
        repo = up.parent.parent
        if up.parent.name == "snapshots" and repo.name.startswith(("models--", "datasets--")):
            out.append(repo / "blobs")
            break
    return out


def _within(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def escape(path: Path, root: Path) -> str | None:
    """What keeps ``path`` from being read as a file of folder ``root`` (None: it may be read):
    it resolves (links followed) outside ``root``, or it is no regular file. A path that does
    not exist is left to its reader (None).

    Returns:
        The reason, a phrase such as ``"resolves to /etc/passwd, outside /data/speech"``.
    """
    try:
        target = Path(os.path.realpath(path))
    except OSError as exc:  # a link into a directory we may not read (/proc/1/cwd)
        return f"cannot be read: {exc.strerror or exc}"
    if not any(_within(target, base) for base in _roots(root)):
        return f"resolves to {target}, outside {root}"
    if os.path.islink(path) and not os.path.lexists(target):
        return "is a link to a missing file"
    return not_regular(target)


def not_regular(path: Path) -> str | None:
    """Why ``path`` is no regular file (``"is a named pipe (FIFO), not a regular file"``), or
    None: a regular file, or nothing there (its reader says so). Nothing is opened: a FIFO is
    only looked at, never waited on."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop"
        return f"cannot be read: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return f"is {_kind(mode)}, not a regular file"
    return None
