"""ONNX graphs for ATC (TorchScript exporter): a graph past the external-data threshold."""

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from opsnn_quant.deploy.onnx_fast import export_graph


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
