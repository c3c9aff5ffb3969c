"""ort_speed on a hand-built fp32 / QDQ ONNX pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.latency import ORT_NOTE
from opsnn_quant.evaluation.ort_speed import ort_speed

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _models(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (64, 32)).astype(np.float32)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])
    fp32 = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "fp32", [x_info], [y_info],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    w_scale = np.float32(np.abs(w).max() / 127)
    w_q = np.clip(np.rint(w / w_scale), -127, 127).astype(np.int8)
    inits = [
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(np.array(w_scale, np.float32), "w_s"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_s"),
        numpy_helper.from_array(np.array(0, np.int8), "zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "zp"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_s", "zp"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "zp"], ["w_dq"]),
        helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"]),
    ]
    qdq = helper.make_graph(nodes, "qdq", [x_info], [y_info], inits)
    paths = []
    for g in (fp32, qdq):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        p = tmp_path / f"{g.name}.onnx"
        onnx.save(m, str(p))
        paths.append(p)
    return paths[0], paths[1], rng.normal(0, 1, (8, 64)).astype(np.float32)


def test_ort_speed_pair(tmp_path):
    fp32, qdq, x = _models(tmp_path)
    r = ort_speed(fp32, qdq, {"x": x}, runs=5, warmup=1, threads=1)
    assert r.fp32.backend == r.qdq.backend == "cpu-onnxruntime"
    assert r.fp32.note == ORT_NOTE and r.fp32.runs == 5 and len(r.qdq.samples_ms) == 5
    assert r.p50_speedup == pytest.approx(r.fp32.p50_ms / r.qdq.p50_ms)
    assert r.fp32_file_bytes == fp32.stat().st_size and r.threads == 1
    assert r.size_ratio == pytest.approx(fp32.stat().st_size / qdq.stat().st_size)
    assert r.size_ratio > 2  # int8 weights: the QDQ file is much smaller
    assert r.qdq.peak_memory_bytes is not None


def test_ort_speed_errors(tmp_path):
    fp32, qdq, x = _models(tmp_path)
    with pytest.raises(InputError, match="takes inputs"):
        ort_speed(fp32, qdq, {"wrong": x}, runs=1, warmup=0, memory=False)
    with pytest.raises(InputError, match="not found"):
        ort_speed(tmp_path / "missing.onnx", qdq, {"x": x}, runs=1)


def test_onnx_speed_skips_a_candidate_without_int8_modules():
    # An fp16/fp32 candidate would export the same fp32 graph twice: no figure, and a note says why.
    from opsnn_quant.evaluation.ort_figure import onnx_speed
    from opsnn_quant.evaluation.suite import load_suite
    from opsnn_quant.models.generic import GenericAdapter
    from tests.tiny_models import TinyMLP

    model = TinyMLP()
    adapter = GenericAdapter(model, {"": "denoiser"}, lambda m: m(*model.example_inputs()))
    notes: list[str] = []
    assert onnx_speed(adapter, [{}], load_suite("shapes-t2i"), notes) is None
    assert any("no int8 modules" in n for n in notes)


@pytest.mark.parametrize("saturates", [True, False])
def test_ort_speed_sessions_keep_the_int8_saturation_guard(tmp_path, monkeypatch, saturates):
    # ORT's fused U8S8 GEMM saturates int16 pair sums on x86 CPUs without VNNI: there the speed
    # figure must not run int8 weights fused (its outputs would be wrong), exactly as every other
    # ORT session of the package (formats.atc.onnx.runtime.onnxruntime_session) does.
    from opsnn_quant.evaluation import ort_speed as mod
    from opsnn_quant.formats.atc.onnx import runtime as onnx_runtime

    monkeypatch.setattr(onnx_runtime, "ort_int8_weights_saturate", lambda: saturates)
    _, qdq, _ = _models(tmp_path)
    options = mod._session(qdq, threads=1).get_session_options()
    try:
        disabled = options.get_session_config_entry("session.disable_quant_qdq")
    except RuntimeError:  # ORT raises for a key that was never set
        disabled = ""
    assert disabled == ("1" if saturates else "")
    assert options.intra_op_num_threads == 1
