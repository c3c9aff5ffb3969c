"""The model exports of a calibrate output, run by the commands: ``calibrate``'s export phase
and ``opsnn-quant export-weights``.

:func:`write_model_exports` runs the wanted ``model`` formats of the table
(:mod:`opsnn_quant.formats.registry`, each writer in its format's folder) in the table's order,
each into its own directory built atomically here; their notes (modules not exported in their
quantized form, graphs that could not be exported) go to ``export/<name>.notes.txt`` and are
returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from opsnn_quant.formats.base import Format
from opsnn_quant.formats.model_writers import ExportOutcome, ModelExportContext
from opsnn_quant.formats.registry import exporters
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.output.directories import atomic_dir
from opsnn_quant.output.loose import remove_output_file, write_output_file
from opsnn_quant.policy.schema import ResolvedPolicy
from opsnn_quant.recording import Call

log = logging.getLogger(__name__)
__all__ = ["ModelExports", "notes_file", "write_model_exports"]


def write_model_exports(
    adapter: ModelAdapter,
    policy: ResolvedPolicy,
    calls: Mapping[str, Sequence[Call]],
    export_dir: Path,
    wanted: Sequence[str],
    *,
    float_model: nn.Module | None = None,
    staged: Mapping[str, Any] | None = None,
    force: bool = False,
    say: Callable[[str], None] = log.info,
) -> ModelExports:
    """Write the ``wanted`` model exports (``ascendv1``, ``mindie-sd``, ``atc``, a registered
    one) into ``export_dir``, each handed what its format declares it reads.

    Args:
        adapter: the adapter holding the quantized model.
        policy: its resolved policy (target, fp32 pins, module inventory).
        calls: recorded calls per root (SmoothQuant folding, ONNX shapes).
        export_dir: the ``export/`` directory.
        wanted: which exports.
        float_model: the float model, for the formats that read it (ATC's float graphs); None:
            they write without it (or with what they staged).
        staged: per format, what its :meth:`~opsnn_quant.formats.base.Format.stage` made of the
            float model before quantizing (ATC's float graphs).
        force: replace existing directories that are not ours.
        say: progress callback.

    Returns:
        The notes, each prefixed by its export's name, and what each export wrote in int8.
    """
    done = ModelExports()
    for entry in exporters("model"):  # in the table's order: ascendv1, mindie-sd, atc
        if entry.name in wanted:
            ctx = ModelExportContext(
                adapter, policy, calls, export_dir, float_model if entry.float_model else None,
                (staged or {}).get(entry.name), say,
            )  # fmt: skip
            # each export its own output (its marker's kind: the format's name)
            with atomic_dir(export_dir / entry.output, entry.name, force=force) as tmp:
                outcome: ExportOutcome = entry.writer()(ctx, tmp)
            notes = [*outcome.notes, *_float_attention(adapter, entry)]
            done.notes += _write_notes(export_dir, entry.name, notes, force)
            done.int8[entry.name] = outcome.int8
    return done


def _float_attention(adapter: ModelAdapter, entry: Format) -> list[str]:
    """A note naming the model's int8 attention modules the export's engine runs in float."""
    from opsnn_quant.quant.attention import quantized_attention

    names = list(quantized_attention(adapter.model))
    if not names or not entry.attention:
        return []
    shown = ", ".join(names[:3]) + (f", +{len(names) - 3}" if len(names) > 3 else "")
    return [
        f"{len(names)} int8 attention module(s) ({shown}) are float in this export: "
        f"{entry.attention}"
    ]


@dataclass
class ModelExports:
    """What :func:`write_model_exports` wrote: the notes (prefixed by the export's name) and,
    per export, the modules written in int8."""

    notes: list[str] = field(default_factory=list)
    int8: dict[str, list[str]] = field(default_factory=dict)


def notes_file(export_dir: Path, name: str) -> tuple[Path, str]:
    """The notes file of export ``name`` in ``export_dir`` and its output kind."""
    return export_dir / f"{name}.notes.txt", f"{name}.notes"


def _write_notes(export_dir: Path, name: str, lines: list[str], force: bool) -> list[str]:
    path, kind = notes_file(export_dir, name)
    if lines:
        write_output_file(path, "\n".join(lines) + "\n", kind, force=force)
    else:
        remove_output_file(path, kind)  # an earlier run's notes; a user's file stays
    for line in lines:
        log.info("%s: %s", name, line)
    return [f"{name}: {line}" for line in lines]
