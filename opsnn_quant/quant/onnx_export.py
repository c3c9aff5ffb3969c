"""ONNX export of quantized models as standard QDQ graphs that ONNX Runtime (and ATC) run.

Route: ``torch.onnx.export`` (the dynamo exporter, torch's default) runs with every frozen
QuantLinear/QuantConv2d temporarily replaced by a marker module whose custom op becomes one node of
a private domain; :mod:`onnx` then rewrites each marker into standard nodes built from the module's
frozen buffers. The exporter handles the rest of the model (attention, norms, ...), the QDQ
subgraph is ours byte for byte (no optimizer folds a DequantizeLinear into a float weight), and
every node name is known. Names: nodes ``<module>/<role>``, initializers ``<module>.<role>``.

How each scheme is written (N outputs, K inputs; Linear inputs of rank != 2 are reshaped to
(-1, K) around the Gemm, back with a ``Shape``-derived shape):

* ``qdq_static`` (w8a8): ``QuantizeLinear(s_x, zp = offset)`` -> ``DequantizeLinear`` ->
  ``Gemm(transB=1)`` / ``Conv`` with ``B = DQ(int8 W (N, K), s_w (N,), zp 0, axis 0)`` and
  ``C = DQ(int32 bias, s_x * s_w, axis 0)``: the int32 bias is Ascend's ``quant_bias`` without the
  asymmetric ``-offset * sum(w_q)`` fold (ONNX subtracts the zero point in the DQ instead). A
  float bias on Gemm stops ORT's QDQ fusion; the int32 one lets it run QGemm (int8 kernels).
* ``qdq_static_smoothquant``: the same, behind ``Mul(x, 1 / s_j)``, the form ORT's own
  quantization tool and AMCT use. Ascend multiplies by ``1 / (s_x * s_j)`` in one step, so a
  rare activation may land one int8 step apart.
* ``dynamic_per_token`` (w8a8_dynamic Linear): DynamicQuant spelled out in standard ops, exact:
  ``[Mul(smooth)]`` -> ``ReduceMax(Abs)/127`` -> ``Div, Round, Clip, Cast(int8)`` ->
  ``MatMulInteger(int8 W^T (K, N))`` -> ``Cast`` -> ``Mul(s_w)`` -> ``Mul(s_t)`` -> ``Add(bias)``.
  ONNX's DynamicQuantizeLinear is per tensor and uint8, a different scheme.
* ``weight_only_dq`` (w8a16; also w8a8_dynamic Conv2d, whose per-patch scales have no Conv form,
  labelled ``weight_only_dq_dynamic_conv``): ``DQ(int8 W)`` -> float Gemm/Conv with float bias.
* ``fp32`` (``fp32_baseline=True``): float Gemm/Conv with the dequantized weights
  ``w_q * s_w / s_j`` and the float bias, for side-by-side benchmarks of the same model.
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from opsnn_quant.errors import ConfigError, MissingDependencyError, ShapeError
from opsnn_quant.quant.modules import QuantConv2d, _QuantMatmul, is_quant_module
from opsnn_quant.types import Precision

log = logging.getLogger(__name__)

DOMAIN, MARKER_OP = "opsnn_quant.export", "QuantModule"
_LINEAR, _CONV = 0, 1
_EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf cannot serialize 2 GiB; leave headroom
_INSTALL = "pip install 'opsnn-quant[onnx]'"


@dataclass
class OnnxExportInfo:
    """What :func:`export_onnx` wrote.

    Attributes:
        path: the ``.onnx`` file.
        nodes_path: ``<stem>.nodes.json`` beside it (``nodes`` and ``schemes`` as JSON).
        opset: the default-domain opset of the model.
        fp32_baseline: True when quantized modules were written as float Gemm/Conv.
        weight_dtype: ``int8``/``uint8`` for the DequantizeLinear weights (``float32`` baseline).
        nodes: module name -> names of the ONNX nodes it produced: every quantized module, and
            the innermost module of every other node the exporter tagged ("" = the root module).
        schemes: quantized module name -> how it is represented (see the module docstring).
    """

    path: Path
    nodes_path: Path
    opset: int
    fp32_baseline: bool
    weight_dtype: str
    nodes: dict[str, list[str]] = field(default_factory=dict)
    schemes: dict[str, str] = field(default_factory=dict)


def _require(*names: str) -> list[Any]:
    mods = []
    for name in names:
        try:
            mods.append(importlib.import_module(name))
        except ImportError as exc:
            raise MissingDependencyError(
                f"ONNX export/inference needs the '{name}' package: {_INSTALL}"
            ) from exc
    return mods


def _marker_shape(x: torch.Tensor, spec: Sequence[int]) -> list[Any]:
    """Output shape of a marked module (SymInt-friendly for the fake implementation)."""
    kind, n = spec[0], spec[1]
    if kind == _LINEAR:
        return [*x.shape[:-1], n]
    kh, kw, sh, sw, ph, pw, dh, dw = spec[3:11]
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
    """Replaces one quantized module during export. spec = [kind, N, rank, conv params...]."""

    def __init__(self, name: str, module: _QuantMatmul) -> None:
        super().__init__()
        self.qname = name
        if isinstance(module, QuantConv2d):
            self.spec = [_CONV, module.out_n, 0, *module.kernel_size, *module.stride]
            self.spec += [*module.padding, *module.dilation]
        else:
            self.spec = [_LINEAR, module.out_n, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise ShapeError(
                f"export_onnx: module '{self.qname}' receives {x.dtype}; export the model in "
                "float32 (ONNX QuantizeLinear below opset 19 takes float32 only)"
            )
        spec = [self.spec[0], self.spec[1], x.dim(), *self.spec[3:]]
        return torch.ops.opsnn_quant_export.module_marker(x, self.qname, spec)  # type: ignore[no-any-return]


def _translation_table() -> dict[Any, Any]:
    """The exporter's translation of the marker op: one node of :data:`DOMAIN`."""
    onnx, onnxscript = _require("onnx", "onnxscript")
    defs = onnx.defs
    if not defs.has(MARKER_OP, DOMAIN):
        param = defs.OpSchema.FormalParameter
        attr = defs.OpSchema.Attribute
        defs.register_schema(
            defs.OpSchema(
                MARKER_OP, DOMAIN, 1,
                inputs=[param("x", "T")], outputs=[param("y", "T")],
                type_constraints=[("T", ["tensor(float)"], "float32 activations")],
                attributes=[
                    attr("module", defs.OpSchema.AttrType.STRING, "module name"),
                    attr("spec", defs.OpSchema.AttrType.INTS, "kind, N, rank, conv params"),
                ],
            )
        )  # fmt: skip
    opset = onnxscript.values.Opset(DOMAIN, 1)

    def translate(x: Any, module: str, spec: Sequence[int]) -> Any:
        return opset.QuantModule(x, module=module, spec=list(spec))

    return {torch.ops.opsnn_quant_export.module_marker.default: translate}


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def _export_with_markers(
    model: nn.Module, example_inputs: tuple[Any, ...], opset: int, qmods: dict[str, _QuantMatmul]
) -> Any:
    """Export with every quantized module swapped for a marker (restored afterwards)."""
    (onnx,) = _require("onnx")
    table = _translation_table()
    was_training = model.training
    try:
        for name, mod in qmods.items():
            _set_submodule(model, name, _Marker(name, mod))
        model.eval()
        with torch.no_grad():
            # The exporter's own opset is 18 or newer; lower opsets are converted below, after
            # the node metadata that maps nodes to modules has been read.
            program = torch.onnx.export(
                model, example_inputs, dynamo=True, opset_version=max(opset, 18),
                custom_translation_table=table, verbose=False,
            )  # fmt: skip
    finally:
        for name, mod in qmods.items():
            _set_submodule(model, name, mod)
        model.train(was_training)
    return program.model_proto, onnx


