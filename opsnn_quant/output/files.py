"""Single files written atomically (a temporary sibling renamed into place), the directory a
format writes into, and the record of a write in the outputs around it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path

from opsnn_quant.errors import OutputError
from opsnn_quant.output.ownership import MARKER, Marker, enclosing_outputs, is_live, manifest_of

# errno values that mean "this output location cannot be written" (a user's problem, exit 2).
WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.ENOTDIR}


def _umask() -> int:
    # os.umask can only be read by setting it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _follow_umask(path: Path, mode: int) -> None:
    # mkstemp/mkdtemp create private (0600/0700) entries; outputs are ordinary files.
    path.chmod(mode & ~_umask())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temporary sibling of ``path`` and rename it into place.

    Raises:
        OutputError: ``path`` is a directory, or its location cannot be written.
    """
    target = Path(path)
    if target.is_dir():
        raise OutputError(f"{target} is a directory; give a file path")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    except OSError as exc:
        raise write_error(target, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _follow_umask(Path(tmp), 0o666)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json_atomic(
    path: str | os.PathLike[str], doc: object, *, indent: int | None = 1, sort_keys: bool = True
) -> Path:
    """Write ``doc`` as JSON through :func:`atomic_write_text`; returns the path.

    Raises:
        OutputError: as :func:`atomic_write_bytes`.
    """
    return atomic_write_text(path, json.dumps(doc, indent=indent, sort_keys=sort_keys))


def write_error(path: Path, exc: OSError) -> OutputError:
    """A one-line :class:`OutputError` for an OSError raised while writing ``path``."""
    reason = exc.strerror or str(exc)
    return OutputError(f"cannot write {path}: {reason}")


def empty_dir(path: str | os.PathLike[str]) -> Path:
    """The directory a format writes into: made (with its parents) when missing; one that exists
    must hold nothing but a command's marker. A format writes files; it never replaces or
    removes anything: replacing an output whole is the commands' (:func:`atomic_dir`).

    Raises:
        OutputError: ``path`` is a file, or a directory with entries in it, or cannot be made.
    """
    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{target} exists and is not a directory") from None
    except OSError as exc:
        raise write_error(target, exc) from exc
    if any(p.name != MARKER for p in target.iterdir()):
        raise OutputError(
            f"{target} is not empty: give a new or empty directory (the opsnn-quant commands "
            "replace their own outputs)"
        )
    return target


def record_in_enclosing(path: Path) -> None:
    """Record what is now at ``path`` (a nested output just swapped in, a loose file written or
    removed) in the manifest of every output it lies in, so that each stays ours entry by entry
    (``export-weights`` redoing ``OUT/export/ascendv1`` leaves ``OUT`` replaceable). An output
    being built is left alone: its swap writes its whole manifest."""
    path = path.absolute()
    now: dict[Path, int] = {}
    if path.is_dir() and not path.is_symlink():
        now = {path / rel: size for rel, size in manifest_of(path).items()}
        if (path / MARKER).is_file():
            now[path / MARKER] = (path / MARKER).stat().st_size
    elif path.exists() or path.is_symlink():
        now = {path: path.lstat().st_size}
    for top, marker in enclosing_outputs(path):
        if is_live(top):
            return
        rel = path.relative_to(top).as_posix()
        manifest = {
            k: v for k, v in marker.manifest.items() if k != rel and not k.startswith(rel + "/")
        }
        manifest.update({p.relative_to(top).as_posix(): size for p, size in now.items()})
        text = Marker(marker.kind, marker.token, dict(sorted(manifest.items()))).to_json()
        atomic_write_text(top / MARKER, text)
        now[top / MARKER] = len(text.encode("utf-8"))  # the next output up lists this marker
