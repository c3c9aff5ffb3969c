"""The table of every format (:mod:`opsnn_quant.formats.base`), with the built-in ones
registered, and where callers look them up.

``calibrate`` (a recipe's ``exports``), ``policy export -f`` and ``export-weights -f`` find a
format to write by name (:func:`exporter`, :func:`exporters`); ``evaluate --candidate`` and
``export-weights OUT`` find what a directory is (:func:`recognise`). Nothing dispatches on
format names elsewhere: the commands read what each format declares (its kind, output, the root
calls and float model its writer reads, the targets it is left out for). The built-in formats,
in the export order: the policy files (AMCT, ATC's precision files, msModelSlim YAML), then the
model directories (AscendV1, MindIE-SD, ATC graphs), each writer in its format's folder; our
calibrate output is read only. :func:`register_format` (a class) or :func:`register_exporter`
(a name and its writer) adds a team's own, from inside the package or outside it.
"""

from __future__ import annotations

from pathlib import Path

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.amct.format import AMCTConfig, AMCTEager
from opsnn_quant.formats.ascendv1.format import AscendV1Format
from opsnn_quant.formats.atc.format import (
    ATCCustomizeDtypes,
    ATCGraphsFormat,
    ATCKeepDtype,
    ATCModifyMixlist,
)
from opsnn_quant.formats.base import TABLE, Format, Kind, ModelSource, register_format
from opsnn_quant.formats.calibrate_output import CalibrateOutputFormat
from opsnn_quant.formats.mindie_sd.format import MindIESDFormat
from opsnn_quant.formats.msmodelslim.format import MsModelSlimV1

__all__ = [
    "TABLE",
    "Format",
    "Kind",
    "ModelSource",
    "exporter",
    "exporters",
    "recognise",
    "register_exporter",
    "register_format",
]

for _cls in (AMCTConfig, AMCTEager, ATCKeepDtype, ATCCustomizeDtypes, ATCModifyMixlist,
             MsModelSlimV1, AscendV1Format, MindIESDFormat, ATCGraphsFormat,
             CalibrateOutputFormat):  # fmt: skip
    register_format(_cls)


def register_exporter(name: str, kind: Kind, output: str, handler: str) -> Format:
    """Add a written format by its name and writer (``"module:function"``); see
    :class:`~opsnn_quant.formats.base.Format` for the writer's arguments.

    Raises:
        ConfigError: ``name`` is taken.
    """
    attrs = {"name": name, "kind": kind, "output": output, "handler": handler,
             "__doc__": f"Export format {name!r} (registered by name)."}  # fmt: skip
    cls = register_format(type(f"Format_{name}", (Format,), attrs))
    return TABLE[cls]


def exporter(name: str) -> Format:
    """The written format ``name``.

    Raises:
        ConfigError: no such format (the message lists them).
    """
    for fmt in exporters():
        if fmt.name == name:
            return fmt
    names = ", ".join(f.name for f in exporters())
    raise ConfigError(f"unknown export format {name!r}; choose one of {names}")


def exporters(kind: Kind | None = None) -> list[Format]:
    """The written formats (of ``kind``), in registration order (model exports run in it)."""
    return [f for f in TABLE.values() if f.handler and (kind is None or f.kind == kind)]


def recognise(path: Path) -> Format:
    """What the directory ``path`` is: the first format (by ``read_order``) that recognises it,
    else a model source (a model directory, or a named source such as ``zoo:NAME``)."""
    readers = sorted((f for f in TABLE.values() if f.read_order is not None),
                     key=lambda f: f.read_order or 0)  # fmt: skip
    for fmt in readers:
        if fmt.recognises(path):
            return fmt
    return ModelSource()
