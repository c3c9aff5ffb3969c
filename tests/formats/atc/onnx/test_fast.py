"""ONNX graphs for ATC (TorchScript exporter): a graph past the external-data threshold."""

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from opsnn_quant.formats.atc.onnx.fast import export_graph, write_from_markers


def test_a_graph_past_the_threshold_keeps_its_weights_beside_it(tmp_path):
    # The threshold stands in for protobuf's 2 GiB (an SD 1.5 UNet in fp32 is 3.4 GB): the
    # weights go to <name>.data, the checker reads the file, and the graph still computes.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    x = torch.randn(2, 64)
    path = tmp_path / "g.onnx"
    export_graph(model, (x,), path, input_names=["x"], external_data_bytes=1000)
    assert (tmp_path / "g.onnx.data").stat().st_size >= 4 * (64 * 64 + 64 * 8)
    assert path.stat().st_size < 4 * 64 * 64  # the graph alone
    onnx.checker.check_model(str(path))
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_an_exporter_output_in_many_weight_files_is_streamed_into_one(tmp_path, monkeypatch):
    # Past 2 GiB the TorchScript exporter writes each weight to a file of its own: simulated
    # here by re-saving its graph that way. The graph comes out with one <name>.data, the
    # exporter's files gone, and computes the same.
    real = torch.onnx.export

    def export_in_pieces(model, inputs, f, **kwargs):
        real(model, inputs, f, **kwargs)
        onnx.save_model(onnx.load(f), f, save_as_external_data=True,
                        all_tensors_to_one_file=False, size_threshold=0)  # fmt: skip

    monkeypatch.setattr(torch.onnx, "export", export_in_pieces)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    x = torch.randn(2, 64)
    out = tmp_path / "out"
    export_graph(model, (x,), out / "g.onnx", input_names=["x"])
    assert sorted(p.name for p in out.iterdir()) == ["g.onnx", "g.onnx.data"]
    onnx.checker.check_model(str(out / "g.onnx"))
    got = ort.InferenceSession(str(out / "g.onnx")).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_kept_float_trace_writes_the_qdq_graph_a_fresh_trace_writes(tmp_path):
    # One trace per root (formats/atc/onnx/fast.py write_from_markers): the float graph is traced
    # with markers where the model is quantized, and that trace, rewritten from the quantized
    # modules, must be the same file as tracing the quantized model itself.
    import copy

    from opsnn_quant.quant.api import quantize
    from opsnn_quant.quant.modules import QuantModule
    from tests.tiny_models import TinyConvBlock, forward_loop_for

    float_model = TinyConvBlock().eval()
    x = float_model.example_inputs(seed=3)
    quantized = copy.deepcopy(float_model)
    quantize(quantized, {"*": "w8a8"}, forward_loop_for(quantized))
    qmods = {n: m for n, m in quantized.named_modules() if isinstance(m, QuantModule)}
    assert qmods
    floats = dict(float_model.named_modules())
    marked = {n: floats[n] for n in qmods}
    kept = export_graph(float_model, x, tmp_path / "f.onnx", input_names=["x"], marked=marked,
                        keep_markers=True)  # fmt: skip
    assert kept.markers is not None and set(kept.nodes) == set(qmods)
    with torch.no_grad():
        want = float_model(*x).numpy()
    got = ort.InferenceSession(str(tmp_path / "f.onnx")).run(None, {"x": x[0].numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    write_from_markers(kept.markers, qmods, tmp_path / "from_kept.onnx")
    export_graph(quantized, x, tmp_path / "fresh.onnx", input_names=["x"])
    assert (tmp_path / "from_kept.onnx").read_bytes() == (tmp_path / "fresh.onnx").read_bytes()


def test_the_weights_a_rewrite_adds_never_sit_in_the_proto_of_a_large_graph(tmp_path, monkeypatch):
    # formats/atc/onnx/fast.py _finish: the float weights of the marked modules go straight to files
    # (formats/atc/onnx/files.py spilled_tensor) and are streamed into <name>.data; protobuf kept a cleared
    # field's bytes in its arena, so a 3.4 GB UNet held them all at once. A small graph takes them
    # back: the same proto, byte for byte, as a rewrite in memory.
    from opsnn_quant.formats.atc.onnx.export import rewrite_markers
    from opsnn_quant.formats.atc.onnx.files import SPILL_BYTES

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    x = torch.randn(2, 64)
    marked = {"0": model[0], "2": model[2]}
    small = export_graph(model, (x,), tmp_path / "s" / "g.onnx", input_names=["x"], marked=marked,
                         keep_markers=True)  # fmt: skip
    assert small.markers is not None
    in_memory = onnx.ModelProto()
    in_memory.CopyFrom(small.markers)
    rewrite_markers(onnx, in_memory, marked)
    assert small.proto.SerializeToString() == in_memory.SerializeToString()
    assert (tmp_path / "s" / "g.onnx").read_bytes() == in_memory.SerializeToString()

    inline: list[int] = []
    real = onnx.numpy_helper.from_array

    def counting(arr, name=None):
        inline.append(arr.nbytes)
        return real(arr, name)

    monkeypatch.setattr(onnx.numpy_helper, "from_array", counting)
    path = tmp_path / "l" / "g.onnx"
    export_graph(model, (x,), path, input_names=["x"], marked=marked, external_data_bytes=1000)
    assert inline and max(inline) < SPILL_BYTES  # only the small shape constants were inline
    assert (tmp_path / "l" / "g.onnx.data").stat().st_size == 4 * (
        64 * 64 + 64 * 8
    )  # biases inline
    assert sorted(p.name for p in (tmp_path / "l").iterdir()) == ["g.onnx", "g.onnx.data"]
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
