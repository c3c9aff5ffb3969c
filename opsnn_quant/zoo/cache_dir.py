"""A cache directory built once, atomically: filled in a temporary sibling, renamed into place.

The zoo's generated artefacts (the converted Whisper model, the speech eval-large set) are built
into ``~/.cache/opsnn-quant`` on first use. The filler writes the file that makes the directory
trusted (a stamp, a manifest) last, so an interrupted build leaves no trusted directory; a
directory another process finished meanwhile is kept when it is valid.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_cache_dir(
    final: Path,
    fill: Callable[[Path], None],
    valid: Callable[[], bool],
    unwritable: Callable[[OSError], Exception],
) -> Path:
    """Build ``final`` with ``fill(tmp)`` in a temporary sibling and rename it into place.

    Args:
        final: The cache directory (its parent is created).
        fill: Writes the directory's contents into the path it is given, its trust marker last.
        valid: Whether ``final`` now holds a valid directory (another process's, finished while
            this one was filling): it is then kept, and this one's dropped.
        unwritable: The exception to raise when the cache's parent cannot be written.

    Returns:
        ``final``.

    Raises:
        The exception ``unwritable`` makes; whatever ``fill`` raises (nothing is left behind).
    """
    root = final.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
    except OSError as err:
        raise unwritable(err) from err
    try:
        fill(tmp)
        if valid():
            return final  # another process finished the same directory meanwhile
        if final.exists():
            # rename() cannot replace a non-empty directory: move the stale one aside first.
            stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=root))
            os.replace(final, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process renamed its directory into place first; keep it if it is valid.
            if not valid():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in blocks (what the cache's stamps and manifests record)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
