"""ONNX QDQ export: ORT against the exact reference, graph structure, node mapping, files.

Tolerances, per output element, with ``y`` the reference (our quantized module on the CPU):

* static w8a8 (Linear, Conv2d): ``2**-9 * |y| + 1e-5 * max|y| + f * 127 * max(deq)``. The
  reference scales the int32 accumulator by the FP19-truncated deq scale (relative error below
  2**-10) and rounds to fp16 (2**-11); ORT uses the full fp32 ``s_x * s_w`` and stays in fp32;
  1e-5 covers fp32 summation order. ORT's QuantizeLinear divides by ``s_x`` where AscendQuantV2
  multiplies by ``1/s_x`` (and SmoothQuant adds a separate Mul), so an activation can land one
  int8 step away; ``f`` is the largest number of such activations in a row, read from ORT's own
  QuantizeLinear output (0 in these tests, and at most a handful of elements is accepted).
* w8a8_dynamic: ``2**-11 * |y| + 1e-6 * max|y|``: the export spells out DynamicQuant and the
  fp32 epilogue in the reference's order, so only the reference's fp16 output rounding remains.
* w8a16: ``1e-5 * max|y|`` (the same fp32 math, another summation order).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from opsnn_quant.ascend import npu_quantize
from opsnn_quant.errors import ConfigError, MissingDependencyError
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision
from tests.tiny_models import TinyAttention, forward_loop_for

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
from opsnn_quant.formats.atc.onnx.export import export_onnx  # noqa: E402
from opsnn_quant.formats.atc.onnx.runtime import (  # noqa: E402
    onnxruntime_session,
    run_onnxruntime,
    to_uint8_weights,
)
from opsnn_quant.formats.atc.precision import load_node_map  # noqa: E402

LINEAR_SPECS = {
    "sym": QuantSpec(),
    "asym": QuantSpec(activation_symmetric=False),
    "sq_sym": QuantSpec(smoothquant_alpha=0.5),
    "sq_asym": QuantSpec(activation_symmetric=False, smoothquant_alpha=0.5),
    "w8a16": QuantSpec(precision=Precision.W8A16),
    "dyn": QuantSpec(precision=Precision.W8A8_DYNAMIC),
    "dyn_sq": QuantSpec(precision=Precision.W8A8_DYNAMIC, smoothquant_alpha=0.5),
}
CONV_SPECS = {"conv_sym": QuantSpec(), "conv_asym": QuantSpec(activation_symmetric=False)}
SPECS = {**LINEAR_SPECS, **CONV_SPECS}
SCHEMES = {
    "sym": "qdq_static", "asym": "qdq_static", "sq_sym": "qdq_static_smoothquant",
    "sq_asym": "qdq_static_smoothquant", "w8a16": "weight_only_dq", "dyn": "dynamic_per_token",
    "dyn_sq": "dynamic_per_token", "conv_sym": "qdq_static", "conv_asym": "qdq_static",
}  # fmt: skip


class Branches(nn.Module):
    """One module per scheme, each fed the model input directly, so that one export checks every
    scheme module by module: Linear layers on a rank-3 input, 3x3 convolutions on an image."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.b = nn.ModuleDict({k: nn.Linear(64, 48) for k in LINEAR_SPECS})
        self.b["conv_sym"] = nn.Conv2d(4, 16, 3, padding=1)
        self.b["conv_asym"] = nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False)

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = tuple(m(img if k.startswith("conv") else x) for k, m in self.b.items())
        return (*outs, self.b["sym"](0.5 * x))  # a second call of one module: "b.sym#1/..."

    @staticmethod
    def example_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 16, 64, generator=g) + 0.3
        x[..., 5] *= 15.0  # an outlier channel, SmoothQuant's case
        return x, torch.randn(2, 4, 8, 8, generator=g).relu() + 0.1


@pytest.fixture(scope="module")
def branches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Branches, object]:
    model = Branches()
    quantize(model, {f"b.{k}": s for k, s in SPECS.items()}, forward_loop_for(model))
    path = tmp_path_factory.mktemp("branches") / "branches.onnx"
    return model, export_onnx(model, model.example_inputs(), path)


def _with_outputs(path: str, names: list[str]) -> bytes:
    """The model with extra graph outputs (intermediate tensors), serialized."""
    m = onnx.load(path)
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    return bytes(m.SerializeToString())


def _check(name: str, got: np.ndarray, ref: torch.Tensor, tol: np.ndarray) -> float:
    r = ref.detach().numpy()
    diff = np.abs(got - r)
    assert np.isfinite(got).all(), name
    worst = float((diff - tol).max())
    assert worst <= 0, f"{name}: max|diff|={diff.max():.3g} exceeds the tolerance by {worst:.3g}"
    return float(diff.max())


