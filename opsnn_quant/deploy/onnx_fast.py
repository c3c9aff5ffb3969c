"""ONNX graphs for ATC through torch's TorchScript exporter (``dynamo=False``): seconds, not
minutes.

The dynamo exporter behind :func:`opsnn_quant.quant.onnx_export.export_onnx` takes ~40 s for
the demo UNet; the TorchScript one ~4 s. For ATC we export each root twice (float and QDQ), so
here each frozen quantized module becomes the same one-node marker (``QuantModule(x, module,
rank)`` of :data:`~opsnn_quant.quant.onnx_markers.DOMAIN`) through an autograd function's
``symbolic``, and :mod:`opsnn_quant.quant.onnx_export`'s own rewrite turns every marker into its
standard QDQ nodes: the QDQ part is the same bytes as ``export_onnx`` writes.

Node names are the TorchScript exporter's: ``/<scope>/.../<OpType>``, a scope per module
(:func:`opsnn_quant.policy.export_atc.torch_scope`); :func:`node_map` maps them back to modules
for the ``--keep_dtype``/``--customize_dtypes`` files.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from opsnn_quant.onnx_io import ONNX_EXTERNAL_DATA_BYTES, save_onnx_atomic
from opsnn_quant.policy.export_atc import torch_scope
from opsnn_quant.quant.modules import QuantConv2d, QuantModule, set_submodule
from opsnn_quant.quant.onnx_markers import DOMAIN, MARKER_OP


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str, rank: int, shape: list[int]) -> torch.Tensor:
        return x.new_zeros(shape)

    @staticmethod
    def symbolic(g: Any, x: Any, name: str, rank: int, shape: list[int]) -> Any:
        out = g.op(f"{DOMAIN}::{MARKER_OP}", x, module_s=name, rank_i=rank)
        out.setType(x.type().with_sizes(shape))
        return out


class _Marker(nn.Module):
    def __init__(self, name: str, module: QuantModule[Any]) -> None:
        super().__init__()
        self.qname, self.module = name, module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if isinstance(m, QuantConv2d):
            oh, ow = (
                (x.shape[-2 + i] + 2 * m.padding[i] - m.dilation[i] * (m.kernel_size[i] - 1) - 1)
                // m.stride[i]
                + 1
                for i in range(2)
            )
            shape = [x.shape[0], m.out_n, oh, ow]
        else:
            shape = [*x.shape[:-1], m.out_n]
        return _Mark.apply(x, self.qname, x.dim(), [int(d) for d in shape])


def export_graph(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    path: Path,
    opset: int = 17,
    input_names: list[str] | None = None,
    external_data_bytes: int = ONNX_EXTERNAL_DATA_BYTES,
) -> tuple[Any, dict[str, list[str]]]:
    """Export ``model`` (float, or holding frozen quantized modules written as QDQ) to ``path``.

    ``input_names`` name the graph inputs (ATC's ``--input_shape`` cannot take the exporter's
    own ``onnx::Op_0`` names: ``:`` separates a name from its dims). A graph of
    ``external_data_bytes`` or more (an SD 1.5 UNet in fp32: 3.4 GB, past protobuf's 2 GiB) is
    written with its weights in ``<name>.data`` and checked from the file.

    Returns:
        ``(ModelProto, module -> node names of its quantized modules)``.
    """
    import onnx

    from opsnn_quant.quant.onnx_export import _rewrite_markers

    qmods = {n: m for n, m in model.named_modules() if isinstance(m, QuantModule)}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, m in qmods.items():
                set_submodule(model, name, _Marker(name, m))
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
                torch.onnx.export(model, inputs, f"{tmp}/graph.onnx", dynamo=False,
                                  opset_version=opset, input_names=input_names,
                                  output_names=["output"],
                                  custom_opsets={DOMAIN: 1} if qmods else None)  # fmt: skip
        finally:
            for name, m in qmods.items():
                set_submodule(model, name, m)
        # Past 2 GiB the exporter leaves each weight in a file of its own beside the graph:
        # they are streamed into <name>.data, not loaded (a second copy of an SD UNet's 3.4 GB).
        proto = onnx.load(f"{tmp}/graph.onnx", load_external_data=False)
        external = any(
            t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer
        )
        quant_nodes, _ = _rewrite_markers(onnx, proto, qmods, False)
        large = external or proto.ByteSize() >= external_data_bytes
        if not large:
            onnx.checker.check_model(proto)
        save_onnx_atomic(proto, path, external_data_bytes=external_data_bytes,
                         external_from=Path(tmp) if external else None)  # fmt: skip
    if large:  # beyond 2 GiB the checker reads the file (weights in <name>.data beside it)
        onnx.checker.check_model(str(path))
    return proto, quant_nodes


def node_map(
    proto: Any, modules: Mapping[str, str], wrapper: str, root: str, quant: Mapping[str, list[str]]
) -> dict[str, list[str]]:
    """Module name (policy names: ``<root>.<name>``) -> node names of an exported graph.

    The exporter's ``/<scope>/<Op>`` names tell the innermost module of a node; ``wrapper`` is the
    attribute holding the root in the exported module (its first scope). ``quant`` maps the
    wrapper's module names of quantized modules to their nodes.
    """
    prefix = f"{root}." if root else ""
    inner = {n[len(prefix) :]: t for n, t in modules.items() if n.startswith(prefix) or not root}
    scopes = {f"/{wrapper}{torch_scope(n, inner) if n else ''}": n for n in inner}
    out: dict[str, list[str]] = {}
    for node in proto.graph.node:
        parts = node.name.split("/")
        for i in range(len(parts) - 1, 1, -1):
            name = scopes.get("/".join(parts[:i]))
            if name is not None:
                out.setdefault(prefix + name if name else root, []).append(node.name)
                break
    for key, nodes in quant.items():
        rest = key[len(wrapper) + 1 :] if key != wrapper else ""
        out[".".join(p for p in (root, rest) if p)] = list(nodes)
    return out