def _float_module_nodes(graph: Any) -> dict[str, list[str]]:
    """Innermost module of each non-marker node, from the exporter's name-scope metadata."""
    out: dict[str, list[str]] = {}
    for node in graph.node:
        if node.domain == DOMAIN:
            continue
        meta = {p.key: p.value for p in node.metadata_props}
        scopes = meta.get("pkg.torch.onnx.name_scopes")
        if not scopes:
            continue
        names = ast.literal_eval(scopes)
        out.setdefault(names[-2] if len(names) >= 2 else "", []).append(node.name)
    return out


def export_onnx(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    path: str | os.PathLike[str],
    *,
    opset: int = 17,
    fp32_baseline: bool = False,
    weight_dtype: Literal["int8", "uint8"] = "int8",
) -> OnnxExportInfo:
    """Export a model with frozen QuantLinear/QuantConv2d modules as a standard QDQ ONNX model.

    Args:
        model: float32 model, quantized by :func:`opsnn_quant.quant.api.quantize` (a model
            without quantized modules is exported as is). Left unchanged.
        example_inputs: positional inputs for tracing (shapes are fixed to these).
        path: destination ``.onnx``; written atomically, with ``<stem>.nodes.json`` beside it.
        opset: default-domain opset (>= 13; below 18 the exporter's graph is converted down).
        fp32_baseline: write quantized modules as float Gemm/Conv with dequantized weights
            instead of QDQ (the same model in float, for side-by-side benchmarks).
        weight_dtype: ``int8`` (zero point 0, the Ascend/ATC form) or ``uint8``: the same
            weights plus 128 with zero point 128, identical after DequantizeLinear. ORT on x86
            CPUs without VNNI runs int8 weights through U8S8 kernels whose int16 pair sums
            saturate with full-range weights (wrong outputs); uint8 weights take its exact U8U8
            kernels. Applies to DequantizeLinear weights (MatMulInteger keeps int8).

    Returns:
        :class:`OnnxExportInfo` with the module -> node-name mapping and each module's scheme.

    Raises:
        MissingDependencyError: onnx/onnxscript are not installed.
        ConfigError: a quantized module is not frozen, or the opset is unsupported.
    """
    if weight_dtype not in ("int8", "uint8"):
        raise ConfigError(f"export_onnx: weight_dtype must be 'int8' or 'uint8', got {weight_dtype!r}")
    if opset < 13:
        raise ConfigError(f"export_onnx: opset must be >= 13 (per-channel DQ), got {opset}")
    qmods = {n: m for n, m in model.named_modules() if is_quant_module(m)}
    for name, mod in qmods.items():
        if not mod.frozen:
            raise ConfigError(f"module '{name}' is not frozen; run quantize() before export_onnx")
    proto, onnx = _export_with_markers(model, example_inputs, opset, qmods)
    float_nodes = _float_module_nodes(proto.graph)
    if opset < 18:
        try:
            proto = onnx.version_converter.convert_version(proto, opset)
        except Exception as exc:
            msg = f"export_onnx: cannot convert the graph to opset {opset} ({exc}); use >= 18"
            raise ConfigError(msg) from exc
    quant_nodes, schemes = _rewrite_markers(proto, qmods, fp32_baseline)
    if weight_dtype == "uint8":
        _uint8_weights(onnx, proto)
    remaining = {n.name for n in proto.graph.node}
    nodes = {m: [n for n in ns if n in remaining] for m, ns in float_nodes.items()}
    for m, ns in quant_nodes.items():
        nodes.setdefault(m, []).extend(ns)
    nodes = {m: ns for m, ns in nodes.items() if ns}
    if proto.ByteSize() < _EXTERNAL_DATA_BYTES:
        onnx.checker.check_model(proto)
    dest = Path(path)
    info = OnnxExportInfo(dest, dest.with_suffix(".nodes.json"), opset, fp32_baseline,
                          "float32" if fp32_baseline else weight_dtype, nodes, schemes)  # fmt: skip
    _save_atomic(onnx, proto, dest)
    _write_json_atomic(info)
    log.info("exported %s (%d quantized modules, opset %d)", dest, len(qmods), opset)
    return info


