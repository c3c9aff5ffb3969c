"""ONNX export of quantized models as standard QDQ graphs that ONNX Runtime (and ATC) run.

Route: ``torch.onnx.export`` (the dynamo exporter, torch's default) runs with each frozen
QuantLinear/QuantConv2d swapped for a marker whose custom op becomes one node of a private domain;
:mod:`onnx` then rewrites every marker into standard nodes built from the module's frozen buffers.
The exporter handles the rest of the model, the QDQ part is ours byte for byte (no optimizer can
fold a DequantizeLinear into a float weight), and every node name is known: nodes are
``<module>/<role>``, initializers ``<module>.<role>``. Per scheme (N outputs, K inputs; Linear
inputs of rank != 2 are reshaped to (-1, K) around the Gemm):

* ``qdq_static`` (w8a8): ``QuantizeLinear(s_x, zp=offset)`` -> ``DequantizeLinear`` ->
  ``Gemm(transB=1)``/``Conv`` with ``B = DQ(int8 W (N, K[, kh, kw]), s_w, zp 0, axis 0)`` and
  ``C = DQ(int32 bias, s_x * s_w, axis 0)``, the int32 bias being Ascend's ``quant_bias`` without
  its ``-offset * sum(w_q)`` fold (ONNX subtracts the zero point in the DQ). A float bias would
  stop ORT's QDQ fusion; with the int32 one ORT runs QGemm (int8 kernels).
* ``qdq_static_smoothquant``: the same behind ``Mul(x, 1 / s_j)`` (the form of ORT's and AMCT's
  SmoothQuant). Ascend multiplies by ``1 / (s_x * s_j)`` in one step, and ORT divides by ``s_x``
  where Ascend multiplies by ``1 / s_x``: a rare activation lands one int8 step away.
* ``dynamic_per_token`` (w8a8_dynamic Linear): DynamicQuant spelled out exactly, ``[Mul(smooth)]``
  -> ``ReduceMax(Abs) / 127`` -> ``Div, Round, Clip, Cast(int8)`` -> ``MatMulInteger(int8 W^T
  (K, N))`` -> ``Cast`` -> ``Mul(s_w)`` -> ``Mul(s_t)`` -> ``Add(bias)``, the reference's order.
  ONNX's DynamicQuantizeLinear is per tensor and uint8: another scheme.
* ``weight_only_dq`` (w8a16): ``DQ(int8 W)`` -> float Gemm/Conv with float bias. w8a8_dynamic
  Conv2d (per-patch scales have no Conv form) is written so too: ``weight_only_dq_dynamic_conv``.
* ``fp32`` (``fp32_baseline=True``): float Gemm/Conv with the dequantized weights
  ``w_q * s_w / s_j`` and float bias: the same model in float, for side-by-side benchmarks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.atc.onnx.files import (
    ONNX_EXTERNAL_DATA_BYTES,
    SPILL_BYTES,
    SPILL_PREFIX,
    save_onnx_atomic,
    spillable,
    spilled_tensor,
)
from opsnn_quant.formats.atc.onnx.info import OnnxExportInfo, require_onnx, to_numpy
from opsnn_quant.formats.atc.onnx.markers import DOMAIN, export_with_markers, float_module_nodes
from opsnn_quant.quant.modules import (
    QuantConv2d,
    QuantLinear,
    QuantModule,
    is_quant_module,
)
from opsnn_quant.types import Precision

log = logging.getLogger(__name__)


def export_onnx(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    path: str | os.PathLike[str],
    *,
    opset: int = 17,
    fp32_baseline: bool = False,
) -> OnnxExportInfo:
    """Export a model holding frozen QuantLinear/QuantConv2d modules as a standard QDQ model.

    Weights are int8 with zero point 0 (the Ascend/ATC form). ORT on x86 CPUs without VNNI runs
    them through U8S8 kernels whose int16 pair sums saturate with full-range weights (wrong
    outputs): :func:`onnxruntime_session` then turns ORT's QDQ fusion off, and
    :func:`to_uint8_weights` gives a copy that ORT runs exactly with its U8U8 int8 kernels.

    Args:
        model: float32 model after :func:`opsnn_quant.quant.api.quantize` (one without quantized
            modules is exported as is). Left as it was.
        example_inputs: positional inputs for tracing (the graph is fixed to their shapes).
        path: destination ``.onnx``, written atomically, with ``<stem>.nodes.json`` beside it.
        opset: default-domain opset, >= 13 (the exporter works at 18 and converts down).
        fp32_baseline: quantized modules as float Gemm/Conv with dequantized weights.

    Returns:
        :class:`OnnxExportInfo` with the module -> node names mapping and the schemes.

    Raises:
        MissingDependencyError: onnx/onnxscript are not installed.
        ConfigError: a quantized module is not frozen, or the opset is below 13.
    """
    if opset < 13:
        raise ConfigError(
            f"export_onnx: opset must be >= 13 (per-axis DequantizeLinear), got {opset}"
        )
    qmods = {n: m for n, m in model.named_modules() if is_quant_module(m)}
    if "" in qmods:
        raise ConfigError("export_onnx: wrap a bare QuantLinear/QuantConv2d in an nn.Sequential")
    for name, mod in qmods.items():
        if not mod.frozen:
            raise ConfigError(f"module '{name}' is not frozen; run quantize() before export_onnx")
        if not isinstance(mod, QuantLinear | QuantConv2d):
            # The rewrite below knows the Gemm and Conv forms only; another registered type
            # would come out with a wrong layout.
            raise ConfigError(
                f"export_onnx: module '{name}' is a {type(mod).__name__}; the QDQ export "
                "writes QuantLinear and QuantConv2d (and their subclasses) only"
            )
        if mod.spec.timestep_bounds:
            raise ConfigError(
                f"export_onnx: module '{name}' switches activation scales per denoising step; "
                "a static ONNX graph holds one"
            )
        if mod.spec.precision == Precision.W4A16:
            # ONNX has int4 only from opset 21 (blocked DequantizeLinear), which ATC and ORT's
            # CPU kernels here do not take: refused rather than written as a float graph.
            raise ConfigError(
                f"export_onnx: module '{name}' is w4a16 (int4 per group); the QDQ export "
                "writes int8 schemes only"
            )
    (onnx,) = require_onnx("onnx")
    # The exporter starts at opset 18; lower ones are converted after reading the node metadata.
    proto = export_with_markers(model, example_inputs, qmods, max(opset, 18))
    nodes = float_module_nodes(proto.graph)
    if opset < 18:
        try:
            proto = onnx.version_converter.convert_version(proto, opset)
        except Exception as exc:
            msg = f"export_onnx: cannot convert the graph to opset {opset} ({exc}); use >= 18"
            raise ConfigError(msg) from exc
    quant_nodes, schemes = rewrite_markers(onnx, proto, qmods, fp32_baseline)
    remaining = {n.name for n in proto.graph.node}
    nodes = {m: [n for n in ns if n in remaining] for m, ns in nodes.items()}
    nodes = {m: ns for m, ns in (nodes | quant_nodes).items() if ns}
    if proto.ByteSize() < ONNX_EXTERNAL_DATA_BYTES:  # the checker takes a path beyond 2 GiB
        onnx.checker.check_model(proto)
    dest = Path(path)
    dtype = "float32" if fp32_baseline else "int8"
    info = OnnxExportInfo(dest, dest.with_suffix(".nodes.json"), opset, fp32_baseline, dtype,
                          nodes, schemes)  # fmt: skip
    save_onnx_atomic(proto, dest)
    info.write_nodes_json()
    log.info("exported %s: %d quantized modules, opset %d", dest, len(qmods), opset)
    return info


def _buf(module: nn.Module, name: str) -> torch.Tensor:
    return cast(torch.Tensor, getattr(module, name))


class _Emitter:
    """Creates the nodes and initializers that replace the markers, with unique names."""

    def __init__(self, onnx: Any, opset: int, taken: set[str], spill: Path | None = None) -> None:
        self.onnx, self.opset, self.taken = onnx, opset, taken
        self.inits: dict[tuple[str, str], Any] = {}  # (module, role) -> TensorProto
        self.spill = spill  # where initializers of SPILL_BYTES or more go (None: in the proto)
        self.nodes: list[Any] = []
        self.module = self.prefix = ""

    def _fresh(self, name: str) -> str:
        base, i = name, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def init(self, role: str, value: Any) -> str:
        """Initializer ``<module>.<role>``, shared by repeated calls of one module."""
        key = (self.module, role)
        if key not in self.inits:
            name = self._fresh(f"{self.module}.{role}")
            arr = to_numpy(value)
            if self.spill is not None and arr.nbytes >= SPILL_BYTES and spillable(arr):
                path = self.spill / f"{SPILL_PREFIX}{len(self.inits)}.bin"
                self.inits[key] = spilled_tensor(self.onnx, arr, name, path)
            else:
                self.inits[key] = self.onnx.numpy_helper.from_array(arr, name)
        return str(self.inits[key].name)

    def node(self, op: str, ins: list[str], role: str, out: str | None = None, **attrs: Any) -> str:
        """Node ``<prefix>/<role>``; its output is ``out`` or a tensor of the node's name."""
        name = self._fresh(f"{self.prefix}/{role}")
        self.nodes.append(self.onnx.helper.make_node(op, ins, [out or name], name=name, **attrs))
        return out or name


