"""The layout of a calibrate output directory: one owner for the names every command reads and
writes (``probe.json``, ``policy.yaml``, ``quant/``, ``export/``, ``report/``, ``timings.json``,
``recipe.yaml``), instead of literals spread over the commands. What a directory a user passes
is, is :func:`opsnn_quant.formats.candidates.recognise`'s answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROBE_FILE = "probe.json"
POLICY_FILE = "policy.yaml"
TIMINGS_FILE = "timings.json"
RECIPE_FILE = "recipe.yaml"
QUANT_DIR = "quant"
EXPORT_DIR = "export"
REPORT_DIR = "report"


@dataclass(frozen=True)
class CalibrateOutput:
    """A calibrate output directory's paths (it need not exist yet: the run builds it).

    Attributes:
        root: the directory.
    """

    root: Path

    @property
    def probe(self) -> Path:
        """The probe report."""
        return self.root / PROBE_FILE

    @property
    def policy(self) -> Path:
        """The precision policy."""
        return self.root / POLICY_FILE

    @property
    def recipe(self) -> Path:
        """The effective recipe of the run (flags and overrides applied)."""
        return self.root / RECIPE_FILE

    @property
    def timings(self) -> Path:
        """The run's wall-clock times and environment."""
        return self.root / TIMINGS_FILE

    @property
    def quant(self) -> Path:
        """The quantized checkpoint directory."""
        return self.root / QUANT_DIR

    @property
    def export(self) -> Path:
        """The deployment exports directory."""
        return self.root / EXPORT_DIR

    @property
    def report(self) -> Path:
        """The acceptance report directory (``calibrate --evaluate``)."""
        return self.root / REPORT_DIR

    def read_by_consumers(self) -> list[Path]:
        """What ``evaluate`` and ``export-weights`` read of it: its ``quant/``, ``probe.json``
        and ``policy.yaml`` (so a report or an export may go beside them, never over them)."""
        return [self.quant, self.probe, self.policy]

    @classmethod
    def holding(cls, export: Path) -> CalibrateOutput | None:
        """The calibrate output an engine directory was exported into (``OUT/export/<fmt>``, or
        one component of it, ``OUT/export/<fmt>/<component>``), or None when it stands
        elsewhere."""
        if export.parent.name == EXPORT_DIR:
            return cls(export.parent.parent)
        up = export.parent.parent
        if up.name == EXPORT_DIR and cls(up.parent).quant.is_dir():
            return cls(up.parent)
        return None
