"""build_policy on hand-built reports whose decisions can be worked out by hand."""

import math

import pytest
import torch

from opsnn_quant.policy.budget import Budget, FinalCheckResult, FinalCheckSettings, ModalityLimit
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.summary import summarize
from opsnn_quant.policy.targets import get_target
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.modules import QuantLinear
from opsnn_quant.types import Modality, Precision
from tests.tiny_models import TinyAttention, forward_loop_for

from ._factory import linear, other, overflow_stats, report

DB30 = Budget(limits={Modality("denoiser"): ModalityLimit(min_sqnr_db=30.0)})


def _by_match(policy):
    return {r.match: r for r in policy.rules}


def _int8_names(policy, rep):
    types = {m.name: m.type for m in rep.modules}
    res = policy.resolve([m.name for m in rep.modules], types)
    return sorted(n for n, r in res.items() if r.precision.is_int8)


def test_three_modules_and_30_db_budget():
    # 30 dB allows noise 1e-3. Sum 2.6e-3 > 1e-3: the largest contribution per MAC (b, 2e-3,
    # equal MACs) falls back, leaving 0.6e-3 -> 32.22 dB. a and c stay int8.
    rep = report(linear("a", 0.5e-3), linear("b", 2e-3), linear("c", 1e-4))
    p = build_policy(rep, DB30, get_target("ascend910b-atc"))
    assert _int8_names(p, rep) == ["a", "c"]
    rules = _by_match(p)
    assert rules["b"].precision == Precision.FP16 and "fp16 fallback" in rules["b"].reason
    fig = p.figures[Modality.DENOISER]
    assert fig.chosen == "int8" and fig.noise == pytest.approx(0.6e-3)
    assert fig.predicted_sqnr_db == pytest.approx(-10 * math.log10(0.6e-3), abs=1e-3)
    assert fig.int8_mac_share == pytest.approx(2 / 3, abs=1e-4)


def test_cosine_limit_is_the_same_noise_budget():
    # cos >= 1/sqrt(1 + 1e-3) is a noise budget of 1e-3, as 30 dB.
    rep = report(linear("a", 0.5e-3), linear("b", 2e-3), linear("c", 1e-4))
    cos = 1 / math.sqrt(1 + 1e-3) + 1e-12
    p = build_policy(
        rep,
        Budget(limits={Modality("denoiser"): ModalityLimit(min_cosine=cos)}),
        get_target("ascend910b-atc"),
    )
    assert _int8_names(p, rep) == ["a", "c"]


def test_fallback_order_is_contribution_per_mac():
    # a adds more noise but saves 100x more MACs: b (6e-8 per MAC) goes first, and that is enough.
    rep = report(linear("a", 1e-3, macs=1_000_000), linear("b", 0.6e-3, macs=10_000))
    p = build_policy(rep, DB30, get_target("ascend910b-atc"))
    assert _int8_names(p, rep) == ["a"]


def test_readmits_what_still_fits():
    # Greedy by contribution/MAC removes c (3e-6/MAC) then a (9e-7/MAC): 0.5e-3 left. Re-admit
    # biggest first: a would make 1.4e-3 (no), c makes 0.8e-3 (yes). Final int8: b, c.
    rep = report(
        linear("a", 0.9e-3, macs=1_000),
        linear("b", 0.5e-3, macs=1_000_000),
        linear("c", 0.3e-3, macs=100),
    )
    p = build_policy(
        rep,
        Budget(
            limits={Modality("denoiser"): ModalityLimit(min_sqnr_db=30.0)}, min_int8_mac_share=0.0
        ),
    )
    assert _int8_names(p, rep) == ["b", "c"]
    assert p.figures[Modality.DENOISER].noise == pytest.approx(0.8e-3)


def test_best_scheme_per_target_and_first_order_rescaling():
    sq = {"w8a8": 30.0, "w8a8_smoothquant": 32.0, "w8a8_dynamic": 36.0}
    rep = report(linear("a", 1e-3, sqnr=sq, alpha=0.6), linear("b", 1e-5))
    eager = build_policy(rep, target=get_target("ascend910b-eager"), compact=False)
    a = _by_match(eager)["a"]
    assert a.precision == Precision.W8A8_DYNAMIC
    # 1e-3 measured under w8a8 at 30 dB; dynamic has 6 dB more SQNR: 1e-3 * 10**-0.6.
    assert "2.51e-04" in a.reason and "first order" in a.reason
    atc = build_policy(rep, target=get_target("ascend910b-atc"), compact=False)
    a = _by_match(atc)["a"]
    assert a.precision == Precision.W8A8 and a.quant.smoothquant_alpha == 0.6
    assert a.quant_spec().smoothquant_alpha == 0.6
    expected = 1e-3 * 10**-0.2 + 1e-5
    assert atc.figures[Modality.DENOISER].noise == pytest.approx(expected, rel=1e-5)


