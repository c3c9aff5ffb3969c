"""The layout of a calibrate output directory, and what a directory a user passes is.

One owner for the names every command reads and writes (``probe.json``, ``policy.yaml``,
``quant/``, ``export/``, ``report/``, ``timings.json``, ``recipe.yaml``), instead of the literals spread over the
commands, and one classification of a path given as ``--candidate``, ``export-weights OUT`` or
a policy's folder: our calibrate output, an AscendV1 (engine) directory, or a model source.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

PROBE_FILE = "probe.json"
POLICY_FILE = "policy.yaml"
TIMINGS_FILE = "timings.json"
RECIPE_FILE = "recipe.yaml"
QUANT_DIR = "quant"
EXPORT_DIR = "export"
REPORT_DIR = "report"


class DirectoryKind(StrEnum):
    """What a directory passed by a user holds."""

    CALIBRATE_OUTPUT = "calibrate-output"  # ours: quant/ (+ probe.json, policy.yaml)
    MINDIE_SD = "mindie-sd"  # quant_model_description_<type>.json per component (mindiesd)
    ASCENDV1 = "ascendv1"  # quant_model_* files: ours under export/, or msModelSlim's
    MODEL = "model"  # anything else: a model source (directory or named)


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


def classify(path: Path) -> DirectoryKind:
    """What ``path`` is: a MindIE-SD directory (``quant_model_description_<type>.json`` in it or
    a subfolder), an AscendV1 directory (other ``quant_model_*`` files), our calibrate output (a
    ``quant/`` folder), or else a model source."""
    from opsnn_quant.formats.ascendv1.candidate import looks_ascendv1
    from opsnn_quant.formats.mindie_sd.reader import is_mindie_sd_dir

    if is_mindie_sd_dir(path):
        return DirectoryKind.MINDIE_SD
    if looks_ascendv1(path):
        return DirectoryKind.ASCENDV1
    if CalibrateOutput(path).quant.is_dir():
        return DirectoryKind.CALIBRATE_OUTPUT
    return DirectoryKind.MODEL
