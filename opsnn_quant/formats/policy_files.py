"""A policy exported to the files Ascend tools read, through the exporter table: one entry point
(:func:`export_policy`); the files an export writes are its result's
(:func:`~opsnn_quant.formats.result.write_export`).

Every exporter takes the module inventory (``{module name: class name}``, model order) because a
policy holds globs, not module lists. Each returns an :class:`ExportResult`: the file text plus
notes on what the format could not express (those modules stay float, never the reverse). The
formats live in their folders: ``amct-cfg`` and ``amct-eager`` in :mod:`opsnn_quant.formats.amct`,
``atc-keep-dtype``, ``atc-customize-dtypes`` and ``atc-modify-mixlist`` in
:mod:`opsnn_quant.formats.atc.precision`, ``msmodelslim-v1`` in
:mod:`opsnn_quant.formats.msmodelslim`.

The model exports of the same table (``ascendv1``, ``atc``) are written from the quantized model,
not from a policy (:mod:`opsnn_quant.formats.ascendv1`): ``calibrate`` writes them into ``export/`` as a recipe's
``exports`` asks, ``opsnn-quant export-weights`` from a calibrate output.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.registry import exporter, exporters
from opsnn_quant.formats.result import ExportResult, PolicyExportOptions
from opsnn_quant.policy.schema import PrecisionPolicy, ResolvedPolicy

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

# Views of the exporter table (opsnn_quant/formats/registry.py), for the recipe's checks and
# the docs: every format, and the file each policy export takes in a calibrate output's export/.
FORMATS: tuple[str, ...] = tuple(e.name for e in exporters())
EXPORT_FILES: dict[str, str] = {e.name: e.output for e in exporters("policy")}


def modules_from_model(model: nn.Module) -> dict[str, str]:
    """Module inventory (name -> class name, model order) from a model, containers included."""
    return {n: type(m).__name__ for n, m in model.named_modules() if n}


def export_policy(
    policy: PrecisionPolicy | ResolvedPolicy,
    fmt: str,
    modules: Mapping[str, str] | None = None,
    *,
    node_map: Mapping[str, Sequence[str]] | None = None,
    node_io: Mapping[str, tuple[str, int, int]] | None = None,
    op_types: Mapping[str, str] | None = None,
    batch_num: int = 1,
) -> ExportResult:
    """Export ``policy`` in format ``fmt``, a policy format of the exporter table
    (:mod:`opsnn_quant.formats.registry`).

    Args:
        policy: the policy resolved against its model (:meth:`PrecisionPolicy.resolved`), or
            a policy with ``modules`` to resolve it against.
        fmt: output format.
        modules: module inventory, name -> class name, in model order (with a
            :class:`PrecisionPolicy` only).
        node_map: module -> ONNX node names (``<model>.nodes.json``) for the ATC formats;
            without it the names torch.onnx.export(dynamo=False) gives are derived.
        node_io: ONNX node -> (op type, inputs, outputs) for ``atc-customize-dtypes``.
        op_types: module class -> Ascend IR OpType for ``atc-modify-mixlist``.
        batch_num: calibration batches for the AMCT formats.

    Raises:
        ConfigError: unknown format, empty inventory, or a rule that matches no module.
    """
    entry = exporter(fmt)
    if isinstance(policy, PrecisionPolicy):
        policy = policy.resolved(modules or {})
    elif modules is not None:
        raise ConfigError("export_policy: a resolved policy carries its module inventory")
    if entry.kind == "model":
        raise ConfigError(
            f"{fmt} is written from the quantized model, not a policy: "
            f"opsnn-quant export-weights OUT -f {fmt}"
        )
    options = PolicyExportOptions(node_map, node_io, op_types, batch_num)
    result: ExportResult = entry.writer()(fmt, policy, options)
    return result
