"""``calibrate --engine amct``: per-root hand-off, checked with the STAND-IN amct_pytorch module.

The stand-in (tests/policy/test_amct.py) records AMCT API calls; it quantizes nothing.
"""

import sys

import torch
from torch import nn

from opsnn_quant.amct.handoff import run_amct_roots, scope_policy
from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.policy.schema import PrecisionPolicy, Rule
from opsnn_quant.types import Precision
from tests.amct.test_run import _standin
from tests.tiny_models import TinyMLP


class TwoPart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = TinyMLP(seed=1)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


POLICY = PrecisionPolicy(
    model="two-part",
    target="ascend910b-atc",
    modalities={"encoder": "audio_encoder", "head": "text_decoder"},
    rules=[
        Rule(match="encoder.fc1", precision=Precision.W8A8),
        Rule(match="encoder.*", precision=Precision.FP16, reason="fallback"),
        Rule(match="head", precision=Precision.FP16),
    ],
)


def test_scope_policy_strips_the_root_prefix():
    model = TwoPart()
    names = [n for n, _ in model.named_modules()]
    scoped = scope_policy(POLICY, "encoder", names)
    assert [r.match for r in scoped.rules] == ["fc1", "*"]
    assert scoped.modalities == {"": "audio_encoder"}


def test_only_roots_with_int8_modules_go_to_amct(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setitem(sys.modules, "amct_pytorch", _standin(calls))
    model = TwoPart().eval()
    adapter = GenericAdapter(
        model,
        {"encoder": "audio_encoder", "head": "text_decoder"},
        lambda m: [m(torch.randn(2, 4, 64)) for _ in range(3)],
        roots={"audio_encoder": "encoder", "text_decoder": "head"},
    )
    runs = run_amct_roots(adapter, POLICY, adapter.forward_loop(), tmp_path / "amct", batch_num=3)
    assert list(runs) == ["encoder"]
    assert [c[0] for c in calls] == ["create_quant_config", "quantize_model", "save_model"]
    create = calls[0][1]
    assert create["model"] is model.encoder
    assert create["input_data"][0].shape == (2, 4, 64)
    assert (tmp_path / "amct" / "encoder" / "amct.cfg").is_file()