def _static_bias_int32(mod: QuantModule[Any]) -> torch.Tensor:
    """``rint(bias / deq)``: Ascend's quant_bias with the ``-offset * sum(w_q)`` fold undone."""
    w_sum = mod.weight.reshape(mod.out_n, -1).to(torch.int64).sum(dim=1)
    b = _buf(mod, "quant_bias").to(torch.int64) + int(_buf(mod.input_quantizer, "offset")) * w_sum
    if bool((b.abs() > 2**31 - 1).any()):
        raise ConfigError(f"module '{mod.qname}': its int32 bias overflows without the offset fold")
    return b.to(torch.int32)


def _emit_dynamic(e: _Emitter, mod: QuantModule[Any], x: str, y: str) -> str:
    """DynamicQuant per token, int8 matmul and Ascend's fp32 epilogue, in standard ops."""
    tp, f32 = e.onnx.TensorProto, np.float32
    smooth = getattr(mod.input_quantizer, "smooth_scales", None)
    h = x if smooth is None else e.node("Mul", [x, e.init("smooth_scales", smooth)], "smooth_mul")
    a = e.node("Abs", [h], "abs")
    if e.opset >= 18:
        axes = e.init("token_axes", np.array([-1], np.int64))
        amax = e.node("ReduceMax", [a, axes], "token_absmax", keepdims=1)
    else:
        amax = e.node("ReduceMax", [a], "token_absmax", axes=[-1], keepdims=1)
    # The A2 kernel's order (ascend.npu_dynamic_quant): inv = 127 / rowmax, q = rint(x * inv),
    # scale = rowmax * fp32(1/127). An all-zero row gives inv = inf and 0 * inf = nan, which the
    # kernel's cast makes 0: here inv is 0 for such a row, giving the same zeros.
    ts = e.node("Mul", [amax, e.init("inv_qmax", f32(1.0) / f32(127.0))], "token_scale")
    zero = e.node("Equal", [amax, e.init("zero", f32(0.0))], "token_absmax_is_zero")
    safe = e.node("Where", [zero, e.init("one", f32(1.0)), amax], "token_absmax_safe")
    inv = e.node("Div", [e.init("qmax_num", f32(127.0)), safe], "token_inv_scale")
    inv = e.node("Where", [zero, e.init("zero_inv", f32(0.0)), inv], "token_inv_scale_safe")
    q = e.node("Round", [e.node("Mul", [h, inv], "input_mul")], "input_round")
    q = e.node("Clip", [q, e.init("qmin", f32(-128.0)), e.init("qmax", f32(127.0))], "input_clip")
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


