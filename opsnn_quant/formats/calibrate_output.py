"""The layout of a calibrate output directory: one owner for the names every command reads and
writes (``probe.json``, ``policy.yaml``, ``quant/``, ``export/``, ``report/``, ``timings.json``,
``recipe.yaml``), instead of literals spread over the commands. What a directory a user passes
is, is :func:`opsnn_quant.formats.registry.recognise`'s answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.base import Format, run_dtype

if TYPE_CHECKING:
    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.probe.report import SensitivityReport

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
        """What ``evaluate`` and ``export-weights`` read of it: its ``quant/``, ``probe.json``,
        ``policy.yaml`` and ``recipe.yaml`` (so a report or an export may go beside them,
        never over them)."""
        return [self.quant, self.probe, self.policy, self.recipe]

    def settings(self) -> dict[str, Any]:
        """The model settings the run calibrated with (``recipe.yaml``'s ``model.settings``),
        which the model is loaded with again (so that they, not the family's defaults, are what
        its config files are checked against); none recorded: ``{}``.

        Raises:
            ConfigError: a ``recipe.yaml`` that is not YAML.
        """
        import yaml

        from opsnn_quant.core.readers import read_text

        if not self.recipe.is_file():
            return {}
        try:
            doc = yaml.safe_load(read_text(self.recipe))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{self.recipe} is not YAML: {str(exc).splitlines()[0]}") from exc
        model = doc.get("model") if isinstance(doc, dict) else None
        settings = model.get("settings") if isinstance(model, dict) else None
        return dict(settings) if isinstance(settings, dict) else {}

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


def probe_report_file(path: Path, where: str = "") -> Path:
    """The probe report ``path`` names: a ``probe.json`` itself, or that of the probe or
    calibrate output ``path`` is.

    Raises:
        ConfigError: no report there (``where`` begins the message: the flag that named it).
    """
    file = path / PROBE_FILE if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            f"{where}{path}: no probe report there (a probe or calibrate output, or its "
            f"{PROBE_FILE})"
        )
    return file


class CalibrateOutputFormat(Format):
    """Our calibrate output, read as a candidate: the float source recorded in ``quant/``, our
    quantized modules loaded from it, its ``probe.json`` and ``policy.yaml`` beside."""

    name = "calibrate-output"
    kind = "directory"
    read_order = 30

    @classmethod
    def recognises(cls, path: Path) -> bool:
        return CalibrateOutput(path).quant.is_dir()

    def float_source(self, path: Path, baseline: str | None) -> str:
        from opsnn_quant.formats.checkpoint import read_description

        return str(baseline or read_description(CalibrateOutput(path).quant).get("source_model"))

    def inputs(self, path: Path) -> list[str]:
        return [str(p) for p in CalibrateOutput(path).read_by_consumers()]

    def policy_file(self, path: Path) -> Path | None:
        return CalibrateOutput(path).policy

    def run_dtype(self, path: Path, dtype: str) -> str:
        from opsnn_quant.policy.schema import PrecisionPolicy

        policy = CalibrateOutput(path).policy
        target = PrecisionPolicy.load(policy).target_def if policy.is_file() else None
        return run_dtype(target, dtype)

    def load_candidate(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        from opsnn_quant.formats.checkpoint import load_quantized, read_description
        from opsnn_quant.models import load_adapter
        from opsnn_quant.probe.report import SensitivityReport

        calib = CalibrateOutput(path)
        source = str(read_description(calib.quant).get("source_model") or "")
        if not source:
            raise ConfigError(f"{calib.quant}/description.json names no source model")
        # the settings it was calibrated with, under those the caller runs it with
        adapter = load_adapter(family, source, **{**calib.settings(), **placement})
        load_quantized(adapter.model, calib.quant)
        sensitivity = SensitivityReport.load(calib.probe) if calib.probe.is_file() else None
        return adapter, sensitivity


class ExportedDirectory(Format):
    """An engine's directory: ours sits in ``OUT/export/<fmt>``, beside OUT's policy and
    ``quant/`` (which records the float source); evaluating it reads those too."""

    engine = True

    def inputs(self, path: Path) -> list[str]:
        holder = CalibrateOutput.holding(path)
        return [str(path), *([str(holder.policy), str(holder.quant)] if holder else [])]

    def policy_file(self, path: Path) -> Path | None:
        holder = CalibrateOutput.holding(path)
        return holder.policy if holder else None