def test_end_to_end_scores_beat_local_sqnr_when_the_probe_has_them():
    # SmoothQuant has the best local SQNR, but the probe's end-to-end scores say plain w8a8 moves
    # the output least: the scores decide, and the module's noise is the plain scheme's score.
    sq = {"w8a8": 30.0, "w8a8_mse": 31.0, "w8a8_smoothquant": 34.0}
    m = linear("a", 4e-4, sqnr=sq, e2e_scheme="w8a8_smoothquant")
    scores = {"w8a8_smoothquant": 4e-4, "w8a8": 1e-4, "w8a8_mse": 2e-4}
    m = m.model_copy(update={"e2e": m.e2e.model_copy(update={"schemes": scores})})
    pol = build_policy(report(m), target=get_target("ascend910b-atc"), compact=False)
    a = _by_match(pol)["a"]
    assert a.precision == Precision.W8A8
    assert a.quant.observer == "minmax" and a.quant.smoothquant_alpha is None
    assert "least est. end-to-end noise of the schemes the target runs: 1.00e-04" in a.reason
    assert pol.figures[Modality.DENOISER].noise == pytest.approx(1e-4)


def test_module_that_never_ran_stays_float_and_says_so():
    idle = linear("enc", 1e-6).model_copy(update={"calls": 0, "e2e": None})
    pol = build_policy(
        report(linear("a", 1e-5), idle), target=get_target("ascend910b-atc"), compact=False
    )
    rule = _by_match(pol)["enc"]
    assert rule.precision == Precision.FP16
    assert "never ran" in rule.reason


def test_overflow_pins_with_evidence():
    rep = report(
        other("norm", "LayerNorm", **overflow_stats(rel_error_bf16=3e-3)), linear("a", 1e-5)
    )
    pin = _by_match(build_policy(rep, target=get_target("ascend910b-eager")))["norm"]
    assert pin.precision == Precision.BF16
    assert pin.reason.startswith(
        "fp16 overflow: output absmax 8.1e+04 > 65504 (headroom 0.81); inf/nan in 12 outputs"
    )
    assert "bf16 rel. error 3.0e-03 < 0.01" in pin.reason
    pin = _by_match(build_policy(rep, target=get_target("ascend310p")))["norm"]
    assert pin.precision == Precision.FP32 and "ascend310p-atc has no bf16" in pin.reason
    assert "saturates" in pin.reason
    loud = report(other("norm", "LayerNorm", **overflow_stats(rel_error_bf16=0.05)))
    pin = _by_match(build_policy(loud, target=get_target("ascend910b-eager")))["norm"]
    assert pin.precision == Precision.FP32 and "bf16 rel. error 5.0e-02 >= 0.01" in pin.reason
    # a flagged Linear is pinned, not quantized
    hot = report(linear("a", 1e-5, fp16=None), linear("b", 1e-5))
    hot.modules[0] = hot.modules[0].model_copy(
        update={"fp16": other("x", "Linear", **overflow_stats()).fp16}
    )
    assert _int8_names(build_policy(hot, target=get_target("ascend910b-atc")), hot) == ["b"]


def test_target_limits_and_mac_share():
    # On the eager target the Conv2d cannot be int8; it holds 80% of the MACs, so the Linear's
    # 20% is below min_int8_mac_share and the whole modality stays fp16.
    rep = report(linear("conv", 1e-5, type_="Conv2d", macs=800), linear("fc", 1e-5, macs=200))
    p = build_policy(rep, target=get_target("ascend910b-eager"))
    rules = _by_match(p)
    assert "ascend910b-eager runs w8a8 only for Linear, not Conv2d" in rules["conv"].reason
    assert rules["fc"].precision == Precision.FP16 and "20%" in rules["fc"].reason
    assert p.figures[Modality.DENOISER].chosen == "fp16"
    assert "whole modality fp16" in p.figures[Modality.DENOISER].note
    assert _int8_names(build_policy(rep, target=get_target("ascend910b-atc")), rep) == [
        "conv",
        "fc",
    ]


