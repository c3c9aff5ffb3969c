"""Markers: how :func:`~opsnn_quant.formats.atc.onnx.export.export_onnx` gets one ONNX node per module.

While ``torch.onnx.export`` runs, each frozen quantized module is swapped for a :class:`_Marker`
whose custom op (``opsnn_quant_export::module_marker``, only its output shape matters) the
exporter translates into one ``QuantModule(x, module, rank)`` node of the private
:data:`DOMAIN`; :mod:`opsnn_quant.formats.atc.onnx.export` then rewrites each such node into standard ONNX nodes.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from opsnn_quant.errors import ShapeError
from opsnn_quant.formats.atc.onnx.info import require_onnx
from opsnn_quant.quant.modules import QuantConv2d, QuantModule, set_submodule

DOMAIN, MARKER_OP = "opsnn_quant.export", "QuantModule"


def _marker_shape(x: torch.Tensor, spec: Sequence[int]) -> list[Any]:
    """Output shape of a marked module; spec = [N] (Linear) or [N, kh, kw, sh, sw, ph, pw, dh, dw]."""
    if len(spec) == 1:
        return [*x.shape[:-1], spec[0]]
    n, kh, kw, sh, sw, ph, pw, dh, dw = spec
    oh = (x.shape[-2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (x.shape[-1] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return [x.shape[0], n, oh, ow]


@torch.library.custom_op("opsnn_quant_export::module_marker", mutates_args=())
def _module_marker(x: torch.Tensor, module: str, spec: list[int]) -> torch.Tensor:
    """Stand-in for a quantized module while exporting; only its output shape matters."""
    return x.new_zeros(_marker_shape(x, spec))


@_module_marker.register_fake
def _module_marker_fake(x: torch.Tensor, module: str, spec: list[int]) -> torch.Tensor:
    return x.new_empty(_marker_shape(x, spec))


class _Marker(nn.Module):
    """Takes one quantized module's place during the export."""

    def __init__(self, name: str, m: QuantModule[Any]) -> None:
        super().__init__()
        self.qname, self.spec = name, [m.out_n]
        if isinstance(m, QuantConv2d):
            self.spec += [*m.kernel_size, *m.stride, *m.padding, *m.dilation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise ShapeError(
                f"export_onnx: module '{self.qname}' receives {x.dtype}; export the model in "
                "float32 (QuantizeLinear below opset 19 takes float32 only)"
            )
        return cast(
            torch.Tensor, torch.ops.opsnn_quant_export.module_marker(x, self.qname, self.spec)
        )


def _translation_table() -> dict[Any, Any]:
    """The exporter's translation of the marker: one ``QuantModule(x, module, rank)`` node."""
    onnx, onnxscript = require_onnx("onnx", "onnxscript")
    defs = onnx.defs
    if not defs.has(MARKER_OP, DOMAIN):  # onnxscript builds nodes only for ops with a schema
        attr, param = defs.OpSchema.Attribute, defs.OpSchema.FormalParameter
        defs.register_schema(defs.OpSchema(
            MARKER_OP, DOMAIN, 1, inputs=[param("x", "T")], outputs=[param("y", "T")],
            type_constraints=[("T", ["tensor(float)"], "float32")],
            attributes=[attr("module", defs.OpSchema.AttrType.STRING, "module name"),
                        attr("rank", defs.OpSchema.AttrType.INT, "rank of x")],
        ))  # fmt: skip
    opset = onnxscript.values.Opset(DOMAIN, 1)

    def translate(x: Any, module: str, spec: Sequence[int]) -> Any:
        return opset.QuantModule(x, module=module, rank=len(x.shape))

    return {torch.ops.opsnn_quant_export.module_marker.default: translate}


def export_with_markers(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    qmods: dict[str, QuantModule[Any]],
    opset: int,
) -> Any:
    """ModelProto of ``model`` with markers in place of the quantized modules."""
    table = _translation_table()
    was_training = model.training
    try:
        for name, mod in qmods.items():
            set_submodule(model, name, _Marker(name, mod))
        model.eval()
        with torch.no_grad():
            program = torch.onnx.export(
                model, example_inputs, dynamo=True, opset_version=opset,
                custom_translation_table=table, verbose=False,
            )  # fmt: skip
    finally:
        for name, mod in qmods.items():
            set_submodule(model, name, mod)
        model.train(was_training)
    assert program is not None  # dynamo=True always returns the program
    return program.model_proto


def float_module_nodes(graph: Any) -> dict[str, list[str]]:
    """Innermost module -> names of the exporter's nodes, from their name-scope metadata (lost
    when converting below opset 18); marker nodes are left out."""
    out: dict[str, list[str]] = {}
    for node in graph.node:
        scopes = {p.key: p.value for p in node.metadata_props}.get("pkg.torch.onnx.name_scopes")
        if scopes and node.domain != DOMAIN:
            names = ast.literal_eval(scopes)  # ['', 'blocks.0', 'blocks.0.fc', 'op name']
            out.setdefault(names[-2] if len(names) >= 2 else "", []).append(node.name)
    return out
