"""``ExportResult``: one exported file, what every policy exporter returns."""

from __future__ import annotations

from dataclasses import dataclass


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
