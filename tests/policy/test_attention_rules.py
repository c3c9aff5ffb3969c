"""``a8`` rules: int8 attention in a policy, resolved against attention modules only, run where
the target's engine runs the fused int8 attention (opsnn_quant/policy/schema.py, targets.py)."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.rule import Rule
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.targets import TARGETS, get_target
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.attention import QuantizedAttention
from opsnn_quant.types import Modality, Precision


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn1 = Attention(query_dim=64, heads=2, dim_head=32)
        self.ff = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(self.attn1(x))


def _policy(target: str, *rules: Rule) -> PrecisionPolicy:
    return PrecisionPolicy(
        model="toy",
        target=target,
        modalities={"": Modality.DENOISER},
        defaults={Modality.DENOISER: Precision.FP32},
        rules=list(rules),
    )


def test_which_targets_run_a8_is_their_engines_word() -> None:
    runs = {name for name, t in TARGETS.items() if t.can_run("SDPA", "a8")[0]}
    assert runs == {"ascend910b-eager", "cpu-reference"}
    ok, why = get_target("ascend910b-mindie-sd").can_run("SDPA", "a8")
    assert not ok and "cannot run a8" in why
    assert not get_target("ascend910b-eager").can_run("Linear", "a8")[0]
    assert not get_target("ascend910b-eager").can_run("SDPA", "w8a8")[0]


def test_an_a8_glob_takes_the_attention_and_a_w8a8_glob_its_linears() -> None:
    torch.manual_seed(0)
    model = _Block().eval()
    policy = _policy(
        "ascend910b-eager",
        Rule(match="*", precision=Precision.A8, reason="attention in int8"),
        Rule(match="*", precision=Precision.W8A8, reason="linears in int8"),
    )
    resolved = policy.resolved_for(model)
    assert resolved.modules["attn1"] == "SDPA"
    assert resolved.specs["attn1"].precision == Precision.A8  # type: ignore[union-attr]
    assert resolved.specs["attn1.to_q"].precision == Precision.W8A8  # type: ignore[union-attr]
    assert resolved.specs["ff"].precision == Precision.W8A8  # type: ignore[union-attr]
    xs = [torch.randn(2, 24, 64) for _ in range(2)]
    quantize(model, policy, lambda m: [m(x) for x in xs])
    assert isinstance(model.attn1, QuantizedAttention)
    assert type(model.attn1.to_q).__name__ == "QuantLinear"


def test_an_a8_rule_on_no_attention_and_a_target_without_it_are_refused() -> None:
    model = _Block().eval()
    only_linears = _policy("cpu-reference", Rule(match="ff", precision=Precision.A8))
    with pytest.raises(ConfigError, match=r"cannot be a8.*SDPA only"):
        only_linears.resolved_for(model)
    mindie = _policy("ascend910b-mindie-sd", Rule(match="attn1", precision=Precision.A8))
    with pytest.raises(ConfigError, match="cannot run a8"):
        mindie.resolved_for(model)


def test_a_policy_with_an_a8_rule_reads_back_as_written(tmp_path) -> None:
    policy = _policy(
        "ascend910b-eager",
        Rule(match="*attn1", precision=Precision.A8, reason="attention in int8"),
    )
    path = policy.save(tmp_path / "policy.yaml")
    text = path.read_text()
    assert "  a8: {precision: a8}\n" in text
    assert "- {match: '*attn1', preset: a8, reason: attention in int8}\n" in text
    again = PrecisionPolicy.load(path)
    assert again == policy


def test_the_budget_keeps_an_attention_float_with_its_reason() -> None:
    from opsnn_quant.policy.budget import Budget
    from opsnn_quant.policy.search import build_policy
    from tests.policy._factory import linear, report

    # relative noise: the attention 1e-3 (30 dB alone), the Linear 1e-6; a 40 dB denoiser cap
    # (1e-4) leaves room for the Linear only: the attention, the most noise per MAC, falls back
    rep = report(
        linear("blk.attn1", 1e-3, type_="SDPA", sqnr={"a8": 25.0}, e2e_scheme="a8"),
        linear("blk.ff", 1e-6),
    )
    target = get_target("ascend910b-eager")
    budget = Budget.model_validate({"limits": {"denoiser": {"min_sqnr_db": 40}},
                                    "min_int8_mac_share": 0.0})  # fmt: skip
    policy = build_policy(rep, budget, target)
    (kept,) = [r for r in policy.rules if r.match == "blk.attn1"]
    assert kept.precision == Precision.FP16
    assert kept.reason.startswith("fp16 fallback: est. contribution 1.00e-03 (a8, ")
    assert "denoiser is predicted at 60.0 dB (>= 40 dB)" in kept.reason
    (ff,) = [r for r in policy.rules if r.match == "blk.ff"]
    assert ff.precision == Precision.W8A8
    # without the cap, the attention is int8 like the rest
    loose = build_policy(rep, Budget.model_validate({"min_int8_mac_share": 0.0}), target)
    assert [r.precision for r in loose.rules if r.match == "blk.attn1"] == [Precision.A8]
