"""SmoothQuant folded into the norm on a target without run-time smoothing (vLLM-Ascend): one
factor per smoothing group, decided on hand-built reports (opsnn_quant/policy/_folded.py)."""

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.budget import Budget, ModalityLimit
from opsnn_quant.policy.rule import QuantFields, Rule
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.types import Modality, Precision

from ._factory import linear, other, report

VLLM = get_target("ascend910b-vllm-ascend")
ANY = Budget(min_int8_mac_share=0.0)
QKV = [f"layer.attn.{n}" for n in ("k_proj", "q_proj", "v_proj")]


def _specs(policy):
    return {r.match: r.quant_spec() for r in policy.rules if r.precision.is_int8}


def _qkv(q_alpha=0.5, smooth_db=40.0):
    # plain w8a8 at 30 dB adds 1e-4 each; smoothed at 40 dB, 1e-4 * 10^-1 = 1e-5 each
    sq = {"w8a8": 30.0, "w8a8_smoothquant": smooth_db}
    return [
        linear("layer.attn.k_proj", 1e-4, sqnr=sq),
        linear("layer.attn.q_proj", 1e-4, sqnr=sq, alpha=q_alpha),
        linear("layer.attn.v_proj", 1e-4, sqnr=sq),
    ]


def test_a_group_shares_one_smoothed_scheme_and_the_rest_is_not_smoothed():
    fc1 = linear("layer.mlp.fc1", 1e-4, sqnr={"w8a8": 30.0, "w8a8_smoothquant": 40.0})
    rep = report(*_qkv(), fc1).model_copy(update={"smoothing_groups": {"layer.ln": QKV}})
    p = build_policy(rep, ANY, VLLM, compact=False)
    specs = _specs(p)
    # 3e-5 smoothed < 3e-4 plain: the group is smoothed, one alpha
    assert {specs[n].smoothquant_alpha for n in QKV} == {0.5}
    # fc1 is fed by no norm of a group (e.g. after a GELU): vLLM has nowhere to apply a factor
    assert specs["layer.mlp.fc1"].smoothquant_alpha is None
    assert p.smoothing_groups == {"layer.ln": QKV}
    # the same report without the probe's groups: nothing is smoothed
    plain = build_policy(rep.model_copy(update={"smoothing_groups": {}}), ANY, VLLM)
    assert plain.smoothing_groups == {}
    assert all(s.smoothquant_alpha is None for s in _specs(plain).values())


def test_members_measured_with_different_alphas_are_not_one_factor():
    rep = report(*_qkv(q_alpha=0.75)).model_copy(update={"smoothing_groups": {"layer.ln": QKV}})
    p = build_policy(rep, ANY, VLLM, compact=False)
    assert all(s.smoothquant_alpha is None for s in _specs(p).values()) and len(_specs(p)) == 3
    assert p.smoothing_groups == {}


def test_a_tie_keeps_the_group_unsmoothed():
    rep = report(*_qkv(smooth_db=30.0)).model_copy(update={"smoothing_groups": {"layer.ln": QKV}})
    p = build_policy(rep, ANY, VLLM, compact=False)
    assert all(s.smoothquant_alpha is None for s in _specs(p).values())


def test_a_fused_layer_reaching_outside_the_group_is_not_smoothed():
    # Whisper's cross-attention: its norm feeds q_proj alone; k_proj / v_proj take the encoder
    # output; vLLM fuses the three, so q_proj cannot be smoothed alone
    rep = report(*_qkv()).model_copy(
        update={"smoothing_groups": {"layer.cross_ln": ["layer.attn.q_proj"]}}
    )
    p = build_policy(rep, ANY, VLLM, compact=False)
    specs = _specs(p)
    assert {specs[n].precision for n in QKV} == {Precision.W8A8}
    assert all(specs[n].smoothquant_alpha is None for n in QKV) and p.smoothing_groups == {}


def test_a_member_may_fall_back_while_the_others_stay_smoothed():
    mods = [
        other("l.ln", "LayerNorm"),
        linear("l.a", 1e-4, sqnr={"w8a8": 30.0, "w8a8_smoothquant": 40.0}),
        linear("l.b", 1e-3, sqnr={"w8a8": 30.0, "w8a8_smoothquant": 33.0}, macs=10),
    ]
    rep = report(*mods).model_copy(update={"smoothing_groups": {"l.ln": ["l.a", "l.b"]}})
    # smoothed: 1e-5 + 1e-3 * 10^-0.3 = 5.1e-4; 35 dB allows 3.16e-4: b (tiny MACs) falls back
    tight = Budget(limits={Modality("denoiser"): ModalityLimit(min_sqnr_db=35.0)},
                   min_int8_mac_share=0.0)  # fmt: skip
    p = build_policy(rep, tight, VLLM, compact=False)
    specs = _specs(p)
    assert list(specs) == ["l.a"] and specs["l.a"].smoothquant_alpha == 0.5
    assert p.smoothing_groups == {"l.ln": ["l.a", "l.b"]}  # b, float, absorbs s in its weight
    resolved = p.resolved(rep.inventory())
    assert resolved.smoothing_groups == {"l.ln": ["l.a", "l.b"]}


def _policy(rules, groups):
    return PrecisionPolicy(
        model="m", target=VLLM.name, modalities={"": Modality.DENOISER},
        defaults={Modality.DENOISER: Precision.FP16}, rules=rules, smoothing_groups=groups,
    )  # fmt: skip


def test_resolved_checks_the_groups():
    modules = {"ln": "LayerNorm", "a": "Linear", "b": "Linear"}

    def rule(match, alpha):
        q = QuantFields(engine="vllm-ascend", output_dtype="bfloat16", smoothquant_alpha=alpha)
        return Rule(match=match, precision=Precision.W8A8, quant=q)

    ok = _policy([rule("a", 0.5), rule("b", 0.5)], {"ln": ["a", "b"]})
    assert len(ok.resolved(modules).int8()) == 2
    with pytest.raises(ConfigError, match="a smoothed Linear must be in a smoothing group"):
        _policy([rule("a", 0.5)], {}).resolved(modules)
    with pytest.raises(ConfigError, match="one fixed alpha"):
        _policy([rule("a", 0.5), rule("b", 0.25)], {"ln": ["a", "b"]}).resolved(modules)
    with pytest.raises(ConfigError, match="one fixed alpha"):  # an unsmoothed int8 member
        _policy([rule("a", 0.5), rule("b", None)], {"ln": ["a", "b"]}).resolved(modules)
    with pytest.raises(ConfigError, match="c is not a module of the model"):
        _policy([rule("a", 0.5)], {"ln": ["a", "c"]}).resolved(modules)


def test_groups_round_trip_through_the_yaml_and_are_absent_when_none():
    q = QuantFields(engine="vllm-ascend", output_dtype="bfloat16", smoothquant_alpha=0.5)
    p = _policy([Rule(match="a", precision=Precision.W8A8, quant=q)], {"ln": ["a", "b"]})
    text = p.to_yaml()
    assert "smoothing_groups:\n  ln:\n  - a\n  - b\n" in text
    assert PrecisionPolicy.from_yaml(text) == p
    assert "smoothing_groups" not in _policy([], {}).to_yaml()
