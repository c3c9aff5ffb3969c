"""Output directories: checked before any work, built in a temporary sibling, swapped into
place by two renames, repaired after an interrupted run, kept for ``--resume``.

A directory is built in ``<name>.tmp-<token>`` and swapped in by two renames (the old one aside
to ``<name>.old-<token>``, the new one into place); a run killed between the two is repaired by
the next one, which restores or removes what that run left (:func:`repair_siblings`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from opsnn_quant.errors import OutputChangedError, OutputError
from opsnn_quant.output.files import WRITE_ERRNOS, record_in_enclosing, write_error
from opsnn_quant.output.locks import live_nested, output_lock
from opsnn_quant.output.ownership import (
    MARKER,
    Marker,
    hashes_of,
    hold,
    is_live,
    is_token,
    manifest_of,
    new_token,
    read_marker,
)
from opsnn_quant.output.places import (
    NEVER_FORCED,
    NEVER_HERE,
    check_not_an_input,
    check_parents,
    check_writable,
    link_text,
    why_never_at,
    why_never_replaced,
    why_not_replaceable,
)

log = logging.getLogger(__name__)


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

    Only this tool's own debris is touched (see :mod:`opsnn_quant.output.ownership`): a
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
    check_not_an_input(target, inputs)
    check_parents(target)
    never = why_never_at(target)
    if never is not None:
        raise OutputError(f"output {target} {never}; {NEVER_HERE}")
    if not target.is_symlink() and target.exists() and not target.is_dir():
        never = "is an existing file, not an opsnn-quant output"
    elif target.is_dir() and not target.is_symlink() and any(target.iterdir()):
        never = why_never_replaced(target)
    if never is not None:
        raise OutputError(f"output {target} {never}; {NEVER_FORCED}")
    with output_lock(target):  # refused now, before any work, when another run writes it
        pass
    repair_siblings(target, kind, keep_unfinished=keep_unfinished)
    if target.is_symlink():
        if not force:
            raise OutputError(
                f"output {target} is {link_text(target)}; give the directory itself, remove "
                "the link or pass --force (the link is replaced, not what it points to)"
            )
    elif target.is_dir() and any(target.iterdir()) and not force:
        reason = why_not_replaceable(target, kind)
        if reason is not None:
            raise OutputError(f"output {target} {reason}; choose another or pass --force")
    check_writable(target)
    return target


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
            record_in_enclosing(target)


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
        never = why_never_at(target)
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
    live = live_nested(old)
    if live is not None:
        return f"holds {live}, which another opsnn-quant run is writing"
    if not any(old.iterdir()):
        return None
    reason = why_never_replaced(old) if force else why_not_replaceable(old, kind)
    if reason is not None and read_marker(old).kind is None:
        reason = f"holds {min(p.name for p in old.iterdir())}, which is not an opsnn-quant output"
    return reason


def _changed(target: Path, tmp: Path, reason: str) -> OutputChangedError:
    return OutputChangedError(
        f"output {target} changed while this run built it: it {reason}; nothing was replaced, "
        f"the new output is in {tmp} (move it away: the next run into {target.name} removes it)"
    )
