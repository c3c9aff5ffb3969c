"""Loose output files (``policy export -o FILE``, the notes of ``export-weights``): checked
before any is written, written atomically, recorded in the ledger beside them so that the next
run may replace or remove them (and never a user's file of that name)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from opsnn_quant.errors import OutputError
from opsnn_quant.output.files import atomic_write_bytes, atomic_write_text, record_in_enclosing
from opsnn_quant.output.locks import output_lock
from opsnn_quant.output.ownership import LEDGER, ledger_text, listed_file, owned_file
from opsnn_quant.output.places import check_not_an_input, check_parents, check_writable, link_text


def check_output_file(
    path: str | os.PathLike[str],
    kind: str,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Refuse an output file we must not replace, before any work is done.

    An existing file is replaced only when it holds exactly what opsnn-quant wrote there as a
    ``kind`` file (the ledger beside it, :mod:`opsnn_quant.output.ownership`), or with ``force`` when
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
    check_not_an_input(target, inputs)
    check_parents(target)
    if target.is_file() and not target.is_symlink() and not listed_file(target):
        raise OutputError(
            f"output {target} exists and is not an opsnn-quant file; remove it or choose "
            "another path (--force replaces only what opsnn-quant wrote)"
        )
    if not force:
        if target.is_symlink():
            raise OutputError(f"output {target} is {link_text(target)}; remove it or pass --force")
        if target.exists() and not owned_file(target, kind):
            raise OutputError(
                f"output {target} exists and is not an opsnn-quant {kind} file (or was changed "
                "since); remove it or pass --force"
            )
    check_writable(target)
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
        record_in_enclosing(target)
        record_in_enclosing(target.parent / LEDGER)
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
        record_in_enclosing(target)
        record_in_enclosing(target.parent / LEDGER)
    return True
