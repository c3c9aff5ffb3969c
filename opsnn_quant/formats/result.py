"""What every policy exporter takes beyond the policy (:class:`PolicyExportOptions`) and returns
(:class:`ExportResult`: one exported file), and the files a result is written as
(:func:`export_files`, :func:`write_export`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opsnn_quant.output.loose import write_output_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportResult:
    """One exported file.

    Attributes:
        format: one of :data:`opsnn_quant.formats.policy_files.FORMATS`.
        text: the file content.
        notes: what was approximated or left out, one line each.
        comments: True when ``text`` can carry comments (the notes are then in its header).
    """

    format: str
    text: str
    notes: tuple[str, ...] = ()
    comments: bool = False


@dataclass(frozen=True)
class PolicyExportOptions:
    """What some policy exports take beyond the policy and the inventory (see
    :func:`~opsnn_quant.formats.policy_files.export_policy`'s arguments)."""

    node_map: Mapping[str, Sequence[str]] | None = None
    node_io: Mapping[str, tuple[str, int, int]] | None = None
    op_types: Mapping[str, str] | None = None
    batch_num: int = 1


def export_files(
    result: ExportResult, path: str | Path
) -> tuple[dict[Path, tuple[str | bytes, str]], dict[Path, str]]:
    """The files of ``result`` written at ``path`` (path -> (text, kind)): the file, and the
    notes of a comment-less format in ``<path>.notes.txt``; and the notes file an earlier run
    may have left that this one does not write (path -> kind), for
    :func:`opsnn_quant.output.loose.write_output_files`."""
    notes_path, notes_kind = Path(f"{path}.notes.txt"), f"{result.format}.notes"
    files: dict[Path, tuple[str | bytes, str]] = {Path(path): (result.text, result.format)}
    if result.notes and not result.comments:
        files[notes_path] = ("\n".join(result.notes) + "\n", notes_kind)
    return files, ({} if notes_path in files else {notes_path: notes_kind})


def write_export(result: ExportResult, path: str | Path) -> list[Path]:
    """Write ``result`` at ``path`` in a directory the caller owns (its notes beside it, see
    :func:`export_files`); a file there is replaced only when it is this format's file as we
    wrote it (:func:`opsnn_quant.output.loose.check_output_file`). The command layer writes over a
    user's path with its own checks (``policy export``: ``--force``, its inputs).

    Raises:
        OutputError: a file that must not be replaced, or a location that cannot be written.
    """
    files, stale = export_files(result, path)
    written = write_output_files(files, stale=stale)
    for note in result.notes:
        log.info("%s: %s", result.format, note)
    return written