def test_rules_order_compaction_and_determinism():
    rep = report(
        other("te.norm", "LayerNorm", modality="text_encoder", **overflow_stats(0.5)),
        linear("te.fc1", 1e-5, modality="text_encoder"),
        linear("te.fc2", 1e-5, modality="text_encoder"),
        linear("unet.a", 0.5e-3), linear("unet.b", 2e-3), linear("unet.c", 1e-4),
        linear("unet.d", 1e-5, sqnr={"w8a8": 30.0, "w8a8_mse": 31.0}),
    )  # fmt: skip
    p = build_policy(rep, DB30, get_target("ascend910b-atc"))
    assert [(r.match, r.precision.value) for r in p.rules] == [
        ("te.norm", "fp32"),
        ("unet.b", "fp16"),
        ("unet.d", "w8a8"),  # mse observer: differs from the bulk, named before the globs
        ("te.*", "w8a8"),
        ("unet.*", "w8a8"),
    ]
    assert _by_match(p)["unet.d"].quant.observer == "mse"
    assert p.modalities == {"te": Modality.TEXT_ENCODER, "unet": Modality.DENOISER}
    again = build_policy(rep, DB30, get_target("ascend910b-atc"))
    assert again.to_yaml() == p.to_yaml()
    assert PrecisionPolicy.from_yaml(p.to_yaml()).to_yaml() == p.to_yaml()
    rows = {r.modality: r for r in summarize(p.resolved(rep.inventory()), rep)}
    te, den = rows[Modality.TEXT_ENCODER], rows[Modality.DENOISER]
    assert (te.fp32, te.fp16, te.int8, te.chosen) == (1, 0, 2, "int8")
    assert (den.fp16, den.int8) == (1, 3) and den.int8_mac_share == pytest.approx(0.75)


def test_final_check_falls_back_more_and_is_bounded():
    rep = report(linear("a", 0.1e-3), linear("b", 0.2e-3), linear("c", 0.3e-3))
    seen = []

    def check(policy):
        n = len(_int8_names(policy, rep))
        seen.append(n)
        return FinalCheckResult(
            passed=n <= 2, metric="clip", delta=0.1 * n, modalities=(Modality.DENOISER,)
        )

    p = build_policy(
        rep, Budget(min_int8_mac_share=0.0), get_target("cpu-reference"), final_check=check
    )
    assert seen == [3, 2]  # tightened by 3 dB: noise 6e-4 -> cap 3e-4, c falls back
    assert _int8_names(p, rep) == ["a", "b"]
    assert p.notes[0].startswith("final check 1 failed (clip, delta 0.3)")
    assert p.notes[1].startswith("final check 2 passed")

    calls = []

    def never(policy):
        calls.append(1)
        return FinalCheckResult(passed=False, metric="clip")

    settings = FinalCheckSettings(metric="clip", max_delta=0.01, max_iterations=2, tighten_db=0.5)
    p = build_policy(rep, Budget(final_check=settings, min_int8_mac_share=0.0), final_check=never)
    assert len(calls) == 3  # two tightening rounds, then the modality is forced to fp16
    assert _int8_names(p, rep) == [] and p.figures[Modality.DENOISER].chosen == "fp16"
    assert "final check still failing after 2 attempt(s)" in p.figures[Modality.DENOISER].note


def test_policy_from_search_validates_and_quantizes_a_real_model():
    model = TinyAttention().eval()
    names = [n for n, m in model.named_modules() if n]
    mods = []
    for n in names:
        kind = type(model.get_submodule(n)).__name__
        if kind == "Linear":
            mods.append(
                linear(
                    n,
                    1e-4,
                    modality="text_encoder",
                    macs=4096,
                    sqnr={"w8a8": 30.0, "w8a8_dynamic": 31.0},
                )
            )
        else:
            mods.append(other(n, kind, modality="text_encoder", macs=64))
    rep = report(*mods)
    # Dynamic (31 dB) wins: each Linear adds 1e-4 * 10**-0.1 = 7.94e-5. 35 dB allows 3.16e-4:
    # three fit (2.38e-4), four would not (3.18e-4).
    budget = Budget(
        limits={Modality("text_encoder"): ModalityLimit(min_sqnr_db=35.0)}, min_int8_mac_share=0.4
    )
    p = build_policy(rep, budget, get_target("ascend910b-eager"))
    resolved = p.resolved_for(model).resolution
    assert sum(r.precision == Precision.W8A8_DYNAMIC for r in resolved.values()) == 3
    quantize(model, p, forward_loop_for(model))
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 3
    with torch.no_grad():
        assert torch.isfinite(model(*model.example_inputs())).all()


