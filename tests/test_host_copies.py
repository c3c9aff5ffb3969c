"""No hot path copies activation-sized tensors to the host (``.cpu()``/``.numpy()``).

On an NPU every such copy is a device sync plus a transfer of the whole activation; the probe,
the observers, SmoothQuant and the quantized modules must keep activations where the model is
and bring back only small results (scalars, histograms, per-channel maxima). Counted here on the
CPU, where the same calls are made (and would be copies on a device).
"""

from __future__ import annotations

import torch
from torch import nn

from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.quant import gptq
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision
from tests.tiny_models import TinyAttention

ACTIVATION_ELEMENTS = 8 * 128 * 64  # one activation of the model below
SMALL = 8192  # histograms (2048 bins), per-channel vectors, scalars are below this


def test_probe_and_calibration_make_no_activation_sized_host_copy(monkeypatch):
    model = TinyAttention(dim=64)
    batches = [
        torch.randn(8, 128, 64, generator=torch.Generator().manual_seed(i)) for i in range(3)
    ]

    def loop(m: nn.Module) -> None:
        for x in batches:
            m(x)

    big: list[tuple[str, int]] = []
    real_cpu, real_numpy = torch.Tensor.cpu, torch.Tensor.numpy

    def cpu(self: torch.Tensor, *a, **k):  # type: ignore[no-untyped-def]
        if self.numel() > SMALL:
            big.append(("cpu", self.numel()))
        return real_cpu(self, *a, **k)

    def numpy(self: torch.Tensor, *a, **k):  # type: ignore[no-untyped-def]
        if self.numel() > SMALL:
            big.append(("numpy", self.numel()))
        return real_numpy(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    monkeypatch.setattr(torch.Tensor, "numpy", numpy)
    # GPTQ's column loop takes NumPy views of CPU tensors (no copy); a device's weights take
    # the torch loop: the path a device runs is the one checked here
    monkeypatch.setattr(gptq, "_columns_numpy", gptq._columns_torch)
    probe(model, loop, ProbeConfig(max_root_calls=2), modalities={"": "denoiser"})
    specs = {
        "to_q": QuantSpec(Precision.W8A8, smoothquant_alpha="auto"),
        "to_k": QuantSpec(Precision.W8A8, observer="mse"),
        "to_v": QuantSpec(Precision.W8A8, observer="percentile"),
        "ff1": QuantSpec(Precision.W8A8_DYNAMIC, smoothquant_alpha=0.5),
        "ff2": QuantSpec(Precision.W8A16),
    }
    q = quantize(model, specs, loop)
    q(batches[0])
    assert big == [], big
    # the counter works: an activation-sized copy is seen
    batches[0].cpu()
    assert big == [("cpu", ACTIVATION_ELEMENTS)]
