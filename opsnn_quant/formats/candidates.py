"""What a directory a user passes is, and how it loads as a candidate: one class per kind of
directory, in one class-keyed registry.

``evaluate --candidate``, ``export-weights OUT`` and ``calibrate --evaluate`` all ask
:func:`recognise` once and then call the answer's methods: where its float model is
(:meth:`~CandidateFormat.float_source`, which also checks the directory whole before anything is
written), what evaluating it reads (:meth:`~CandidateFormat.inputs`), the policy it was made
with, the dtype its engine runs the pipeline in, and the candidate itself
(:meth:`~CandidateFormat.load`). The formats are tried in registration order (MindIE-SD,
AscendV1, our calibrate output); anything else is a model source (:class:`ModelSource`).
:func:`register_format` adds a directory format of one's own ahead of the fallback.

The classes import their format's code inside their methods: recognising a directory stays
light.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.calibrate_output import CalibrateOutput

if TYPE_CHECKING:
    import torch

    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.policy.targets import Target
    from opsnn_quant.probe.report import SensitivityReport

_F = TypeVar("_F", bound="type[CandidateFormat]")


class CandidateFormat(ABC):
    """A kind of directory that loads as an evaluation candidate.

    Attributes:
        name: the kind's name (``ascendv1``, ``mindie-sd``, ``calibrate-output``, ``model``).
        engine: the candidate runs an engine's int8 arithmetic read from the files (AscendV1,
            MindIE-SD), not our quantized modules: its float model is the baseline it is loaded
            into, and its backend is the device's ``-reference``.
    """

    name: ClassVar[str]
    engine: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def recognises(cls, path: Path) -> bool:
        """Whether ``path`` is a directory of this kind."""

    @abstractmethod
    def float_source(self, path: Path, baseline: str | None) -> str:
        """The float model the candidate is compared with (and an engine directory is loaded
        into), after checking the directory whole.

        Raises:
            ConfigError: no float model is known (pass ``baseline``).
        """

    @abstractmethod
    def load(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        """The candidate's adapter (and the probe report it was made with, if any), loaded with
        ``placement`` (``device``, ``dtype``, ``allow_pickle``) in :meth:`run_dtype`."""

    def inputs(self, path: Path) -> list[str]:
        """The paths evaluating the candidate reads (so that a report may go beside them, never
        over them)."""
        return [str(path)]

    def policy_file(self, path: Path) -> Path | None:
        """The candidate's ``policy.yaml``, if it has one."""
        return None

    def run_dtype(self, path: Path, dtype: str) -> str:
        """The dtype the candidate's pipeline runs in when ``dtype`` is asked for."""
        return dtype


class _EngineDirectory(CandidateFormat):
    """An engine's directory: ours sits in ``OUT/export/<fmt>``, beside OUT's policy and
    ``quant/`` (which records the float source)."""

    engine = True

    def inputs(self, path: Path) -> list[str]:
        holder = CalibrateOutput.holding(path)
        return [str(path), *([str(holder.policy), str(holder.quant)] if holder else [])]

    def policy_file(self, path: Path) -> Path | None:
        holder = CalibrateOutput.holding(path)
        return holder.policy if holder else None


# class -> its instance, in registration order (the order they are tried in)
_FORMATS: dict[type[CandidateFormat], CandidateFormat] = {}


def register_format(cls: _F) -> _F:
    """Class decorator: add a directory format (tried after those registered before it).

    Raises:
        ConfigError: a format of that name is registered already.
    """
    if any(f.name == cls.name for f in _FORMATS.values()):
        raise ConfigError(f"candidate format {cls.name!r} is registered already")
    _FORMATS[cls] = cls()
    return cls


def recognise(path: Path) -> CandidateFormat:
    """What ``path`` is: the first registered format that recognises it, else a model source
    (a model directory, or a named source such as ``zoo:NAME``)."""
    for fmt in _FORMATS.values():
        if fmt.recognises(path):
            return fmt
    return ModelSource()