def test_every_scheme_infeasible_pins_the_module_even_unflagged():
    # The fp16 probe did not flag it (a margin case), but every int8 candidate overflowed its
    # fp16 output: the module cannot be int8 and fp16 is no safer, so it is pinned.
    from opsnn_quant.probe.report import SchemeError

    bad = linear("blocks.0.fc", 1e-3)
    bad = bad.model_copy(
        update={
            "w8a8": {
                "w8a8": SchemeError(
                    sqnr_db=None, cosine=0.0, infeasible="3 inf/nan outputs: ...",
                    fits_output_dtype="bfloat16",
                )
            },
            "e2e": None,
        }
    )  # fmt: skip
    ok = linear("blocks.1.fc", 1e-3)
    policy = build_policy(report(bad, ok), Budget(), get_target("ascend310p"))
    rule = next(r for r in policy.rules if r.match == "blocks.0.fc")
    assert rule.precision == Precision.FP32
    assert "int8 output overflows fp16 under every scheme" in rule.reason


def test_the_search_picks_w4a16_where_the_target_runs_it_and_writes_its_group_size():
    from opsnn_quant.probe.report import EndToEnd

    m = linear("blocks.0.fc", 1e-4, sqnr={"w8a8": 30.0, "w4a16": 36.0})
    m = m.model_copy(
        update={
            "e2e": EndToEnd(
                scheme="w8a8", contribution=1e-4, rank=1, schemes={"w8a8": 1e-4, "w4a16": 2e-5}
            )
        }
    )
    other = linear("blocks.1.fc", 1e-4)
    eager = build_policy(report(m, other), Budget(), get_target("ascend910b-eager"))
    rule = next(r for r in eager.rules if r.match == "blocks.0.fc")
    assert rule.precision == Precision.W4A16 and rule.quant_spec().group_size == 128
    assert "group_size: 128" in eager.to_yaml()
    atc = build_policy(
        report(m, other), Budget(), get_target("ascend910b-atc")
    )  # no int4 path there
    assert all(r.precision != Precision.W4A16 for r in atc.rules)


# ---- engines as targets -------------------------------------------------------------------


def test_an_engine_targets_specs_carry_its_arithmetic_and_dtype():
    rep = report(linear("a", 1e-5, sqnr={"w8a8": 35.0, "w8a8_smoothquant": 38.0}),
                 linear("b", 1e-5, sqnr={"w8a8": 35.0, "w8a8_dynamic": 36.0}))  # fmt: skip
    mindie = build_policy(rep, DB30, get_target("ascend910b-mindie-sd"), compact=False)
    specs = {r.match: r.quant_spec() for r in mindie.rules}
    assert {s.engine for s in specs.values()} == {"mindie-sd"}
    assert {s.output_dtype for s in specs.values()} == {"bfloat16"}
    # MindIE-SD applies SmoothQuant at run time (mul_scale): the smoothed scheme may win
    assert specs["a"].smoothquant_alpha == 0.5
    vllm = build_policy(rep, DB30, get_target("ascend910b-vllm-ascend"), compact=False)
    vspecs = {r.match: r.quant_spec() for r in vllm.rules}
    # vLLM-Ascend has no run-time smoothing: the search never offers it a smoothed scheme
    assert all(s.engine == "vllm-ascend" and s.smoothquant_alpha is None for s in vspecs.values())


def test_vllm_fused_qkv_take_one_scheme_or_stay_float_together():
    # q prefers static (35 dB), k and v dynamic; summed over the three, dynamic is smaller:
    # 3e-5 (static q) + 2 * 1e-4 (static k, v) vs 2e-5 + 2 * 1e-5 (dynamic each)
    mods = [
        linear("layer.attn.q_proj", 3e-5, sqnr={"w8a8": 35.0, "w8a8_dynamic": 33.2}),
        linear("layer.attn.k_proj", 1e-4, sqnr={"w8a8": 35.0, "w8a8_dynamic": 45.0}),
        linear("layer.attn.v_proj", 1e-4, sqnr={"w8a8": 35.0, "w8a8_dynamic": 45.0}),
        linear("layer.mlp.fc1", 1e-5),
    ]
    rep = report(*mods)
    p = build_policy(rep, Budget(min_int8_mac_share=0.0), get_target("ascend910b-vllm-ascend"),
                     compact=False)  # fmt: skip
    precision = {r.match: r.precision for r in p.rules}
    # dynamic: q 3e-5 * 10^0.18 = 4.5e-5, k and v 1e-4 * 10^-1 = 1e-5 each: 6.5e-5 < 2.3e-4
    assert [precision[f"layer.attn.{n}"] for n in ("q_proj", "k_proj", "v_proj")] == [
        Precision.W8A8_DYNAMIC
    ] * 3
    assert precision["layer.mlp.fc1"] == Precision.W8A8
    # a budget only two of them fit: the fused layer falls back whole
    tight = Budget(limits={Modality("denoiser"): ModalityLimit(min_sqnr_db=45.0)},
                   min_int8_mac_share=0.0)  # fmt: skip
    p = build_policy(rep, tight, get_target("ascend910b-vllm-ascend"), compact=False)
    precision = {r.match: r.precision for r in p.rules}
    assert {precision[f"layer.attn.{n}"] for n in ("q_proj", "k_proj", "v_proj")} == {
        Precision.FP16
    }
    assert precision["layer.mlp.fc1"] == Precision.W8A8


