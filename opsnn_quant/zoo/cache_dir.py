"""A cache directory built once, atomically: filled in a temporary sibling, renamed into place.

The zoo's generated artefacts (the converted Whisper model, the speech eval-large set) are built
into ``~/.cache/opsnn-quant`` on first use. The filler writes the file that makes the directory
trusted (a stamp, a manifest) last, so an interrupted build leaves no trusted directory; a
directory another process finished meanwhile is kept when it is valid.

Everything read back from the cache is read as the cache's own: each file must be a regular file
inside the cache (:func:`check_entry`, :func:`open_cached`). Our builder writes nothing else, so
a FIFO, a device, a link loop or a link out of the cache was put there by someone else: it is
refused in one line (:class:`~opsnn_quant.errors.CacheError`) and never opened, never deleted
(it may be someone's; removing it is the user's call). A regular file whose bytes no longer
match the hash its entry recorded is the cache's to replace: the entry is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from io import BufferedReader
from pathlib import Path

from opsnn_quant.errors import CacheError
from opsnn_quant.models.confine import DIRECTORY, escape, not_regular

# (device, inode, size, mtime_ns, ctime_ns) of a file hashed in this process -> its SHA-256. The
# ctime cannot be set by a user (any write or rename sets it to now): a file rewritten since,
# even to the same size with its mtime put back (touch -r), has another key and is read again.
# A file changed less than RACY_NS before it was hashed is not remembered: a filesystem keeps
# times to a tick (1 s on some), so a rewrite within that tick could keep the same ctime.
_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}
RACY_NS = 2_000_000_000


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
        if os.path.lexists(final):  # a dangling link too: os.replace cannot replace it
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


def cache_refusal(path: Path, why: str, root: Path) -> str:
    """The one-line refusal of something in the cache that is not the cache's own."""
    return (
        f"cache file {path} {why}; opsnn-quant keeps only directories and regular files in its "
        f"cache {root}: remove it and run again (the entry is rebuilt)"
    )


def check_entry(final: Path, root: Path) -> None:
    """Refuse cache entry ``final`` (a directory of cache ``root``) when it, or anything in it,
    is no directory or regular file inside ``root``: a FIFO, a device, a socket, a link loop,
    a link out of the cache. Nothing is opened. A missing entry passes (it is built).

    Raises:
        CacheError: such a file, named with what it is.
    """
    if not os.path.lexists(final):
        return
    why = escape(final, root)
    if why is None:
        return  # a regular file where the entry should be: stale, the build replaces it
    if why != DIRECTORY:
        raise CacheError(cache_refusal(final, why, root))
    for top, dirs, files in os.walk(final):  # links are listed, never followed
        for name in (*dirs, *files):
            why = escape(Path(top) / name, root)
            if why is not None and why != DIRECTORY:
                raise CacheError(cache_refusal(Path(top) / name, why, root))


def open_cached(path: Path, root: Path | None = None) -> BufferedReader:
    """Open ``path`` for reading only if it is a regular file (inside cache ``root`` when given).

    The file is opened without blocking and checked on the open descriptor, so a FIFO put there
    (even after a check) is refused at once, never waited on, and ``/dev/zero`` never read.

    Raises:
        CacheError: not a regular file, or it leads out of ``root``.
        FileNotFoundError: nothing there (the entry is built).
    """
    if root is not None:
        why = escape(path, root)
        if why is not None:
            raise CacheError(cache_refusal(path, why, root))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        why = not_regular(path) or "is not a regular file"
        raise CacheError(cache_refusal(path, why, root or path.parent))
    return os.fdopen(fd, "rb")


def read_cached(path: Path, root: Path, limit: int = 1 << 20) -> bytes:
    """The bytes of a small cache file (a stamp, a manifest): at most ``limit`` of them, so a
    huge one is not read whole (its caller finds it does not parse).

    Raises:
        CacheError, FileNotFoundError: as :func:`open_cached`.
    """
    with open_cached(path, root) as handle:
        return handle.read(limit)


def file_sha256(path: Path, root: Path | None = None) -> str:
    """The SHA-256 of a regular file (inside cache ``root`` when given), read in blocks: what
    the cache's stamps and manifests record. A file hashed before in this process and not
    written since (same inode, size, mtime and ctime, changed more than 2 s before it was
    hashed) is not read again.

    Raises:
        CacheError: not a regular file (a FIFO, a device) or it leads out of ``root``.
        OSError: it cannot be read.
    """
    with open_cached(path, root) as handle:
        st = os.fstat(handle.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key in _DIGESTS:
            return _DIGESTS[key]
        started = time.time_ns()
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
        if st.st_ctime_ns < started - RACY_NS:
            _DIGESTS[key] = digest
        return digest
