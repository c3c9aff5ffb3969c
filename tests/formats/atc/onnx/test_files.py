"""save_onnx_atomic: inline below the limit, one ``.data`` file above it, streamed tensor files."""

from __future__ import annotations

import numpy as np
import pytest

from opsnn_quant.formats.atc.onnx.files import save_onnx_atomic

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402


def _model(weight: np.ndarray) -> object:
    w = numpy_helper.from_array(weight, "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, weight.shape[0]])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, weight.shape[1]])],
        [w],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_small_inline_large_to_one_data_file_and_streamed_files_read_back(tmp_path):
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    small = save_onnx_atomic(_model(w), tmp_path / "a" / "m.onnx")
    assert sorted(p.name for p in small.parent.iterdir()) == ["m.onnx"]
    big = save_onnx_atomic(_model(w), tmp_path / "b" / "m.onnx", external_data_bytes=1024)
    assert sorted(p.name for p in big.parent.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert (big.parent / "m.onnx.data").stat().st_size == w.nbytes
    # an exporter's output past 2 GiB: the proto names tensor files in another directory
    src = tmp_path / "exporter"
    src.mkdir()
    (src / "w.bin").write_bytes(b"\0" * 16 + w.tobytes())
    proto = _model(w)
    t = proto.graph.initializer[0]
    t.ClearField("raw_data")
    for key, value in (("location", "w.bin"), ("offset", "16"), ("length", str(w.nbytes))):
        e = t.external_data.add()
        e.key, e.value = key, value
    t.data_location = onnx.TensorProto.EXTERNAL
    streamed = save_onnx_atomic(proto, tmp_path / "c" / "m.onnx", external_from=src)
    for path in (small, big, streamed):
        loaded = onnx.load(str(path))
        assert np.array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), w)
    assert not [p for p in tmp_path.rglob(".m.onnx.*")]  # no temporary directory left


def test_a_non_proto_is_refused():
    with pytest.raises(TypeError, match=r"takes an onnx\.ModelProto"):
        save_onnx_atomic(b"not a model", "x.onnx")