def test_resolved_refuses_a_split_fused_layer_and_another_engines_arithmetic():
    from opsnn_quant.errors import ConfigError
    from opsnn_quant.policy.rule import QuantFields, Rule

    modules = {f"attn.{n}": "Linear" for n in ("q_proj", "k_proj", "v_proj")}
    vllm = QuantFields(engine="vllm-ascend", output_dtype="bfloat16")
    split = PrecisionPolicy(
        model="m", target="ascend910b-vllm-ascend", modalities={"": Modality.DENOISER},
        defaults={Modality.DENOISER: Precision.FP16},
        rules=[Rule(match="attn.q_proj", precision=Precision.W8A8, quant=vllm),
               Rule(match="attn.k_proj", precision=Precision.W8A8_DYNAMIC, quant=vllm)],
    )  # fmt: skip
    with pytest.raises(ConfigError, match="loads them as one fused layer of one quant type"):
        split.resolved(modules)
    plain = split.model_copy(update={"rules": [Rule(match="attn.*", precision=Precision.W8A8)]})
    with pytest.raises(ConfigError, match="runs vllm-ascend's arithmetic; the rule's quant"):
        plain.resolved(modules)
    together = split.model_copy(
        update={"rules": [Rule(match="attn.*", precision=Precision.W8A8, quant=vllm)]}
    )
    assert len(together.resolved(modules).int8()) == 3


def test_a_head_tied_to_an_embedding_stays_float_where_the_engine_loads_it_so():
    # vLLM skips Whisper's proj_out.* tensors and ties the head to the float embedding
    # (vllm 0.23.0 whisper.py load_weights / tie_weights): a quantized proj_out broke decoding.
    from opsnn_quant.errors import ConfigError
    from opsnn_quant.policy.baselines import naive_policy
    from opsnn_quant.policy.rule import Rule

    head = linear("proj_out", 1e-9).model_copy(update={"tied_to": "model.decoder.embed_tokens"})
    rep = report(linear("model.decoder.fc1", 1e-9), head)
    assert rep.tied() == {"proj_out": "model.decoder.embed_tokens"}
    p = build_policy(
        rep, Budget(min_int8_mac_share=0.0), get_target("ascend910b-vllm-ascend"), compact=False
    )
    rules = {r.match: r for r in p.rules}
    assert rules["model.decoder.fc1"].precision.is_int8
    assert rules["proj_out"].precision == Precision.FP16
    assert rules["proj_out"].reason == (
        "stays float: tied to model.decoder.embed_tokens: vLLM loads a head tied to an "
        "embedding from that embedding, in float (it skips the head's own tensors; a "
        "quantized head would transpose the shared embedding)"
    )
    # an engine that loads the head's own tensors may quantize it
    eager = build_policy(
        rep, Budget(min_int8_mac_share=0.0), get_target("ascend910b-eager"), compact=False
    )
    assert {r.match: r for r in eager.rules}["proj_out"].precision.is_int8
    # the naive baselines leave it out too
    naive = naive_policy(rep, get_target("ascend910b-vllm-ascend"), "all-w8a8-dynamic")
    assert [r.match for r in naive.rules] == ["model.decoder.fc1"]
    # and a hand-written policy that quantizes it is refused for that engine only
    mine = PrecisionPolicy(
        model="tiny", target="ascend910b-vllm-ascend",
        rules=[Rule(match="*", precision=Precision.W8A8_DYNAMIC, reason="mine")],
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"proj_out \(Linear, w8a8_dynamic\): tied to model"):
        mine.resolved(rep.inventory(), rep.weight_shapes(), tied=rep.tied())
    mine.model_copy(update={"target": "ascend910b-eager"}).resolved(
        rep.inventory(), rep.weight_shapes(), tied=rep.tied()
    )


def test_ties_are_found_by_the_parameter_an_embedding_shares():
    from torch import nn

    from opsnn_quant.quant.api import tied_to_embeddings

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight  # tied, as tie_word_embeddings does
            self.other = nn.Linear(4, 10, bias=False)  # same shape, own weight
            with torch.no_grad():
                self.other.weight.copy_(self.embed.weight)

    assert tied_to_embeddings(Tiny()) == {"head": "embed"}
