"""Baseline strategies: naive all-W8A8 min/max and all-fp16."""

from opsnn_quant.policy.baselines import naive_policy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import ModuleSensitivity, SensitivityReport
from opsnn_quant.types import Precision


def _report():
    mods = [
        ModuleSensitivity(name="te.fc", type="Linear", modality="text_encoder", calls=2),
        ModuleSensitivity(name="te.ln", type="LayerNorm", modality="text_encoder", calls=2),
        ModuleSensitivity(name="unet.conv", type="Conv2d", modality="denoiser", calls=4),
        ModuleSensitivity(name="unet.proj", type="Linear", modality="denoiser", calls=4),
        ModuleSensitivity(name="vae.encoder.conv_in", type="Conv2d", modality="other", calls=0),
    ]
    return SensitivityReport(model="m", modules=mods)


def test_all_w8a8_minmax_takes_every_module_the_target_runs():
    eager = naive_policy(_report(), get_target("ascend910b-eager"), "all-w8a8-minmax")
    assert [(r.match, r.precision) for r in eager.rules] == [
        ("te.fc", Precision.W8A8),
        ("unet.proj", Precision.W8A8),
    ]
    atc = naive_policy(_report(), get_target("ascend910b-atc"), "all-w8a8-minmax")
    assert [r.match for r in atc.rules] == ["te.fc", "unet.conv", "unet.proj"]
    assert all(r.quant is None or r.quant.observer == "minmax" for r in atc.rules)


def test_all_fp16_has_no_int8_rule():
    p = naive_policy(_report(), get_target("cpu-reference"), "all-fp16")
    assert p.rules == []
    assert set(p.defaults.values()) == {Precision.FP16}


def test_summary_of_a_baseline_says_int8_where_its_rules_are():
    from opsnn_quant.policy.summary import summarize
    from opsnn_quant.types import Modality

    rep = _report()
    inv = rep.inventory()
    int8 = naive_policy(rep, get_target("ascend910b-eager"), "all-w8a8-minmax").resolved(inv)
    rows = {r.modality: r for r in summarize(int8, rep)}
    assert rows[Modality.TEXT_ENCODER].chosen == "int8" and rows[Modality.TEXT_ENCODER].int8 == 1
    assert rows[Modality.OTHER].chosen == "fp16" and rows[Modality.OTHER].int8 == 0
    fp16 = naive_policy(rep, get_target("cpu-reference"), "all-fp16").resolved(inv)
    fp16 = {r.modality: r for r in summarize(fp16, rep)}
    assert all(r.chosen == "fp16" for r in fp16.values())


def test_all_w8a8_dynamic_takes_every_module_the_target_runs_per_token():
    eager = naive_policy(_report(), get_target("ascend910b-eager"), "all-w8a8-dynamic")
    assert [(r.match, r.precision) for r in eager.rules] == [
        ("te.fc", Precision.W8A8_DYNAMIC),
        ("unet.proj", Precision.W8A8_DYNAMIC),  # no int8 conv op in torch_npu: the conv stays
    ]
    assert all(r.quant is None or not r.quant.smoothquant_alpha for r in eager.rules)
    ref = naive_policy(_report(), get_target("cpu-reference"), "all-w8a8-dynamic")
    assert [r.match for r in ref.rules] == ["te.fc", "unet.conv", "unet.proj"]
    # ATC's compiled graphs quantize with static scales only: nothing to take
    assert naive_policy(_report(), get_target("ascend910b-atc"), "all-w8a8-dynamic").rules == []


def test_int8_runnable_is_what_any_policy_can_put_in_int8_on_the_target():
    from opsnn_quant.policy.baselines import int8_runnable

    rep = _report()
    # eager 910B: Linears only (torch_npu has no int8 conv); the uncalled VAE conv never
    assert int8_runnable(rep, get_target("ascend910b-eager")) == ["te.fc", "unet.proj"]
    # ATC runs Conv2d in int8 too; a module that never ran still does not count
    assert int8_runnable(rep, get_target("ascend910b-atc")) == ["te.fc", "unet.conv", "unet.proj"]
    # vLLM-Ascend loads a head tied to the embedding float, whatever we write
    tied = rep.model_copy(
        update={"modules": [*rep.modules, ModuleSensitivity(
            name="proj_out", type="Linear", modality="text_decoder", calls=2,
            tied_to="model.decoder.embed_tokens")]}
    )  # fmt: skip
    assert "proj_out" not in int8_runnable(tied, get_target("ascend910b-vllm-ascend"))
    assert "proj_out" in int8_runnable(tied, get_target("ascend910b-eager"))
    # full coverage is exactly the naive baseline's modules where it runs everywhere
    full = naive_policy(rep, get_target("ascend910b-atc"), "all-w8a8-minmax")
    assert [r.match for r in full.rules] == int8_runnable(rep, get_target("ascend910b-atc"))