def _emit(e: _Emitter, mod: QuantModule[Any], x: str, y: str, rank: int, fp32: bool) -> str:
    """Replace one marker (``x`` -> ``y``); returns the scheme label."""
    conv, prec, iq = isinstance(mod, QuantConv2d), mod.spec.precision, mod.input_quantizer
    if not conv and not fp32 and prec == Precision.W8A8_DYNAMIC:
        return _emit_dynamic(e, mod, x, y)
    reshape, h, bias = not conv and rank != 2, x, None  # Gemm is 2-D; ORT's QGemm needs Gemm
    if reshape:
        rows = e.init("rows_shape", np.array([-1, mod.in_k], np.int64))
        h = e.node("Reshape", [x, rows], "reshape_in")
    s_w, w_q, smooth = mod.weight_quantizer.scale.float(), mod.weight, getattr(iq, "smooth", None)
    if fp32:
        w = w_q.float() * s_w.reshape(-1, *[1] * (w_q.dim() - 1))
        weight, scheme = (
            e.init("weight", w if smooth is None else w / smooth.reshape(1, -1)),
            "fp32",
        )
        b_f = mod.bias  # float or None; static w8a8 keeps it only in int32 accumulator units
        if mod.spec.static_activations:
            b_f = _static_bias_int32(mod).double() * _buf(mod, "deq_scale").double()
        bias = None if b_f is None else e.init("bias", b_f.float())
    else:
        zp = np.zeros(mod.out_n, np.int8)
        dq = [e.init("weight", w_q), e.init("weight_scale", s_w), e.init("weight_zero_point", zp)]
        weight = e.node("DequantizeLinear", dq, "weight_dequantize", axis=0)
        if prec == Precision.W8A8:
            if smooth is not None:
                h = e.node("Mul", [h, e.init("smooth_mul", (1.0 / smooth.double()).float())],
                           "smooth_mul")  # fmt: skip
            sc = e.init("input_scale", np.float32(float(_buf(iq, "scale"))))
            zp_x = e.init("input_zero_point", np.int8(int(_buf(iq, "offset"))))
            h = e.node("QuantizeLinear", [h, sc, zp_x], "input_quantize")
            h = e.node("DequantizeLinear", [h, sc, zp_x], "input_dequantize")
            deq = _buf(mod, "deq_scale")
            b = [e.init("bias_int32", _static_bias_int32(mod)), e.init("bias_scale", deq)]
            bias = e.node("DequantizeLinear", b, "bias_dequantize", axis=0)
            scheme = "qdq_static" if smooth is None else "qdq_static_smoothquant"
        else:
            bias = None if mod.bias is None else e.init("bias", mod.bias.float())
            scheme = "weight_only_dq" if prec == Precision.W8A16 else "weight_only_dq_dynamic_conv"
    ins = [h, weight, *([bias] if bias is not None else [])]
    _emit_op(e, mod, mod.out_n, ins, x, y, reshape)
    return scheme


