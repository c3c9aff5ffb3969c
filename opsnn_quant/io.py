"""Safe outputs: atomic writes, outputs we own, and JSON configs read strictly.

Every output directory opsnn-quant writes carries a marker file (:data:`MARKER`) naming the kind
of output (``calibrate``, ``probe``, ``quant``, ``report``...) and listing what it holds. A
directory is replaced only when it is empty or, entry by entry, an output of the same kind
(:mod:`opsnn_quant.ownership`), unless the caller forces it; a loose output file only when it
holds what we wrote there. Anything else is refused with one line naming the path. ``--force``
replaces only what we wrote: an output of another kind or one edited since (its marker still
there), never a directory without our marker, a file, a home directory, a filesystem root or
mount point, a directory holding a ``.git``, or an input of the command (resolved: a ``zoo:``
model's directory, the package itself). Every writer into an output holds its lock and the
locks of the outputs it lies in (:func:`output_lock`). Directories are built in a
``<name>.tmp-<token>`` sibling and swapped in by two renames (the old one aside to
``<name>.old-<token>``, the new one into place); a run killed between the two is repaired by the
next one, which restores or removes what that run left.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TypeVar

from pydantic import BaseModel, ValidationError

from opsnn_quant.errors import ConfigError, InputError
from opsnn_quant.ownership import (
    LEDGER,
    MARKER,
    Marker,
    first_foreign_entry,
    hashes_of,
    hold,
    is_live,
    is_token,
    ledger_text,
    listed_file,
    manifest_of,
    new_token,
    owned_file,
    read_marker,
)

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)

# errno values that mean "this output location cannot be written" (a user's problem, exit 2).
WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.ENOTDIR}


class OutputError(InputError):
    """An output path that cannot or must not be written (exists, not ours, read-only, full)."""


class OutputChangedError(OutputError):
    """The output location changed while a run built its replacement (a user's file appeared
    there): nothing was replaced, and the finished output is kept in its temporary sibling."""


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


def _is_within(path: Path, ancestor: Path) -> bool:
    return path == ancestor or ancestor in path.parents


PACKAGE_DIR = Path(__file__).resolve().parent
_LEFT_ALONE: set[Path] = set()  # look-alike siblings already warned about in this process


def _siblings(target: Path) -> tuple[dict[str, Path], dict[str, Path], list[Path]]:
    """``<name>.tmp-<token>`` and ``<name>.old-<token>`` beside ``target`` by token, and the
    other ``<name>.tmp-*`` / ``<name>.old-*`` entries (never a glob: the name may hold ``[``)."""
    tmps: dict[str, Path] = {}
    olds: dict[str, Path] = {}
    odd: list[Path] = []
    for entry in sorted(target.parent.iterdir()):
        for tag, found in ((".tmp-", tmps), (".old-", olds)):
            prefix = target.name + tag
            if entry.name.startswith(prefix):
                token = entry.name[len(prefix) :]
                if is_token(token) and entry.is_dir() and not entry.is_symlink():
                    found[token] = entry
                else:
                    odd.append(entry)
    return tmps, olds, odd


def repair_siblings(
    path: str | os.PathLike[str], kind: str, *, keep_unfinished: bool = False
) -> list[str]:
    """Finish or undo what an interrupted ``kind`` run into ``path`` left; returns what was done.

    Only this tool's own debris is touched (see :mod:`opsnn_quant.ownership`): a
    ``<name>.tmp-<token>`` directory whose marker holds that token and ``kind`` is an unfinished
    output and is removed; a ``<name>.old-<token>`` directory is the previous output renamed
    aside by the swap of run ``<token>``: put back when that run's output never arrived, removed
    when ``path`` is that run's output. Anything else named like debris is left alone with one
    warning line. ``keep_unfinished``: unfinished outputs stay (a run resuming one of them).

    Raises:
        OutputError: another run is building ``path`` right now (its temporary directory is
            locked).
    """
    target = Path(path)
    if not target.parent.is_dir():
        return []
    tmps, olds, odd = _siblings(target)
    done: list[str] = []
    for token, tmp in tmps.items():
        marker = read_marker(tmp).marker
        if marker is None or marker.kind != kind or marker.token != token:
            odd.append(tmp)
            continue
        if is_live(tmp):
            raise OutputError(
                f"output {target} is being written by another opsnn-quant run ({tmp.name}); "
                "wait for it to finish or choose another output"
            )
        old = olds.pop(token, None)
        if old is not None and not (target.exists() or target.is_symlink()):
            os.replace(old, target)
            done.append(f"restored {target} from {old.name} (a previous run stopped mid-swap)")
        elif old is not None:
            odd.append(old)
        if keep_unfinished:
            continue
        shutil.rmtree(tmp, ignore_errors=True)
        done.append(f"removed {tmp} (unfinished output of a previous run)")
    current = read_marker(target).marker if target.is_dir() else None
    for token, old in olds.items():
        if current is not None and current.token == token and current.kind == kind:
            shutil.rmtree(old, ignore_errors=True)
            done.append(f"removed {old} (the output it replaced, left by a previous run)")
        else:
            odd.append(old)
    for line in done:
        log.warning("%s", line)
    for entry in odd:
        if entry not in _LEFT_ALONE:  # a command checks its output more than once: say it once
            _LEFT_ALONE.add(entry)
            log.warning(
                "left %s alone: it is not what an interrupted opsnn-quant %s run into %s left",
                entry, kind, target.name,
            )  # fmt: skip
    return done


def _check_not_an_input(target: Path, inputs: Iterable[str | os.PathLike[str]]) -> None:
    resolved = target.resolve()
    if _is_within(Path.cwd().resolve(), resolved):
        raise OutputError(
            f"output {target} is the working directory or contains it; choose a new directory"
        )
    named = [(str(item), Path(item).resolve()) for item in inputs]
    named.append(("the opsnn-quant package (its built-in models, recipes and suites)", PACKAGE_DIR))
    for item, src in named:
        if _is_within(src, resolved):
            raise OutputError(f"output {target} would replace the input {item}; choose another")
        if _is_within(resolved, src):
            raise OutputError(f"output {target} is inside the input {item}; choose another")


def _check_parents(target: Path) -> None:
    for parent in target.resolve().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"output {target}: {parent} is a file, not a directory")
            return


# How a refusal that --force cannot lift ends: of what is there, and of where it is.
NEVER_FORCED = "choose a new or empty directory (--force replaces only opsnn-quant outputs)"
NEVER_HERE = "choose a new directory inside it (--force replaces only opsnn-quant outputs)"


def _homes() -> list[Path]:
    """The user's home directories: ``$HOME`` and the password database's (they may differ)."""
    found = [os.environ.get("HOME", "")]
    with contextlib.suppress(ImportError, KeyError, OSError):  # no pwd (Windows), no entry
        import pwd

        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    return [Path(h).resolve() for h in dict.fromkeys(found) if h and os.path.isabs(h)]


def _why_never_at(target: Path) -> str | None:
    """Why the location ``target`` is never replaced, ``--force`` or not: a filesystem root or
    mount point, a home directory or a directory holding one (None: it may be)."""
    # what would be replaced: the entry itself (a link is replaced, not what it points to)
    plain = target.name not in ("", ".", "..")
    where = target.absolute().parent.resolve() / target.name if plain else target.resolve()
    if where == Path(where.anchor) or (not target.is_symlink() and os.path.ismount(where)):
        return "is a filesystem root or mount point"
    for home in _homes():
        if where == home:
            return "is your home directory"
        if _is_within(home, where):
            return f"holds your home directory {home}"
    return None


def _first_git(directory: Path) -> str | None:
    """The first ``.git`` under ``directory`` (relative path), or None; links not followed."""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            if name == ".git":
                return (Path(root) / name).relative_to(directory).as_posix()
    return None


def _why_never_replaced(directory: Path) -> str | None:
    """Why the existing, non-empty ``directory`` is not ours to replace even with ``--force``
    (None: it is an opsnn-quant output, perhaps edited since or of another kind)."""
    found = read_marker(directory)
    if found.kind is None:
        return "exists and is not an opsnn-quant output"
    git = _first_git(directory)  # walked only in our outputs (a home is refused without it)
    if git is not None:
        return f"holds {git} (a version-control repository)"
    if found.marker is not None:
        held = manifest_of(directory)
        if held and not set(held) & set(found.marker.manifest):
            return (
                f"holds {min(held)} but none of the files its opsnn-quant marker lists (a "
                "marker copied there vouches for nothing)"
            )
    return None


def _why_not_replaceable(target: Path, kind: str) -> str | None:
    """Why ``target`` (an existing, non-empty directory) is not ours to replace, or None."""
    found = read_marker(target)
    if found.kind is None:
        return "exists and is not an opsnn-quant output"
    if found.kind != kind:
        return f"exists and is a '{found.kind}' output"
    if found.marker is None:
        return "exists and its marker lists no contents (an older opsnn-quant wrote it)"
    foreign = first_foreign_entry(target, found.marker)
    if foreign is not None:
        return (
            f"holds {foreign}, which is not part of the {kind} output opsnn-quant wrote there "
            "(added or changed since)"
        )
    return None


def _link_text(target: Path) -> str:
    try:
        return f"a symbolic link to {os.readlink(target)}"
    except OSError:
        return "a symbolic link"


def check_output_dir(
    path: str | os.PathLike[str],
    kind: str,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
    keep_unfinished: bool = False,
) -> Path:
    """Refuse an output directory we must not replace, before any work is done.

    Args:
        path: the output directory.
        kind: the kind of output the command writes (its marker).
        force: replace an opsnn-quant output of another kind, one changed since it was
            written, or a symbolic link (the link, not what it points to); never a directory
            without our marker, a file, a home or root directory, a mount point, a directory
            holding a ``.git``.
        inputs: paths the command reads (recipe, resolved model directory, data, suite...):
            the output may not be one of them, contain one or lie inside one, ``force`` or not.
            The opsnn-quant package itself is always an input.
        keep_unfinished: leave unfinished outputs of earlier runs in place (see
            :func:`unfinished_output`) instead of removing them.

    Returns:
        ``path`` as a Path.

    Raises:
        OutputError: ``path`` is the working directory or contains it, is, contains or lies in
            an input, has a file as parent, is being written by another run (it or an output
            it lies in), is never ours to replace (see ``force``), exists and is not ours entry
            by entry (without ``force``), or its parent cannot be written.
    """
    target = Path(path)
    _check_not_an_input(target, inputs)
    _check_parents(target)
    never = _why_never_at(target)
    if never is not None:
        raise OutputError(f"output {target} {never}; {NEVER_HERE}")
    if not target.is_symlink() and target.exists() and not target.is_dir():
        never = "is an existing file, not an opsnn-quant output"
    elif target.is_dir() and not target.is_symlink() and any(target.iterdir()):
        never = _why_never_replaced(target)
    if never is not None:
        raise OutputError(f"output {target} {never}; {NEVER_FORCED}")
    with output_lock(target):  # refused now, before any work, when another run writes it
        pass
    repair_siblings(target, kind, keep_unfinished=keep_unfinished)
    if target.is_symlink():
        if not force:
            raise OutputError(
                f"output {target} is {_link_text(target)}; give the directory itself, remove "
                "the link or pass --force (the link is replaced, not what it points to)"
            )
    elif target.is_dir() and any(target.iterdir()) and not force:
        reason = _why_not_replaceable(target, kind)
        if reason is not None:
            raise OutputError(f"output {target} {reason}; choose another or pass --force")
    _check_writable(target)
    return target


def _check_writable(target: Path) -> None:
    # Probe the nearest existing ancestor: a refusal after this check (the next output of the
    # same command) must not leave directories behind, so nothing is created here.
    parent = next(p for p in (target.absolute().parent, *target.absolute().parents) if p.exists())
    try:
        probe = tempfile.mkdtemp(prefix=f".{target.name}.probe-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise write_error(target, exc) from exc


def unfinished_output(path: str | os.PathLike[str], kind: str) -> Path | None:
    """The newest temporary directory an interrupted ``kind`` run into ``path`` left (its
    marker holds its token and ``kind``, and no running process holds it), or None."""
    target = Path(path)
    if not target.parent.is_dir():
        return None
    found = []
    for token, tmp in _siblings(target)[0].items():
        marker = read_marker(tmp).marker
        ours = marker is not None and marker.kind == kind and marker.token == token
        if ours and not is_live(tmp):
            found.append(tmp)
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


@contextlib.contextmanager
def atomic_dir(
    path: str | os.PathLike[str],
    kind: str = "output",
    *,
    force: bool = False,
    resume: Path | None = None,
    keep_if: str | None = None,
) -> Iterator[Path]:
    """Build a directory in ``<path>.tmp-<token>`` and swap it into place when the block succeeds.

    On an exception (Ctrl-C and SIGTERM included) the temporary directory is removed and
    ``path`` keeps its previous contents. The swap renames the old directory aside to
    ``<path>.old-<token>`` first, so at no point is a half-written ``path`` visible; a crash
    between the two renames is repaired by :func:`repair_siblings` on the next run. The new
    marker records the run's token and the manifest of what was written.

    Args:
        path: the output directory.
        kind: the kind of output, recorded in its marker; an existing ``path`` is replaced only
            when it is empty or, entry by entry, an output of this kind.
        force: replace an opsnn-quant output of another kind or one changed since, or a link
            (see :func:`check_output_dir`; checked again at the swap).
        resume: an unfinished output of an earlier run into ``path`` (see
            :func:`unfinished_output`) to build on instead of a new temporary directory.
        keep_if: on an interruption or a failure of the work (not of writing: a full disk keeps
            nothing), keep the temporary directory (for ``resume``) when this entry of it exists (the caller's record of finished work; it removes that entry before the
            block ends, so the output never holds it). A run without ``resume`` removes a kept
            directory (see :func:`repair_siblings`).

    Holds :func:`output_lock` of ``path`` (and of the outputs it lies in) throughout.

    Raises:
        OutputError: see :func:`check_output_dir`; also when writing fails for lack of space or
            permission (the previous output is left as it was).
    """
    target = Path(path)
    with output_lock(target):
        check_output_dir(target, kind, force=force, keep_unfinished=resume is not None)
        tmp, token, lock = _open_tmp(target, kind) if resume is None else _adopt_tmp(resume)
        with _built(tmp, target, lock, keep_if):
            yield tmp
            _swap(tmp, target, Marker(kind, token, manifest_of(tmp)), lock, force=force)
            _record_in_enclosing(target)


@contextlib.contextmanager
def _built(tmp: Path, target: Path, lock: IO[str], keep_if: str | None) -> Iterator[None]:
    """What becomes of ``tmp`` when building or swapping it fails (see :func:`atomic_dir`)."""
    try:
        yield
    except OutputChangedError:
        lock.close()  # the finished output stays where it is; the message says where
        raise
    except OutputError as exc:
        _discard(tmp, lock)  # writing failed (no space, no permission): keep nothing
        # A nested output (OUT/quant) failed: name it where the user will look for it.
        raise OutputError(str(exc).replace(str(tmp), str(target))) from exc
    except OSError as exc:
        _discard(tmp, lock)
        if exc.errno in WRITE_ERRNOS:
            raise write_error(target, exc) from exc
        raise
    except BaseException:
        _fail(tmp, lock, keep_if)
        raise


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
        for outer, _ in reversed(list(_enclosing_outputs(target))):
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


def _live_nested(directory: Path) -> str | None:
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


def _open_tmp(target: Path, kind: str) -> tuple[Path, str, IO[str]]:
    token = new_token()
    tmp = target.parent / f"{target.name}.tmp-{token}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()  # the umask applies: outputs are ordinary directories
        (tmp / MARKER).write_text(Marker(kind, token).to_json(), encoding="utf-8")
        return tmp, token, hold(tmp / MARKER)
    except BaseException as exc:  # a signal in this window too: no temporary left behind
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise write_error(target, exc) from exc
        raise


def check_adoptable(tmp: Path) -> Marker:
    """The marker of ``tmp``, an unfinished output kept for ``--resume``, once ``tmp`` proves to
    hold what the interrupted run left there: only directories and regular files (a link would
    send the resumed run's writes outside the output) and, when the run recorded it on the way
    out, the same manifest (paths and sizes) and the same contents (SHA-256 of each file; a
    kept output of a version that recorded no hashes is compared by size).

    Raises:
        OutputError: ``tmp`` is not such an output, is live, or was changed since.
    """
    marker = read_marker(tmp).marker
    if marker is None or is_live(tmp):
        raise OutputError(f"{tmp} is not an unfinished output this run can take over")
    for root, dirs, files in os.walk(tmp):
        for name in sorted([*dirs, *files]):
            entry = Path(root) / name
            mode = entry.lstat().st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise OutputError(
                    f"--resume: {entry} is not a regular file or directory (a link?): the kept "
                    "output was changed since its run stopped; run without --resume"
                )
    found = manifest_of(tmp)
    changed = None
    if marker.manifest and found != marker.manifest:
        changed = sorted(set(found.items()) ^ set(marker.manifest.items()))[0][0]
    elif marker.hashes:
        now = hashes_of(tmp, found)
        diff = sorted(set(now.items()) ^ set(marker.hashes.items()))
        changed = diff[0][0] if diff else None
    if changed is not None:
        raise OutputError(
            f"--resume: {tmp / changed} was added, removed or changed since the interrupted run "
            "kept its output; run without --resume"
        )
    return marker


def _adopt_tmp(tmp: Path) -> tuple[Path, str, IO[str]]:
    marker = check_adoptable(tmp)
    return tmp, marker.token, hold(tmp / MARKER)


def _fail(tmp: Path, lock: IO[str], keep_if: str | None) -> None:
    if keep_if is not None and (tmp / keep_if).exists():
        kept = read_marker(tmp).marker
        if kept is not None:  # what is kept, so that --resume can tell it is untouched
            manifest = manifest_of(tmp)
            hashes = hashes_of(tmp, manifest)  # a same-length edit keeps every size
            _rewrite_marker(lock, Marker(kept.kind, kept.token, manifest, hashes))
        lock.close()
        log.warning("kept the finished work in %s: the same command with --resume goes on", tmp)
        return
    _discard(tmp, lock)


def _rewrite_marker(lock: IO[str], marker: Marker) -> None:
    # Through the locked handle: the lock stays on the same file.
    lock.seek(0)
    lock.truncate()
    lock.write(marker.to_json())
    lock.flush()


def _discard(tmp: Path, lock: IO[str]) -> None:
    lock.close()
    shutil.rmtree(tmp, ignore_errors=True)


def _swap(tmp: Path, target: Path, marker: Marker, lock: IO[str], *, force: bool) -> None:
    _rewrite_marker(lock, marker)
    old = None
    if target.is_dir() and not target.is_symlink():
        never = _why_never_at(target)
        if never is not None:  # refused at the start; the location cannot have changed since
            raise _changed(target, tmp, never)
        old = target.parent / f"{target.name}.old-{marker.token}"
        os.replace(target, old)
        # Checked again once aside (nothing can be added to it by name any more): a user's
        # file put there while this run built its output, or a nested output another run is
        # writing, is never removed with it; --force or not.
        reason = _why_not_swapped(old, marker.kind, force=force)
        if reason is not None:
            os.replace(old, target)
            raise _changed(target, tmp, reason)
    elif target.exists() or target.is_symlink():
        if not force or not target.is_symlink():  # appeared while this run built its output
            raise _changed(target, tmp, "is now a file or a link")
        target.unlink()  # a link, replaced with --force (not what it points to)
    try:
        os.replace(tmp, target)
    except BaseException:
        # Interrupted (or failed) between the renames: the previous output goes back now; only
        # a kill -9 leaves the pair for the next run's repair.
        if old is not None and not (target.exists() or target.is_symlink()):
            os.replace(old, target)
        raise
    lock.close()
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _why_not_swapped(old: Path, kind: str, *, force: bool) -> str | None:
    """Why the previous output, renamed aside to ``old``, must not be removed (None: it may)."""
    live = _live_nested(old)
    if live is not None:
        return f"holds {live}, which another opsnn-quant run is writing"
    if not any(old.iterdir()):
        return None
    reason = _why_never_replaced(old) if force else _why_not_replaceable(old, kind)
    if reason is not None and read_marker(old).kind is None:
        reason = f"holds {min(p.name for p in old.iterdir())}, which is not an opsnn-quant output"
    return reason


def _changed(target: Path, tmp: Path, reason: str) -> OutputChangedError:
    return OutputChangedError(
        f"output {target} changed while this run built it: it {reason}; nothing was replaced, "
        f"the new output is in {tmp} (move it away: the next run into {target.name} removes it)"
    )


def _enclosing_outputs(path: Path) -> Iterator[tuple[Path, Marker]]:
    """The outputs ``path`` lies in, innermost first (each ancestor with a complete marker)."""
    for parent in path.absolute().parents:
        marker = read_marker(parent).marker
        if marker is not None:
            yield parent, marker


def _record_in_enclosing(path: Path) -> None:
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
    for top, marker in _enclosing_outputs(path):
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


# ---- single files -------------------------------------------------------------------------


def check_output_file(
    path: str | os.PathLike[str],
    kind: str,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Refuse an output file we must not replace, before any work is done.

    An existing file is replaced only when it holds exactly what opsnn-quant wrote there as a
    ``kind`` file (the ledger beside it, :mod:`opsnn_quant.ownership`), or with ``force`` when
    the ledger records that opsnn-quant wrote it (changed since, or of another kind); a file
    opsnn-quant never wrote there is the user's, replaced whatever the flags never (issue 58).

    Raises:
        OutputError: ``path`` is a directory, is an input (``force`` or not), has a file as
            parent, exists and was never ours (``force`` or not) or is not ours as it is
            (without ``force``), or cannot be written.
    """
    target = Path(path)
    if target.is_dir() and not target.is_symlink():
        raise OutputError(f"{target} is a directory; give a file path")
    _check_not_an_input(target, inputs)
    _check_parents(target)
    if target.is_file() and not target.is_symlink() and not listed_file(target):
        raise OutputError(
            f"output {target} exists and is not an opsnn-quant file; remove it or choose "
            "another path (--force replaces only what opsnn-quant wrote)"
        )
    if not force:
        if target.is_symlink():
            raise OutputError(f"output {target} is {_link_text(target)}; remove it or pass --force")
        if target.exists() and not owned_file(target, kind):
            raise OutputError(
                f"output {target} exists and is not an opsnn-quant {kind} file (or was changed "
                "since); remove it or pass --force"
            )
    _check_writable(target)
    return target


def write_output_file(
    path: str | os.PathLike[str], data: str | bytes, kind: str, *, force: bool = False
) -> Path:
    """Write a loose output file atomically (after :func:`check_output_file`) and record it in
    its directory's ledger, so that the next run may replace it.

    Holds the locks of the outputs it lies in (:func:`output_lock`) while it writes.

    Raises:
        OutputError: as :func:`check_output_file` and :func:`atomic_write_bytes`; another run
            writes an output ``path`` lies in.
    """
    with output_lock(path):
        target = check_output_file(path, kind, force=force)
        raw = data.encode("utf-8") if isinstance(data, str) else data
        atomic_write_bytes(target, raw)
        ledger = ledger_text(target.parent, target.name, kind, raw)
        atomic_write_text(target.parent / LEDGER, ledger)
        _record_in_enclosing(target)
        _record_in_enclosing(target.parent / LEDGER)
    return target


def write_output_files(
    files: Mapping[Path, tuple[str | bytes, str]],
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
    stale: Mapping[Path, str] | None = None,
) -> list[Path]:
    """Write loose output files (path -> (contents, kind)) after checking every one of them
    (:func:`check_output_file`: nothing is written when one must not be replaced), then remove
    the ``stale`` ones (path -> kind) an earlier run wrote and this one does not.

    Raises:
        OutputError: as :func:`check_output_file` and :func:`write_output_file`.
    """
    for target, (_, kind) in files.items():
        check_output_file(target, kind, force=force, inputs=inputs)
    out = [write_output_file(p, data, kind, force=force) for p, (data, kind) in files.items()]
    for path, kind in (stale or {}).items():
        remove_output_file(path, kind)  # ours from an earlier run, now stale; a user's stays
    return out


def remove_output_file(path: str | os.PathLike[str], kind: str) -> bool:
    """Remove ``path`` when it is a ``kind`` file opsnn-quant wrote, unchanged; True if removed.

    A user's file of that name is left as it is. Holds the locks of the outputs it lies in.
    """
    target = Path(path)
    with output_lock(target):
        if not owned_file(target, kind):
            return False
        target.unlink()
        ledger = ledger_text(target.parent, target.name, kind, None)
        atomic_write_text(target.parent / LEDGER, ledger)
        _record_in_enclosing(target)
        _record_in_enclosing(target.parent / LEDGER)
    return True


def load_json_model(cls: type[_M], path: str | os.PathLike[str]) -> _M:
    """Read a JSON file and validate it as the pydantic model ``cls``.

    Raises:
        ConfigError: Missing file, bad JSON, not UTF-8 or a schema violation; the message names
            the file and the first offending field.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p} not found")
    try:
        return cls.model_validate_json(read_text(p))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{p}: {where}: {first['msg']}") from exc


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's contents.

    Raises:
        ConfigError: missing, unreadable or not UTF-8 (the message names the file and the byte).
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{p} not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{p} is a directory, not a file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc


# ---- JSON files and node maps ----------------------------------------------------------------


def write_json_atomic(
    path: str | os.PathLike[str], doc: object, *, indent: int | None = 1, sort_keys: bool = True
) -> Path:
    """Write ``doc`` as JSON through :func:`atomic_write_text`; returns the path.

    Raises:
        OutputError: as :func:`atomic_write_bytes`.
    """
    return atomic_write_text(path, json.dumps(doc, indent=indent, sort_keys=sort_keys))


def load_node_map(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Module -> ONNX node names from ``<model>.nodes.json`` (or a plain ``{module: [nodes]}``).

    ``path`` may name the ``.onnx`` file: its ``.nodes.json`` sibling is read. A light JSON
    reader (no torch, no onnx) for the ATC exports and the ONNX tools alike.

    Raises:
        ConfigError: missing file, invalid JSON, or not a mapping of lists of strings.
    """
    p = Path(path)
    if p.suffix == ".onnx":
        p = p.with_suffix(".nodes.json")
    if not p.is_file():
        raise ConfigError(f"node map {p} not found")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    nodes = doc.get("nodes", doc) if isinstance(doc, dict) else None
    if not isinstance(nodes, dict) or not all(
        isinstance(v, list) and all(isinstance(x, str) for x in v) for v in nodes.values()
    ):
        raise ConfigError(f"{p}: expected {{module name: [ONNX node names]}} (or under 'nodes')")
    return {str(k): list(v) for k, v in nodes.items()}