def _np(value: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return np.ascontiguousarray(arr)


class _Emitter:
    """Creates the standard nodes and initializers that replace the markers."""

    def __init__(self, onnx: Any, opset: int, taken: set[str]) -> None:
        self.onnx, self.opset, self.taken = onnx, opset, taken
        self.inits: dict[tuple[str, str], Any] = {}  # (module, role) -> TensorProto
        self.nodes: list[Any] = []
        self.module = self.prefix = ""

    def start(self, module: str, prefix: str) -> None:
        self.module, self.prefix, self.nodes = module, prefix, []

    def _fresh(self, name: str) -> str:
        base, i = name, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def init(self, role: str, value: torch.Tensor | np.ndarray) -> str:
        """An initializer ``<module>.<role>``, shared by repeated calls of one module."""
        key = (self.module, role)
        if key not in self.inits:
            name = self._fresh(f"{self.module}.{role}")
            self.inits[key] = self.onnx.numpy_helper.from_array(_np(value), name)
        return str(self.inits[key].name)

    def node(self, op: str, inputs: list[str], role: str, out: str | None = None, **attrs: Any) -> str:
        """A node ``<prefix>/<role>``; its output is ``out`` or a tensor of the same name."""
        name = self._fresh(f"{self.prefix}/{role}")
        output = out or name
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [output], name=name, **attrs))
        return output


