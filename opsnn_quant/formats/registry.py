"""One table of every export format: what it is written from, where it goes, who writes it.

``calibrate`` (a recipe's ``exports``), ``policy export -f`` and ``export-weights -f`` all look a
format up here; nothing dispatches on format names elsewhere. Two kinds:

* ``policy``: a file written from the resolved policy (AMCT, ATC precision files, msModelSlim
  YAML); its handler is ``(fmt, resolved policy, options) -> ExportResult``.
* ``model``: a directory written from the quantized model (AscendV1 weights, MindIE-SD weights,
  ATC graphs); its handler is ``(ModelExportContext, directory) -> ExportOutcome`` (notes, the
  modules written in int8; :mod:`opsnn_quant.formats.model_writers`).

Handlers are named ``"module:function"`` and imported on first use, so that validating a recipe's
``exports`` needs neither torch nor the deploy code. :func:`register_exporter` adds a format (a
team's own engine format, say) to the same table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from opsnn_quant.errors import ConfigError

Kind = Literal["policy", "model"]


@dataclass(frozen=True)
class Exporter:
    """One export format.

    Attributes:
        name: the format's name (``amct-cfg``, ``ascendv1``...).
        kind: ``policy`` (a file from the policy) or ``model`` (a directory from the model).
        output: the file or directory name it takes in a calibrate output's ``export/``.
        handler: ``"module:function"`` that writes it.
    """

    name: str
    kind: Kind
    output: str
    handler: str

    def load(self) -> Callable[..., Any]:
        """The handler function."""
        module, _, func = self.handler.partition(":")
        handler: Callable[..., Any] = getattr(importlib.import_module(module), func)
        return handler


# name -> format, in registration order (register_exporter adds to it)
EXPORTERS: dict[str, Exporter] = {}


def register_exporter(name: str, kind: Kind, output: str, handler: str) -> Exporter:
    """Add export format ``name`` to the table (in order: model exports run in it).

    Raises:
        ConfigError: ``name`` is taken.
    """
    if name in EXPORTERS:
        raise ConfigError(f"export format {name!r} is registered already")
    EXPORTERS[name] = Exporter(name, kind, output, handler)
    return EXPORTERS[name]


def exporter(name: str) -> Exporter:
    """The export format ``name``.

    Raises:
        ConfigError: no such format (the message lists them).
    """
    if name not in EXPORTERS:
        raise ConfigError(f"unknown export format {name!r}; choose one of {', '.join(EXPORTERS)}")
    return EXPORTERS[name]


def exporters(kind: Kind | None = None) -> list[Exporter]:
    """The registered formats (of ``kind``), in registration order."""
    return [e for e in EXPORTERS.values() if kind is None or e.kind == kind]


_POLICY = "opsnn_quant.formats.policy_files"
for _name, _output, _func in (
    ("amct-cfg", "amct.cfg", "amct_cfg"),
    ("amct-eager", "amct_eager.json", "amct_eager"),
    ("atc-keep-dtype", "atc_keep_dtype.cfg", "atc_config"),
    ("atc-customize-dtypes", "atc_customize_dtypes.cfg", "atc_config"),
    ("atc-modify-mixlist", "atc_modify_mixlist.json", "atc_config"),
    ("msmodelslim-v1", "msmodelslim_v1.yaml", "msmodelslim_v1"),
):
    register_exporter(_name, "policy", _output, f"{_POLICY}:{_func}")
register_exporter("ascendv1", "model", "ascendv1", "opsnn_quant.formats.model_writers:ascendv1")
register_exporter("mindie-sd", "model", "mindie-sd", "opsnn_quant.formats.model_writers:mindie_sd")
register_exporter("atc", "model", "atc", "opsnn_quant.formats.model_writers:atc_graphs")
