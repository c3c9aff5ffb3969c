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