def _static_bias_int32(mod: _QuantMatmul) -> torch.Tensor:
    """``rint(bias / deq)``: Ascend's quant_bias with the ``-offset * sum(w_q)`` fold undone."""
    w_sum = mod.weight.reshape(mod.out_n, -1).to(torch.int64).sum(dim=1)
    b = mod.quant_bias.to(torch.int64) + int(mod.input_quantizer.offset) * w_sum
    if bool((b.abs() > 2**31 - 1).any()):
        raise ConfigError(f"module '{mod.qname}': its int32 bias overflows without the offset fold")
    return b.to(torch.int32)


def _float_bias(mod: _QuantMatmul) -> torch.Tensor | None:
    if mod.spec.static_activations:
        return (_static_bias_int32(mod).double() * mod.deq_scale.double()).float()
    return None if mod.bias is None else mod.bias.float()


def _emit_dynamic(e: _Emitter, mod: _QuantMatmul, x: str, y: str) -> str:
    """DynamicQuant per token + int8 matmul + Ascend's fp32 epilogue order, in standard ops."""
    tp = e.onnx.TensorProto
    smooth = getattr(mod.input_quantizer, "smooth_scales", None)
    h = x if smooth is None else e.node("Mul", [x, e.init("smooth_scales", smooth)], "smooth_mul")
    a = e.node("Abs", [h], "abs")
    if e.opset >= 18:
        axes = e.init("token_axes", np.array([-1], np.int64))
        amax = e.node("ReduceMax", [a, axes], "token_absmax", keepdims=1)
    else:
        amax = e.node("ReduceMax", [a], "token_absmax", axes=[-1], keepdims=1)
    ts = e.node("Div", [amax, e.init("qmax", np.float32(127.0))], "token_scale")
    # An all-zero row divides by 1 instead of 0, as npu_dynamic_quant's reference does.
    zero = e.node("Equal", [ts, e.init("zero", np.float32(0.0))], "token_scale_is_zero")
    safe = e.node("Where", [zero, e.init("one", np.float32(1.0)), ts], "token_scale_safe")
    q = e.node("Round", [e.node("Div", [h, safe], "input_div")], "input_round")
    q = e.node("Clip", [q, e.init("qmin", np.float32(-128.0)), e.init("qmax", np.float32(127.0))],
               "input_clip")  # fmt: skip
    q = e.node("Cast", [q], "input_quantize", to=tp.INT8)
    w_t = mod.weight.reshape(mod.out_n, mod.in_k).t()
    acc = e.node("MatMulInteger", [q, e.init("weight", w_t)], "matmul_integer")
    f = e.node("Cast", [acc], "acc_to_float", to=tp.FLOAT)
    f = e.node("Mul", [f, e.init("weight_scale", mod.weight_quantizer.scale)], "weight_scale_mul")
    if mod.bias is None:
        e.node("Mul", [f, ts], "token_scale_mul", out=y)
    else:
        f = e.node("Mul", [f, ts], "token_scale_mul")
        e.node("Add", [f, e.init("bias", mod.bias)], "bias_add", out=y)
    return "dynamic_per_token"


