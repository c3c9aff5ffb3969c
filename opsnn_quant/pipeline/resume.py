"""``calibrate --resume``: the phases an interrupted run finished, kept in its temporary directory.

A calibrate run records each finished phase in ``.resume.json`` inside its temporary output
directory (with what identifies the run: the effective recipe, engine, suite, latency mode...).
When the run fails or is interrupted after a phase finished, the temporary directory is kept
(:func:`opsnn_quant.output.directories.atomic_dir`'s ``keep_if``); the same command with ``--resume`` takes it
over and skips what is done. The record is removed before the output is swapped into place, so
a resumed run writes the files an uninterrupted one does.

Resumable phases are those whose results are files: the probe (``probe.json``; its in-memory
statistics are collected again by probe pass 1 alone, see
:func:`opsnn_quant.probe.api.recollect`) and the policy (``policy.yaml``, the measured search
included). Quantize, exports and the acceptance run work on models in memory and run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsnn_quant.errors import ConfigError
from opsnn_quant.output.directories import check_adoptable, unfinished_output
from opsnn_quant.output.files import atomic_write_text
from opsnn_quant.version import __version__

RESUME_FILE = ".resume.json"
PHASES = ("probe", "policy")


@dataclass
class Journal:
    """The finished phases of one calibrate run, kept in its temporary directory.

    Attributes:
        run: what identifies the run (a resumed run must have the same).
        done: the finished phases, in order.
        file: where the record is written (None: not yet given a directory, or closed).
    """

    run: dict[str, Any]
    done: list[str] = field(default_factory=list)
    file: Path | None = None

    def finished(self, phase: str) -> bool:
        """Whether ``phase`` finished in an earlier, interrupted run."""
        return phase in self.done

    def attach(self, directory: Path) -> None:
        """Record into ``directory`` (the run's temporary output) from now on."""
        self.file = directory / RESUME_FILE

    def mark(self, phase: str) -> None:
        """Record ``phase`` as finished (its files are written)."""
        if phase not in PHASES:
            raise ValueError(f"not a resumable phase: {phase!r}")
        if phase not in self.done:
            self.done.append(phase)
        if self.file is not None:
            atomic_write_text(self.file, json.dumps({"run": self.run, "done": self.done}))

    def close(self) -> None:
        """Remove the record: the run is complete and its output is about to be swapped in."""
        if self.file is not None:
            self.file.unlink(missing_ok=True)
            self.file = None


def run_identity(**fields: Any) -> dict[str, Any]:
    """What a resumed run must share with the interrupted one (JSON values), with the version."""
    return json.loads(json.dumps({"version": __version__, **fields}, default=str))


def resumable(out: Path, kind: str, run: dict[str, Any]) -> tuple[Path, Journal]:
    """The unfinished output of an earlier run into ``out`` and its journal.

    Raises:
        ConfigError: nothing to resume, or it was a run with other settings.
        OutputError: what was kept was changed since (a link in it, a file added or resized).
    """
    tmp = unfinished_output(out, kind)
    record = tmp / RESUME_FILE if tmp is not None else None
    if tmp is None or record is None or not record.is_file():
        raise ConfigError(
            f"--resume: no interrupted {kind} run into {out} left finished phases to resume; "
            "run without --resume"
        )
    try:
        saved = json.loads(record.read_text(encoding="utf-8"))
        earlier, done = dict(saved["run"]), [str(p) for p in saved["done"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"--resume: {record} is unreadable ({exc}); run without --resume"
        ) from exc
    check_adoptable(tmp)  # no links, nothing changed since: before any work
    changed = sorted(k for k in set(run) | set(earlier) if run.get(k) != earlier.get(k))
    if changed:
        raise ConfigError(
            f"--resume: the interrupted run in {tmp} ran with other {', '.join(changed)}; "
            "run the same command, or without --resume to start over"
        )
    return tmp, Journal(run, [p for p in done if p in PHASES])
