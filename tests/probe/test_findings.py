"""Seed-specific findings: softmax inputs in fp16, GELU exact vs tanh."""

import torch

from opsnn_quant.probe.api import ProbeConfig, probe
from tests.tiny_models import TinyAttention, TinyMLP, forward_loop_for


def test_findings_softmax_and_gelu():
    model = TinyAttention()
    with torch.no_grad():
        model.to_q.weight.mul_(30.0)
        model.to_k.weight.mul_(30.0)
    report = probe(
        model, forward_loop_for(model), ProbeConfig(w8a8=False), modalities={"": "denoiser"}
    )
    (finding,) = [f for f in report.findings if f.kind == "softmax_input"]
    assert finding.value > 11.09
    assert "without max-subtraction" in finding.verdict
    mlp = TinyMLP()
    report = probe(mlp, forward_loop_for(mlp), ProbeConfig(w8a8=False), modalities={"": "denoiser"})
    (gelu,) = [f for f in report.findings if f.kind == "gelu_tanh_approx"]
    assert gelu.value < 1e-3 and "safe" in gelu.verdict