def _static_tol(mod: Any, ref: torch.Tensor, flips_per_row: int) -> np.ndarray:
    r = np.abs(ref.detach().numpy())
    deq = float(mod.deq_scale.max())
    return 2.0**-9 * r + 1e-5 * r.max() + flips_per_row * 127 * deq


def _flips(mod: Any, x: torch.Tensor, q_ort: np.ndarray, row_dims: int) -> int:
    """Activations ORT quantized one step away from AscendQuantV2: the most in one row.

    A row is what one output element sees: a token (last dim) or, for Conv2d, a whole sample
    (an over-count: a patch sees only part of it).
    """
    iq = mod.input_quantizer
    offset = None if mod.spec.activation_symmetric else iq.offset.reshape(1)
    q_ref = npu_quantize(x, iq.inv_scale, offset, torch.qint8, axis=-1, div_mode=False)
    diff = np.abs(q_ort.astype(np.int32) - q_ref.numpy().astype(np.int32))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, "activation quantization disagrees"
    per_row = (diff > 0).reshape(*diff.shape[: diff.ndim - row_dims], -1).sum(axis=-1)
    return int(per_row.max())


def _ort_quantized_inputs(path: str, modules: list[str], inputs: tuple) -> list[np.ndarray]:
    """int8 activations from ORT's own QuantizeLinear nodes (graph run as written)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    names = [f"{m}/input_quantize" for m in modules]
    sess = ort.InferenceSession(_with_outputs(path, names), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs, strict=True)}
    return list(sess.run(names, feeds))


def _check_all(model: Branches, path: str, got: list[np.ndarray], inputs: tuple) -> dict:
    """Every output against the reference with the tolerances of the module docstring."""
    x, img = inputs
    # (module key, node prefix, module input) per model output, in order
    calls = [(k, f"b.{k}", img if k.startswith("conv") else x) for k in SPECS]
    calls.append(("sym", "b.sym#1", 0.5 * x))
    static = [c for c in calls if SPECS[c[0]].static_activations]
    q_ort = _ort_quantized_inputs(path, [c[1] for c in static], inputs)
    flips: dict[str, int] = {}
    for (key, prefix, xin), q in zip(static, q_ort, strict=True):
        conv = key.startswith("conv")
        # A row is what one output sees: a token, or (over-counting) a whole image for a conv,
        # where one pixel enters up to 9 patches of a 3x3 kernel.
        f = _flips(model.b[key], xin, q.reshape(xin.shape), 3 if conv else 1)
        flips[prefix] = (9 if conv else 1) * f
    diffs = {}
    for (key, prefix, _), y, ref in zip(calls, got, model(*inputs), strict=True):
        r, spec = np.abs(ref.numpy()), SPECS[key]
        if spec.static_activations:
            tol = _static_tol(model.b[key], ref, flips[prefix])
        elif spec.precision.value == "w8a8_dynamic":
            tol = 2.0**-11 * r + 1e-6 * r.max()
        else:
            tol = np.full_like(r, 1e-5 * r.max())
        diffs[prefix] = _check(prefix, y, ref, tol)
    return diffs


def test_every_scheme_matches_reference(branches: tuple) -> None:
    model, info = branches
    inputs = model.example_inputs(seed=7)
    got = run_onnxruntime(onnxruntime_session(info.path, qdq_fusion=False), inputs)
    print("max |ORT - reference|:", _check_all(model, str(info.path), got, inputs))
    assert info.schemes == {f"b.{k}": v for k, v in SCHEMES.items()}
    # Default session: fused int8 kernels, or the graph as written on CPUs where they saturate.
    got = run_onnxruntime(info.path, inputs)
    print("max |ORT default session - reference|:", _check_all(model, str(info.path), got, inputs))


def test_uint8_weights_run_fused_int8_kernels(branches: tuple, tmp_path) -> None:
    model, info = branches
    u8 = to_uint8_weights(info.path, tmp_path / "u8.onnx")
    assert load_node_map(u8) == info.nodes
    inputs = model.example_inputs(seed=7)
    opt = tmp_path / "u8.opt.onnx"
    got = run_onnxruntime(onnxruntime_session(u8, optimized_model_path=opt), inputs)
    ops = [n.op_type for n in onnx.load(str(opt)).graph.node]
    assert ops.count("QGemm") == 5  # every static Linear call runs ORT's int8 kernel
    print("max |ORT fused - reference|:", _check_all(model, str(u8), got, inputs))


def test_graph_is_qdq_with_int8_initializers(branches: tuple) -> None:
    _, info = branches
    graph = onnx.load(str(info.path)).graph
    inits = {i.name: i for i in graph.initializer}
    ops = {n.name: n for n in graph.node}
    tp = onnx.TensorProto
    for key in SPECS:
        m = f"b.{key}"
        w = inits[f"{m}.weight"]
        assert w.data_type == tp.INT8
        assert all(n.startswith((m + "/", m + "#")) for n in info.nodes[m])
        if key.startswith("dyn"):
            assert (
                list(w.dims) == [64, 48] and ops[f"{m}/matmul_integer"].op_type == "MatMulInteger"
            )
            continue
        assert list(w.dims) == (
            [16, 4, 3, 3] if key == "conv_sym" else [8, 4, 3, 3] if key == "conv_asym" else [48, 64]
        )
        dq = ops[f"{m}/weight_dequantize"]
        assert dq.op_type == "DequantizeLinear" and list(dq.input[:1]) == [f"{m}.weight"]
        assert onnx.helper.get_attribute_value(dq.attribute[0]) == 0  # axis 0, per channel
        assert not onnx.numpy_helper.to_array(inits[f"{m}.weight_zero_point"]).any()
        if key != "w8a16":
            assert ops[f"{m}/input_quantize"].op_type == "QuantizeLinear"
            assert ops[f"{m}/input_dequantize"].op_type == "DequantizeLinear"
            assert inits[f"{m}.input_zero_point"].data_type == tp.INT8
            assert inits[f"{m}.bias_int32"].data_type == tp.INT32
            assert (f"{m}/smooth_mul" in ops) == key.startswith("sq")
    # The second call of b.sym has its own nodes and shares the module's initializers.
    assert ops["b.sym#1/weight_dequantize"].input[0] == "b.sym.weight"
    assert "b.sym#1/gemm" in info.nodes["b.sym"]
    # No float copy of a quantized weight anywhere.
    assert not any(i.data_type == tp.FLOAT and len(i.dims) >= 2 for i in graph.initializer)


def test_attention_mapping_json_and_fp32_baseline(tmp_path) -> None:
    model = TinyAttention()
    quantize(
        model, {"to_*": "w8a8", "ff1": "w8a8_dynamic", "ff2": "w8a16"}, forward_loop_for(model)
    )
    x = model.example_inputs(seed=7)
    info = export_onnx(model, x, tmp_path / "att.onnx", opset=18)  # ReduceMax takes axes input
    assert info.opset == 18 == onnx.load(str(info.path)).opset_import[0].version
    quantized = {"to_q", "to_k", "to_v", "to_out", "ff1", "ff2"}
    assert quantized <= set(info.nodes) and set(info.schemes) == quantized
    names = {n.name for n in onnx.load(str(info.path)).graph.node}
    assert all(n in names for ns in info.nodes.values() for n in ns)
    assert "norm1" in info.nodes  # float modules are mapped too
    doc = json.loads(info.nodes_path.read_text())
    assert info.nodes_path.name == "att.nodes.json" and doc["nodes"] == info.nodes
    assert load_node_map(info.path) == info.nodes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["att.nodes.json", "att.onnx"]
    ref = model(*x)
    y_q = run_onnxruntime(onnxruntime_session(info.path, qdq_fusion=False), x)[0]
    # End to end the per-module differences (above) pass through attention and later
    # quantizers: 0.5 % of the output range (7e-4 measured).
    assert np.abs(y_q - ref.numpy()).max() <= 5e-3 * float(ref.abs().max())
    base = export_onnx(model, x, tmp_path / "att_fp32.onnx", fp32_baseline=True)
    graph = onnx.load(str(base.path)).graph
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in graph.node}
    assert set(base.schemes.values()) == {"fp32"} and quantized <= set(base.nodes)
    y_f = run_onnxruntime(base.path, x)[0]
    # Float math on the dequantized weights: only the int8 activation rounding is gone (2e-3).
    assert np.abs(y_f - ref.numpy()).max() <= 2e-2 * float(ref.abs().max())


def test_unfrozen_and_missing_dependency(tmp_path, monkeypatch) -> None:
    from opsnn_quant.quant.modules import QuantLinear

    model = nn.Sequential(QuantLinear.from_float(nn.Linear(4, 4), QuantSpec(), "0"))
    with pytest.raises(ConfigError, match="not frozen"):
        export_onnx(model, (torch.randn(2, 4),), tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingDependencyError, match=r"opsnn-quant\[onnx\]"):
        run_onnxruntime(tmp_path / "m.onnx", [])