def _emit(e: _Emitter, mod: _QuantMatmul, x: str, y: str, spec: list[int], fp32: bool) -> str:
    """Replace one marker; returns the scheme label."""
    conv, rank = spec[0] == _CONV, spec[2]
    prec, iq = mod.spec.precision, mod.input_quantizer
    if not conv and not fp32 and prec == Precision.W8A8_DYNAMIC:
        return _emit_dynamic(e, mod, x, y)
    reshape = not conv and rank != 2  # Gemm is 2-D only; ORT's QGemm needs Gemm
    h = x
    if reshape:
        h = e.node("Reshape", [x, e.init("rows_shape", np.array([-1, mod.in_k], np.int64))],
                   "reshape_in")  # fmt: skip
    s_w, w_q = mod.weight_quantizer.scale.float(), mod.weight
    smooth = getattr(iq, "smooth", None)
    bias: str | None = None
    if fp32:
        w = w_q.float() * s_w.reshape(-1, *[1] * (w_q.dim() - 1))
        w = w if smooth is None else w / smooth.float().reshape(1, -1)
        weight, scheme = e.init("weight", w), "fp32"
        fb = _float_bias(mod)
        bias = None if fb is None else e.init("bias", fb)
    else:
        zp = np.zeros(mod.out_n, np.int8)
        dq_in = [e.init("weight", w_q), e.init("weight_scale", s_w), e.init("weight_zero_point", zp)]
        weight = e.node("DequantizeLinear", dq_in, "weight_dequantize", axis=0)
        if prec == Precision.W8A8:
            if smooth is not None:
                m = (1.0 / smooth.double()).float()
                h = e.node("Mul", [h, e.init("smooth_mul", m)], "smooth_mul")
            sc = e.init("input_scale", np.float32(float(iq.scale)))
            zp = e.init("input_zero_point", np.int8(int(iq.offset)))
            h = e.node("QuantizeLinear", [h, sc, zp], "input_quantize")
            h = e.node("DequantizeLinear", [h, sc, zp], "input_dequantize")
            b_in = [e.init("bias_int32", _static_bias_int32(mod)), e.init("bias_scale", mod.deq_scale)]
            bias = e.node("DequantizeLinear", b_in, "bias_dequantize", axis=0)
            scheme = "qdq_static" if smooth is None else "qdq_static_smoothquant"
        else:
            bias = None if mod.bias is None else e.init("bias", mod.bias.float())
            scheme = "weight_only_dq" if prec == Precision.W8A16 else "weight_only_dq_dynamic_conv"
    inputs = [h, weight, *([bias] if bias is not None else [])]
    if conv:
        kh, kw, sh, sw, ph, pw, dh, dw = spec[3:11]
        e.node("Conv", inputs, "conv", out=y, kernel_shape=[kh, kw], strides=[sh, sw],
               pads=[ph, pw, ph, pw], dilations=[dh, dw], group=1)  # fmt: skip
        return scheme
    out = e.node("Gemm", inputs, "gemm", out=None if reshape else y, transB=1)
    if reshape:
        one = np.array([0], np.int64), np.array([-1], np.int64)
        shp = e.node("Shape", [x], "input_shape")
        lead = e.node("Slice", [shp, e.init("lead_start", one[0]), e.init("lead_end", one[1])],
                      "lead_shape")  # fmt: skip
        n = e.init("out_features", np.array([mod.out_n], np.int64))
        shape = e.node("Concat", [lead, n], "output_shape", axis=0)
        e.node("Reshape", [out, shape], "reshape_out", out=y)
    return scheme