def _emit_float(e: _Emitter, mod: nn.Linear | nn.Conv2d, x: str, y: str, rank: int) -> str:
    """A float module's own op with its float weights (Conv, or Gemm reshaped around as in the
    QDQ form): the float graph that shares its trace with the QDQ one."""
    linear = isinstance(mod, nn.Linear)
    reshape, h = linear and rank != 2, x
    if reshape:
        rows = e.init("rows_shape", np.array([-1, mod.weight.shape[1]], np.int64))
        h = e.node("Reshape", [x, rows], "reshape_in")
    ins = [h, e.init("weight", mod.weight.detach())]
    if mod.bias is not None:
        ins.append(e.init("bias", mod.bias.detach()))
    _emit_op(e, mod, mod.weight.shape[0], ins, x, y, reshape)
    return "float"


def _emit_op(
    e: _Emitter, mod: nn.Module, n_out: int, ins: list[str], x: str, y: str, reshape: bool
) -> None:
    """The Conv, or the Gemm (``transB=1``, reshaped back to ``(*x.shape[:-1], N)`` when its
    input was reshaped to rows), that computes ``y`` from ``ins``."""
    if isinstance(mod, QuantConv2d | nn.Conv2d):
        (ph, pw), (sh, sw) = cast(tuple[int, int], mod.padding), mod.stride
        e.node("Conv", ins, "conv", out=y, kernel_shape=list(mod.kernel_size), strides=[sh, sw],
               pads=[ph, pw, ph, pw], dilations=list(mod.dilation), group=1)  # fmt: skip
        return
    out = e.node("Gemm", ins, "gemm", out=None if reshape else y, transB=1)
    if reshape:  # back to (*x.shape[:-1], N), whatever the batch dims are at run time
        ends = (
            e.init("lead_start", np.array([0], np.int64)),
            e.init("lead_end", np.array([-1], np.int64)),
        )
        lead = e.node("Slice", [e.node("Shape", [x], "input_shape"), *ends], "lead_shape")
        n = e.init("out_features", np.array([n_out], np.int64))
        shape = e.node("Concat", [lead, n], "output_shape", axis=0)
        e.node("Reshape", [out, shape], "reshape_out", out=y)


def rewrite_markers(
    onnx: Any,
    proto: Any,
    modules: Mapping[str, nn.Module],
    fp32: bool = False,
    spill: Path | None = None,
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Replace the markers of ``proto`` in place by their modules' standard ONNX nodes.

    Args:
        onnx: the ``onnx`` package.
        proto: a ModelProto exported with markers (one ``QuantModule`` node per marked call).
        modules: marker name -> module: a frozen QuantLinear/QuantConv2d becomes its QDQ form
            (see the module docstring), a float ``nn.Linear``/``nn.Conv2d`` its own float op.
        fp32: quantized modules as float ops with their dequantized weights (``fp32``).
        spill: a directory: each new initializer of :data:`SPILL_BYTES` or more is written to a
            file there (``opsnn-init-*.bin``) and left in ``proto`` as an external tensor, so an
            SD 1.5 UNet's 3.4 GB of float weights are never in memory at once (see
            :func:`opsnn_quant.formats.atc.onnx.files.unspill` and :func:`opsnn_quant.formats.atc.onnx.files.save_onnx_atomic`).

    Returns:
        Module -> the names of its nodes, and module -> its scheme (``float`` for a float one).
    """
    graph = proto.graph
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    taken = {i.name for i in graph.initializer} | {n.name for n in graph.node}
    e = _Emitter(onnx, opset, taken | {t for n in graph.node for t in [*n.input, *n.output]}, spill)
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
        e.module, e.prefix, e.nodes = name, name if i == 0 else f"{name}#{i}", []
        mod, x, y, rank = modules[name], node.input[0], node.output[0], attrs["rank"]
        if isinstance(mod, nn.Linear | nn.Conv2d):
            schemes[name] = _emit_float(e, mod, x, y, rank)
        else:
            schemes[name] = _emit(e, cast(QuantModule[Any], mod), x, y, rank, fp32)
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


__all__ = ["export_onnx", "rewrite_markers"]
