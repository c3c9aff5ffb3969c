"""ONNX graphs for ATC through torch's TorchScript exporter (``dynamo=False``): seconds, not
minutes.

The dynamo exporter behind :func:`opsnn_quant.formats.atc.onnx.export.export_onnx` takes ~40 s for
the demo UNet; the TorchScript one ~4 s. Here each marked module (a frozen quantized one, or
the float module a policy will quantize) becomes the same one-node marker (``QuantModule(x,
module, rank)`` of :data:`~opsnn_quant.formats.atc.onnx.markers.DOMAIN`) through an autograd
function's ``symbolic``, and :mod:`opsnn_quant.formats.atc.onnx.export`'s own rewrite turns every
marker into its standard QDQ nodes (the same bytes as ``export_onnx`` writes) or into the float
module's own op. ATC gets each root twice, float and QDQ: the float graph is traced with markers
where the policy quantizes, and its trace, kept (:attr:`ExportedGraph.markers`), gives the QDQ
graph once the modules are quantized (:func:`write_from_markers`): one trace per root, not two
(the trace and the exporter's passes were 85 % of the export; the graphs come out the same).

Node names are the TorchScript exporter's: ``/<scope>/.../<OpType>``, a scope per module
(:func:`opsnn_quant.formats.atc.precision.torch_scope`); :func:`node_map` maps them back to modules
for the ``--keep_dtype``/``--customize_dtypes`` files.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from opsnn_quant.formats.atc.onnx.files import (
    ONNX_EXTERNAL_DATA_BYTES,
    SPILL_PREFIX,
    save_onnx_atomic,
    unspill,
)
from opsnn_quant.formats.atc.onnx.markers import DOMAIN, MARKER_OP
from opsnn_quant.formats.atc.precision import torch_scope
from opsnn_quant.quant.modules import QuantConv2d, QuantModule, im2col_conv, set_submodule

KEEP_MARKERS_BYTES = 256 * 2**20
"""A trace kept for a second graph (:attr:`ExportedGraph.markers`) holds at most this much: it
carries the weights of every module not marked, in memory until the second graph is written."""


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str, rank: int, shape: list[int]) -> torch.Tensor:
        return x.new_zeros(shape)

    @staticmethod
    def symbolic(g: Any, x: Any, name: str, rank: int, shape: list[int]) -> Any:
        out = g.op(f"{DOMAIN}::{MARKER_OP}", x, module_s=name, rank_i=rank)
        out.setType(x.type().with_sizes(shape))
        return out


def markable(module: nn.Module) -> bool:
    """Whether a module can stand in a trace as a marker: a frozen quantized module, or a float
    Linear / Conv2d of the kinds QuantLinear / QuantConv2d take (groups 1, zero padding)."""
    return isinstance(module, QuantModule) or type(module) is nn.Linear or im2col_conv(module)


class _Marker(nn.Module):
    def __init__(self, name: str, module: nn.Module) -> None:
        super().__init__()
        # geometry only: the module itself (its weights) stays out of the traced graph
        self.qname = name
        self.n_out = (
            module.out_n
            if isinstance(module, QuantModule)
            else int(module.get_parameter("weight").shape[0])
        )
        self.conv: tuple[tuple[int, int], ...] | None = None
        if isinstance(module, QuantConv2d | nn.Conv2d):
            geometry = (module.kernel_size, module.stride, module.padding, module.dilation)
            self.conv = cast(tuple[tuple[int, int], ...], geometry)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv is not None:
            (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.conv
            oh = (x.shape[-2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
            ow = (x.shape[-1] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
            shape = [x.shape[0], self.n_out, oh, ow]
        else:
            shape = [*x.shape[:-1], self.n_out]
        return _Mark.apply(x, self.qname, x.dim(), [int(d) for d in shape])


@dataclass(frozen=True)
class ExportedGraph:
    """One written graph.

    Attributes:
        proto: its ModelProto (weights past 2 GiB left in ``<name>.data``).
        nodes: marked module -> the names of its nodes.
        markers: the trace before its markers were rewritten (``keep_markers``; None when not
            asked, or over :data:`KEEP_MARKERS_BYTES`): :func:`write_from_markers` writes another
            graph of the same model from it without tracing again.
    """

    proto: Any
    nodes: dict[str, list[str]]
    markers: Any | None = None


def export_graph(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    path: Path,
    opset: int = 17,
    input_names: list[str] | None = None,
    external_data_bytes: int = ONNX_EXTERNAL_DATA_BYTES,
    *,
    marked: Mapping[str, nn.Module] | None = None,
    keep_markers: bool = False,
) -> ExportedGraph:
    """Export ``model`` (float, or holding frozen quantized modules written as QDQ) to ``path``.

    ``input_names`` name the graph inputs (ATC's ``--input_shape`` cannot take the exporter's
    own ``onnx::Op_0`` names: ``:`` separates a name from its dims). A graph of
    ``external_data_bytes`` or more (an SD 1.5 UNet in fp32: 3.4 GB, past protobuf's 2 GiB) is
    written with its weights in ``<name>.data`` and checked from the file.

    Args:
        marked: the modules (names in ``model``) traced as markers and written by
            :func:`~opsnn_quant.formats.atc.onnx.export.rewrite_markers` (each :func:`markable`):
            quantized ones as QDQ, float ones as their own op. Default: the quantized modules.
        keep_markers: keep the trace with its markers (:attr:`ExportedGraph.markers`).
    """
    if marked is None:
        marked = {n: m for n, m in model.named_modules() if isinstance(m, QuantModule)}
    with _traced(model, inputs, opset, input_names, marked) as (proto, external_from):
        markers = None
        if keep_markers and external_from is None and proto.ByteSize() < KEEP_MARKERS_BYTES:
            markers = type(proto)()
            markers.CopyFrom(proto)
        nodes = _finish(proto, marked, path, external_data_bytes, external_from)
    return ExportedGraph(proto, nodes, markers)


def write_from_markers(
    markers: Any,
    marked: Mapping[str, nn.Module],
    path: Path,
    external_data_bytes: int = ONNX_EXTERNAL_DATA_BYTES,
) -> ExportedGraph:
    """Another graph of a kept trace (:attr:`ExportedGraph.markers`), its markers written from
    ``marked`` (the same names as traced; e.g. the quantized modules that replaced the float
    ones). The same bytes as :func:`export_graph` of that model, without tracing it again."""
    proto = type(markers)()
    proto.CopyFrom(markers)
    return ExportedGraph(proto, _finish(proto, marked, path, external_data_bytes, None))


@contextmanager
def _traced(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    opset: int,
    input_names: list[str] | None,
    marked: Mapping[str, nn.Module],
) -> Iterator[tuple[Any, Path | None]]:
    """The TorchScript exporter's graph of ``model`` with markers for ``marked``, and the
    directory of its weight files when it wrote them apart (past 2 GiB)."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, m in marked.items():
                set_submodule(model, name, _Marker(name, m))
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
                torch.onnx.export(model, inputs, f"{tmp}/graph.onnx", dynamo=False,
                                  opset_version=opset, input_names=input_names,
                                  output_names=["output"],
                                  custom_opsets={DOMAIN: 1} if marked else None)  # fmt: skip
        finally:
            for name, m in marked.items():
                set_submodule(model, name, m)
        # Past 2 GiB the exporter leaves each weight in a file of its own beside the graph:
        # they are streamed into <name>.data, not loaded (a second copy of an SD UNet's 3.4 GB).
        proto = onnx.load(f"{tmp}/graph.onnx", load_external_data=False)
        external = any(
            t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer
        )
        yield proto, Path(tmp) if external else None


def _finish(
    proto: Any,
    marked: Mapping[str, nn.Module],
    path: Path,
    external_data_bytes: int,
    external_from: Path | None,
) -> dict[str, list[str]]:
    """Rewrite the markers, check and save; returns module -> its nodes.

    The weights the rewrite adds go to files first (``rewrite_markers(spill=...)``): a graph of
    ``external_data_bytes`` or more streams them into ``<name>.data`` (an SD 1.5 UNet's float
    graph held its 3.4 GB of weights in the proto, then wrote them: calibrate's peak memory);
    a smaller one takes them back, the same proto as a rewrite in memory.
    """
    import onnx

    from opsnn_quant.formats.atc.onnx.export import rewrite_markers

    with tempfile.TemporaryDirectory() as own:
        spill = external_from or Path(own)
        nodes, _ = rewrite_markers(onnx, proto, marked, spill=spill)
        spilled = sum(f.stat().st_size for f in spill.glob(f"{SPILL_PREFIX}*.bin"))
        large = external_from is not None or proto.ByteSize() + spilled >= external_data_bytes
        if not large:
            unspill(onnx, proto, spill)
            onnx.checker.check_model(proto)
        save_onnx_atomic(proto, path, external_data_bytes=external_data_bytes,
                         external_from=spill if large else None)  # fmt: skip
    if large:  # beyond 2 GiB the checker reads the file (weights in <name>.data beside it)
        onnx.checker.check_model(str(path))
    return nodes


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