def _rewrite_markers(
    proto: Any, qmods: dict[str, _QuantMatmul], fp32: bool
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Replace every marker node in place; returns module -> node names and module -> scheme."""
    (onnx,) = _require("onnx")
    graph = proto.graph
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    taken = {i.name for i in graph.initializer} | {n.name for n in graph.node}
    taken |= {t for n in graph.node for t in [*n.input, *n.output]}
    e = _Emitter(onnx, opset, taken)
    new_nodes: list[Any] = []
    mapping: dict[str, list[str]] = {}
    schemes: dict[str, str] = {}
    calls: dict[str, int] = {}
    for node in graph.node:
        if node.domain != DOMAIN:
            new_nodes.append(node)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        name = attrs["module"].decode()
        i = calls[name] = calls.get(name, -1) + 1  # a module called twice: "<name>#1/..."
        e.start(name, name if i == 0 else f"{name}#{i}")
        schemes[name] = _emit(e, qmods[name], node.input[0], node.output[0], list(attrs["spec"]), fp32)
        mapping.setdefault(name, []).extend(n.name for n in e.nodes)
        new_nodes.extend(e.nodes)
    if any(n.domain == DOMAIN for f in proto.functions for n in f.node):
        raise ConfigError("export_onnx: a quantized module ended up inside an ONNX function")
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(e.inits.values())
    keep = [o for o in proto.opset_import if o.domain != DOMAIN]
    del proto.opset_import[:]
    proto.opset_import.extend(keep)
    return mapping, schemes


def _uint8_weights(onnx: Any, proto: Any) -> int:
    """int8 DequantizeLinear initializers (and zero points) -> uint8 + 128, in place."""
    inits = {i.name: i for i in proto.graph.initializer}
    nh, changed = onnx.numpy_helper, 0
    for node in proto.graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) < 3:
            continue
        tensors = [inits.get(node.input[0]), inits.get(node.input[2])]
        if any(t is None or t.data_type != onnx.TensorProto.INT8 for t in tensors):
            continue
        for t in tensors:
            shifted = (nh.to_array(t).astype(np.int16) + 128).astype(np.uint8)
            t.CopyFrom(nh.from_array(shifted, t.name))
        changed += 1
    return changed


def to_uint8_weights(
    src: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None
) -> Path:
    """Rewrite an int8 QDQ model's DequantizeLinear weights as uint8 (+128, zero point 128).

    The dequantized values are identical; ORT on x86 CPUs without VNNI then runs its exact U8U8
    kernels instead of U8S8 ones that saturate (see :func:`export_onnx`'s ``weight_dtype``).
    Activation Q/DQ pairs (not initializers) are left alone. Written atomically.

    Args:
        src: an exported ``.onnx``.
        dest: output path (default ``<stem>.u8.onnx`` beside ``src``).

    Returns:
        The written path.
    """
    (onnx,) = _require("onnx")
    src = Path(src)
    out = Path(dest) if dest is not None else src.with_suffix(".u8.onnx")
    proto = onnx.load(str(src))
    log.info("%s: %d weight DequantizeLinear nodes -> uint8", src, _uint8_weights(onnx, proto))
    _save_atomic(onnx, proto, out)
    nodes_json = src.with_suffix(".nodes.json")
    if nodes_json.exists():  # same node names: carry the mapping over
        doc = json.loads(nodes_json.read_text(encoding="utf-8"))
        info = OnnxExportInfo(out, out.with_suffix(".nodes.json"), doc["opset"],
                              doc["fp32_baseline"], "uint8", doc["nodes"], doc["schemes"])  # fmt: skip
        _write_json_atomic(info)
    return out


def _save_atomic(onnx: Any, proto: Any, dest: Path) -> None:
    """Write into a temporary sibling directory, then rename into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        tmp = tmpdir / dest.name
        if proto.ByteSize() >= _EXTERNAL_DATA_BYTES:
            data = f"{dest.name}.data"
            onnx.save_model(proto, tmp, save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data)  # fmt: skip
            os.replace(tmpdir / data, dest.parent / data)
        else:
            onnx.save_model(proto, tmp)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _write_json_atomic(info: OnnxExportInfo) -> None:
    doc = {
        "schema_version": 1, "model": info.path.name, "opset": info.opset,
        "fp32_baseline": info.fp32_baseline, "weight_dtype": info.weight_dtype, "schemes": info.schemes, "nodes": info.nodes,
    }  # fmt: skip
    fd, tmp = tempfile.mkstemp(prefix=f".{info.nodes_path.name}.", dir=info.nodes_path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        os.replace(tmp, info.nodes_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_node_map(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The module -> ONNX node names mapping of a ``.nodes.json`` (or of its ``.onnx``)."""
    p = Path(path)
    p = p.with_suffix(".nodes.json") if p.suffix == ".onnx" else p
    nodes: dict[str, list[str]] = json.loads(p.read_text(encoding="utf-8"))["nodes"]
    return nodes


def onnxruntime_session(
    path: str | os.PathLike[str],
    *,
    qdq_fusion: bool = True,
    optimized_model_path: str | os.PathLike[str] | None = None,
) -> Any:
    """A CPU ``InferenceSession`` with ``torch.get_num_threads()`` intra-op threads.

    Args:
        path: the ``.onnx`` file.
        qdq_fusion: let ORT fuse QDQ groups into int8 kernels (its default). False runs the
            graph as written (DequantizeLinear + float ops): ONNX's reference semantics, and the
            way to run int8-weight exports on x86 CPUs without VNNI (see ``weight_dtype``).
        optimized_model_path: where ORT saves the graph after its fusions (e.g. to find QGemm).
    """
    (ort,) = _require("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.inter_op_num_threads = 1
    if not qdq_fusion:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_onnxruntime(
    path: str | os.PathLike[str] | Any, inputs: Sequence[torch.Tensor | np.ndarray]
) -> list[np.ndarray]:
    """Run an ONNX model (a path, or a session from :func:`onnxruntime_session`) on the CPU EP.

    Args:
        path: model file or an existing session.
        inputs: positional inputs, in the order of the model's graph inputs.

    Returns:
        The model outputs as numpy arrays.
    """
    sess = onnxruntime_session(path) if isinstance(path, str | os.PathLike) else path
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(inputs):
        raise ShapeError(f"the ONNX model takes {len(names)} inputs ({names}), got {len(inputs)}")
    feeds = {n: _np(t) for n, t in zip(names, inputs, strict=True)}
    return list(sess.run(None, feeds))
