"""One interface for every format on disk, and the class-keyed table of them.

A :class:`Format` is one format, both ways:

* **write**: a ``policy`` format is a file written from the resolved policy (AMCT, ATC precision
  files, msModelSlim YAML); a ``model`` format is a directory written from the quantized model
  (AscendV1, MindIE-SD, ATC graphs). Its writer is named ``"module:function"`` (:attr:`handler`)
  and imported on first use, so that checking a recipe's ``exports`` needs neither torch nor the
  writers' code. A format writes into the file or the new or empty directory it is given; the
  commands own the output around it and hand a ``model`` writer what the format declares it
  reads (:attr:`root_calls`, :attr:`float_model`, :meth:`stage`, :meth:`left_out`): the
  command layer names no format.
* **read**: a directory a user passes (``evaluate --candidate``, ``export-weights OUT``) is
  recognised by the formats that read (:attr:`read_order`), which say where its float model is,
  what evaluating it reads, and load it as a candidate.

:func:`register_format` adds a class to the table (registration order is the export order);
:mod:`opsnn_quant.formats.registry` registers the built-in ones and is where callers look
formats up. Adding a format is one folder (its ``Format`` class and writer) and one
registration, from inside the package or outside it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from opsnn_quant.errors import ConfigError
from opsnn_quant.quant.engines import Engine

if TYPE_CHECKING:
    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.policy.schema import ResolvedPolicy
    from opsnn_quant.policy.targets import Target
    from opsnn_quant.probe.report import SensitivityReport
    from opsnn_quant.recording import Call

Kind = Literal["policy", "model", "directory"]
RootCalls = Literal["never", "smoothed", "always"]
"""When a ``model`` format's writer reads recorded root calls: ``never``, ``smoothed`` (for a
model with SmoothQuant factors: AscendV1 folds them, traced on the calls) or ``always`` (ATC: the
ONNX graphs' shapes)."""
_F = TypeVar("_F", bound="type[Format]")


class Format:
    """One format on disk (see the module docstring).

    Attributes:
        name: the format's name (``amct-cfg``, ``ascendv1``, ``calibrate-output``...).
        kind: ``policy`` (a file from the policy), ``model`` (a directory from the model) or
            ``directory`` (read only: our own calibrate output).
        output: the file or directory name it takes in a calibrate output's ``export/``.
        handler: ``"module:function"`` that writes it (``policy``: ``(fmt, resolved policy,
            options) -> ExportResult``; ``model``: ``(ModelExportContext, directory) ->
            ExportOutcome``); empty for a format that is only read.
        engine: a candidate of this format runs an engine's int8 arithmetic read from the files
            (not our quantized modules): it is loaded into its float baseline.
        read_order: where it is tried when a directory is recognised (lower first); None: the
            format is never recognised from a directory.
        root_calls: what a ``model`` writer reads of the recorded calls of each root
            (:data:`RootCalls`): the command layer records one call per root for it (``calibrate``
            from its data, ``export-weights`` from ``--data``, which it then requires).
        root_calls_for: what the calls are for (the error that asks for ``--data`` says it).
        float_model: a ``model`` writer reads the float model: ``calibrate`` hands it what
            :meth:`stage` made before quantizing, ``export-weights`` loads the float model.
        stager: ``"module:function"`` that :meth:`stage` runs (empty: nothing is staged).
        attention: a ``model`` export's engine runs no int8 attention: why (the export notes
            the model's int8 attention modules it leaves float with it); empty: no note (it
            runs them, or the format does not say).
    """

    name: ClassVar[str]
    kind: ClassVar[Kind]
    output: ClassVar[str] = ""
    handler: ClassVar[str] = ""
    engine: ClassVar[bool] = False
    read_order: ClassVar[int | None] = None
    root_calls: ClassVar[RootCalls] = "never"
    root_calls_for: ClassVar[str] = ""
    float_model: ClassVar[bool] = False
    stager: ClassVar[str] = ""
    attention: ClassVar[str] = ""

    # ---- write ----------------------------------------------------------------------------

    def needs_root_calls(self, smoothed: bool) -> bool:
        """Whether the ``model`` writer reads one recorded call per root, for a model with
        (``smoothed``) or without SmoothQuant factors."""
        return self.root_calls == "always" or (self.root_calls == "smoothed" and smoothed)

    def left_out(self, target: Target) -> str | None:
        """Why ``calibrate`` does not write this ``model`` format for ``target`` although the
        recipe lists it (a note); None: it writes it."""
        return None

    def stage(
        self,
        adapter: ModelAdapter,
        policy: ResolvedPolicy,
        calls: Mapping[str, Sequence[Call]],
        export_dir: Path,
        say: Callable[[str], None],
    ) -> Any:
        """With :attr:`float_model`: what the writer needs of the float model, made from
        ``adapter.model`` before ``calibrate`` quantizes it (handed to the writer as
        ``ModelExportContext.staged``) by :attr:`stager`, ``(adapter, policy, calls,
        export_dir, *, say)``; it may write under ``export_dir`` where its writer picks it
        up. None: nothing to stage."""
        if not self.stager:
            return None
        return _resolve(self.stager)(adapter, policy, calls, export_dir, say=say)

    def writer(self) -> Callable[..., Any]:
        """The function that writes this format.

        Raises:
            ConfigError: the format is only read.
        """
        if not self.handler:
            raise ConfigError(f"format {self.name!r} is read, not written")
        return _resolve(self.handler)

    # ---- read -----------------------------------------------------------------------------

    @classmethod
    def recognises(cls, path: Path) -> bool:
        """Whether ``path`` is a directory of this format."""
        return False

    def float_source(self, path: Path, baseline: str | None) -> str:
        """The float model the candidate at ``path`` is compared with (and an engine's directory
        is loaded into), after checking the directory whole.

        Raises:
            ConfigError: no float model is known (pass ``baseline``), or the format is not read.
        """
        raise ConfigError(f"format {self.name!r} is written, not read as a candidate")

    def load_candidate(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        """The candidate's adapter (and the probe report it was made with, if any), loaded with
        ``placement`` (``device``, ``dtype``, ``allow_pickle``)."""
        raise ConfigError(f"format {self.name!r} is written, not read as a candidate")

    def inputs(self, path: Path) -> list[str]:
        """The paths evaluating the candidate reads (so that a report may go beside them, never
        over them)."""
        return [str(path)]

    def own_model(self, path: Path) -> str | None:
        """The model the candidate at ``path`` is itself, loaded as it is (whose config files
        the suite's settings must fit as its float source's do); None: it is loaded from or
        into its float source."""
        return None

    def policy_file(self, path: Path) -> Path | None:
        """The candidate's ``policy.yaml``, if it has one."""
        return None

    def run_dtype(self, path: Path, dtype: str) -> str:
        """The dtype the candidate's pipeline runs in when ``dtype`` is asked for (read before
        any model loads).

        Raises:
            CheckpointError: the format's engine refuses the files in ``dtype`` (one line).
        """
        return dtype


def _resolve(name: str) -> Callable[..., Any]:
    """The function ``"module:function"`` names (imported on first use)."""
    module, _, func = name.partition(":")
    handler: Callable[..., Any] = getattr(importlib.import_module(module), func)
    return handler


# class -> its instance, in registration order (the export order)
TABLE: dict[type[Format], Format] = {}


def register_format(cls: _F) -> _F:
    """Class decorator: add a format to the table.

    Raises:
        ConfigError: a format of that name is registered already.
    """
    if any(f.name == cls.name for f in TABLE.values()):
        raise ConfigError(f"format {cls.name!r} is registered already")
    TABLE[cls] = cls()
    return cls


class ModelSource(Format):
    """Anything no format recognises: a model source (a model directory without ``quant/``, or
    ``zoo:NAME``), loaded as is, e.g. to evaluate the float model cast to fp16. Never
    registered: the fallback of :func:`opsnn_quant.formats.registry.recognise`."""

    name = "model"
    kind = "directory"

    def float_source(self, path: Path, baseline: str | None) -> str:
        return baseline or str(path)

    def own_model(self, path: Path) -> str | None:
        return str(path)

    def load_candidate(
        self, path: Path, family: str | None, baseline: str | None, placement: dict[str, Any]
    ) -> tuple[ModelAdapter, SensitivityReport | None]:
        from opsnn_quant.models import load_adapter

        return load_adapter(family, str(path), **placement), None


def run_dtype(runs: Target | Engine | None, dtype: str) -> str:
    """The dtype a pipeline whose int8 modules ``runs`` (a target's engine, or an engine) runs
    runs in when ``dtype`` is asked for: ``dtype``, unless the engine's Linears take only
    some (:meth:`~opsnn_quant.quant.engines.Engine.run_dtype`: MindIE-SD runs its Linears in
    ``float16`` or ``bfloat16`` and returns that dtype, mindiesd 3.1.0
    ``quantization/layer.py`` 347-363, ``QuantConfig.dtype`` default bfloat16)."""
    if runs is None:
        return dtype
    engine = runs if isinstance(runs, Engine) else runs.engine_def
    return engine.run_dtype(dtype)