@register_format
class MindIESDDirectory(_EngineDirectory):
    """``export/mindie-sd``: a ``quant_model_description_<type>.json`` per component, loaded
    through MindIE-SD's Linear in the dtype the engine runs."""

    name = "mindie-sd"

    @classmethod
    def recognises(cls, path: Path) -> bool:
        from opsnn_quant.formats.mindie_sd.reader import is_mindie_sd_dir

        return is_mindie_sd_dir(path)

    def float_source(self, path: Path, baseline: str | None) -> str:
        from opsnn_quant.formats.checkpoint import read_description
        from opsnn_quant.formats.mindie_sd.reader import component_descriptions, read_mindie_sd

        for desc in component_descriptions(path).values():  # every file check, up front
            read_mindie_sd(desc)
        holder = CalibrateOutput.holding(path)
        recorded = read_description(holder.quant).get("source_model") if holder else None
        if not (baseline or recorded):
            raise ConfigError(
                f"{path} is a MindIE-SD directory: pass --baseline, the float model it was "
                "quantized from"
            )
        return str(baseline or recorded)

    def run_dtype(self, path: Path, dtype: str) -> str:
        return run_dtype("mindie-sd", dtype)

    def load(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        import torch

        from opsnn_quant.formats.mindie_sd.reader import apply_mindie_sd_dir
        from opsnn_quant.models import load_adapter

        adapter = load_adapter(family, baseline or self.float_source(path, None), **placement)
        # mindiesd.quantize per component, in the dtype the pipeline runs
        apply_mindie_sd_dir(adapter.model, path, dtype=getattr(torch, placement["dtype"]))
        return adapter, None


@register_format
class AscendV1Directory(_EngineDirectory):
    """An AscendV1 directory (ours under ``export/ascendv1``, or msModelSlim's), loaded into its
    float model with the engines' arithmetic."""

    name = "ascendv1"

    @classmethod
    def recognises(cls, path: Path) -> bool:
        from opsnn_quant.formats.ascendv1.candidate import looks_ascendv1

        return looks_ascendv1(path)

    def float_source(self, path: Path, baseline: str | None) -> str:
        from opsnn_quant.formats.ascendv1.candidate import (
            check_ascendv1_candidate,
            recorded_source,
        )

        check_ascendv1_candidate(path)  # whole (every header, every tensor) before output
        return self._source(path, baseline or recorded_source(path))

    @staticmethod
    def _source(path: Path, source: str | None) -> str:
        if not source:
            raise ConfigError(
                f"{path} is an AscendV1 directory: pass --baseline, the float model it was "
                "quantized from"
            )
        return str(source)

    def load(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        from opsnn_quant.formats.ascendv1.candidate import load_ascendv1_candidate, recorded_source

        source = self._source(path, baseline or recorded_source(path))
        return load_ascendv1_candidate(path, source, family, **placement), None


@register_format
class CalibrateOutputDirectory(CandidateFormat):
    """Our calibrate output: the float source recorded in ``quant/``, our quantized modules
    loaded from it, its ``probe.json`` and ``policy.yaml`` beside."""

    name = "calibrate-output"

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
        from opsnn_quant.policy.targets import get_target

        policy = CalibrateOutput(path).policy
        target = get_target(PrecisionPolicy.load(policy).target) if policy.is_file() else None
        return run_dtype(target, dtype)

    def load(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        from opsnn_quant.formats.checkpoint import load_quantized, read_description
        from opsnn_quant.models import load_adapter
        from opsnn_quant.probe.report import SensitivityReport

        calib = CalibrateOutput(path)
        source = str(read_description(calib.quant).get("source_model") or "")
        if not source:
            raise ConfigError(f"{calib.quant}/description.json names no source model")
        adapter = load_adapter(family, source, **placement)
        load_quantized(adapter.model, calib.quant)
        sensitivity = SensitivityReport.load(calib.probe) if calib.probe.is_file() else None
        return adapter, sensitivity


class ModelSource(CandidateFormat):
    """Anything else: a model source (a model directory without ``quant/``, or ``zoo:NAME``),
    loaded as is, e.g. to evaluate the float model cast to fp16. Never registered: the
    fallback."""

    name = "model"

    @classmethod
    def recognises(cls, path: Path) -> bool:
        return True

    def float_source(self, path: Path, baseline: str | None) -> str:
        return baseline or str(path)

    def load(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        from opsnn_quant.models import load_adapter

        return load_adapter(family, str(path), **placement), None


def load_candidate(
    out_dir: Path,
    family: str | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    baseline: str | None = None,
    allow_pickle: bool = False,
) -> tuple[ModelAdapter, SensitivityReport | None]:
    """The candidate at ``out_dir``, whatever it is (:func:`recognise`), in the dtype its
    engine runs (:meth:`CandidateFormat.run_dtype`); an engine directory is loaded into the
    float ``baseline`` (default: the source our export recorded). ``allow_pickle``: the float
    model may have pickle weights only (see :func:`~opsnn_quant.models.load_adapter`).

    Raises:
        ConfigError: an engine directory without a known float model (pass ``baseline``).
        AscendV1Error: an AscendV1 directory that breaks the format's contract.
        ModelLoadError: a float model that cannot be loaded (pickle-only weights without
            ``allow_pickle`` included).
    """
    fmt = recognise(out_dir)
    placement = {"device": device, "dtype": fmt.run_dtype(out_dir, dtype),
                 "allow_pickle": allow_pickle}  # fmt: skip
    return fmt.load(out_dir, family, baseline, placement)


def run_dtype(target: Target | str | None, dtype: str) -> str:
    """The dtype a pipeline whose int8 modules ``target``'s engine runs (or the engine named)
    runs in: ``dtype``, except that MindIE-SD runs its Linears in ``float16`` or ``bfloat16``
    and returns that dtype (mindiesd 3.1.0 ``quantization/layer.py`` 347-363,
    ``QuantConfig.dtype`` default bfloat16), so its whole pipeline runs in ``dtype`` when it is
    one of those, else in bfloat16."""
    engine = target if isinstance(target, str) or target is None else target.engine
    if engine != "mindie-sd" or dtype in ("float16", "bfloat16"):
        return dtype
    return "bfloat16"


def cast_adapter(adapter: ModelAdapter, dtype: torch.dtype) -> None:
    """Run the adapter's float modules in ``dtype`` (int8 buffers of quantized modules stay)."""
    from opsnn_quant.quant.modules import is_quant_module

    for module in adapter.model.modules():
        if is_quant_module(module):
            continue
        for _name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_floating_point():
                module._buffers[name] = b.to(dtype)
