"""PrecisionPolicy: YAML round trip, errors with field and line, resolution, validate, quantize()."""

import pytest
import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy import _yaml
from opsnn_quant.policy.rule import QuantFields, Rule
from opsnn_quant.policy.schema import PrecisionPolicy, derive_prefixes
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.modules import QuantLinear
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision
from tests.tiny_models import TinyAttention, TinyMLP, forward_loop_for


def _policy(**kw):
    base = {
        "model": "tiny-mlp",
        "target": "cpu-reference",
        "modalities": {"": Modality.OTHER},
        "defaults": {Modality.OTHER: Precision.FP16},
        "rules": [
            Rule(
                match="fc1",
                precision=Precision.W8A8,
                quant=QuantFields(smoothquant_alpha=0.5),
                reason="a",
            ),
            Rule(match="fc2", precision=Precision.W8A8_DYNAMIC, reason="b"),
        ],
    }
    return PrecisionPolicy(**{**base, **kw})


def test_yaml_round_trip_is_byte_identical(tmp_path):
    p = _policy()
    text = p.to_yaml()
    assert p.to_yaml() == text
    q = PrecisionPolicy.from_yaml(text)
    assert q == p and q.to_yaml() == text
    path = p.save(tmp_path / "out" / "policy.yaml")
    assert path.read_text() == text
    assert PrecisionPolicy.load(path) == p
    assert [f.name for f in path.parent.iterdir()] == ["policy.yaml"]  # no temp file left


def _line(text, needle):
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_bad_field_names_the_field_and_the_line():
    text = _policy().to_yaml().replace("preset: w8a8_dynamic", "presett: w8a8_dynamic")
    with pytest.raises(ConfigError) as exc:
        PrecisionPolicy.from_yaml(text, source="policy.yaml")
    msg = str(exc.value)
    assert msg.startswith("policy.yaml: rules.1.presett: Extra inputs are not permitted")
    assert f"(line {_line(text, 'presett')})" in msg


def test_bad_value_names_the_field_and_the_line():
    # In a preset: reported there, not at each rule that names it.
    text = _policy().to_yaml().replace("smoothquant_alpha: 0.5}", "observer: maxmin}")
    with pytest.raises(ConfigError) as exc:
        PrecisionPolicy.from_yaml(text, source="p.yaml")
    assert str(exc.value).startswith("p.yaml: presets.w8a8-sq0.5.observer: Input should be")
    assert f"(line {_line(text, 'maxmin')})" in str(exc.value)
    # In a rule written with its own quant: block (schema 1, or by hand).
    v1 = text.replace("preset: w8a8-sq0.5", "precision: w8a8, quant: {observer: maxmin}")
    v1 = v1.replace("  w8a8-sq0.5: {precision: w8a8, observer: maxmin}\n", "")
    with pytest.raises(ConfigError) as exc:
        PrecisionPolicy.from_yaml(v1, source="p.yaml")
    assert "rules.0.quant.observer" in str(exc.value)
    assert f"(line {_line(v1, 'maxmin')})" in str(exc.value)


def test_yaml_syntax_error_has_a_line():
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+: expected ',' or ']'"):
        PrecisionPolicy.from_yaml("model: x\ntarget: [unclosed\n")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"target": "ascend999"},
            r"target: unknown target 'ascend999'; known targets: ascend910b-eager",
        ),
        ({"defaults": {"denoiser": "w8a8"}}, "defaults must be float"),
        ({"schema_version": 7}, "schema_version 7 is not supported"),
    ],
)
def test_invalid_policies(change, expected):
    data = {**_policy().model_dump(mode="json", exclude_none=True), **change}
    with pytest.raises(ConfigError, match=expected):
        PrecisionPolicy.from_yaml(_yaml.dump(data))


def test_quant_settings_need_int8_and_valid_specs():
    with pytest.raises(ValueError, match="need an int8 precision"):
        Rule(match="x", precision=Precision.FP16, quant=QuantFields())
    with pytest.raises(ValueError, match="w8a16 cannot use it"):
        Rule(match="x", precision=Precision.W8A16, quant=QuantFields(smoothquant_alpha=0.5))


def test_resolve_first_match_int8_skips_non_quantizable_then_prefix_default():
    p = PrecisionPolicy(
        model="m",
        target="cpu-reference",
        modalities={
            "te": Modality.TEXT_ENCODER,
            "unet": Modality.DENOISER,
            "unet.out": Modality.OTHER,
        },
        defaults={Modality.TEXT_ENCODER: Precision.FP16, Modality.OTHER: Precision.FP32},
        rules=[
            Rule(match="unet.a", precision=Precision.FP32, reason="pin"),
            Rule(match="unet.*", precision=Precision.W8A8, reason="bulk"),
        ],
    )
    names = ["te.fc", "unet.a", "unet.b", "unet.norm", "unet.out.fc", "misc"]
    types = {"te.fc": "Linear", "unet.a": "Linear", "unet.b": "Linear", "unet.norm": "LayerNorm",
             "unet.out.fc": "Linear", "misc": "Linear"}  # fmt: skip
    r = p.resolve(names, types)
    assert r["unet.a"] == (Precision.FP32, 0, "pin")
    assert r["unet.b"] == (Precision.W8A8, 1, "bulk")
    assert r["unet.out.fc"].precision == Precision.W8A8  # the glob still reaches it
    # the int8 glob does not reach the LayerNorm; the denoiser has no default -> float as loaded
    assert r["unet.norm"].rule == "unassigned" and r["unet.norm"].precision == Precision.FP32
    assert r["te.fc"] == (Precision.FP16, "default", "text_encoder default")
    assert r["misc"].rule == "unassigned"
    assert p.modality_of("unet.out.fc") == Modality.OTHER  # longest prefix wins


def test_derive_prefixes():
    entries = [("te.0", "text_encoder"), ("te.1", "text_encoder"), ("unet.a", "denoiser"),
               ("mix.a", "other"), ("mix.b.c", "denoiser")]  # fmt: skip
    assert derive_prefixes(entries) == {
        "te": Modality.TEXT_ENCODER, "unet": Modality.DENOISER,
        "mix.a": Modality.OTHER, "mix.b": Modality.DENOISER,
    }  # fmt: skip
    assert derive_prefixes([("a", "other"), ("b.c", "other")]) == {"": Modality.OTHER}


def test_validate_rule_matching_nothing_names_the_rule():
    p = _policy(rules=[Rule(match="fc3", precision=Precision.FP32)])
    with pytest.raises(
        ConfigError, match=r"rule 0 \(fp32 on 'fc3'\) matches no module.*did you mean 'fc[12]'"
    ):
        p.resolved_for(TinyMLP())


def test_validate_unknown_module_in_policy():
    p = _policy(rules=[Rule(match="encoder.layers.0.fc1", precision=Precision.W8A8)])
    with pytest.raises(ConfigError, match="matches no module of the model"):
        p.resolved_for(TinyMLP())


def test_validate_int8_on_layernorm():
    p = _policy(rules=[Rule(match="norm1", precision=Precision.W8A8)])
    with pytest.raises(ConfigError, match=r"cannot be int8: norm1 \(LayerNorm\)"):
        p.resolved_for(TinyAttention())


def test_validate_checks_the_target():
    conv = nn.Sequential(nn.Conv2d(4, 8, 3), nn.Flatten(), nn.Linear(8, 70000))
    p = PrecisionPolicy(
        model="m", target="ascend910b-eager", rules=[Rule(match="0", precision=Precision.W8A8)]
    )
    with pytest.raises(
        ConfigError, match=r"cannot run 1 module.*0 \(Conv2d, w8a8\).*only for Linear"
    ):
        p.resolved_for(conv)
    p = PrecisionPolicy(
        model="m", target="ascend910b-eager", rules=[Rule(match="2", precision=Precision.W8A8)]
    )
    with pytest.raises(ConfigError, match="n <= 65535, got 70000"):
        p.resolved_for(conv)
    p = PrecisionPolicy(
        model="m", target="ascend310p", rules=[Rule(match="1", precision=Precision.BF16)]
    )
    with pytest.raises(ConfigError, match="has no bfloat16"):
        p.resolved_for(conv)


def test_module_specs_drive_quantize():
    model = TinyMLP().eval()
    x = model.example_inputs()[0]
    with torch.no_grad():
        ref = model(x)
    policy = _policy()
    specs = policy.module_specs(model)
    assert specs["fc1"] == QuantSpec(Precision.W8A8, smoothquant_alpha=0.5)
    assert specs["fc2"] == QuantSpec(Precision.W8A8_DYNAMIC)
    assert specs["act"] == Precision.FP16
    quantize(model, policy, forward_loop_for(model))
    assert isinstance(model.fc1, QuantLinear) and isinstance(model.fc2, QuantLinear)
    assert model.fc2.spec.precision == Precision.W8A8_DYNAMIC
    with torch.no_grad():
        y = model(x)
    assert torch.nn.functional.cosine_similarity(y.flatten(), ref.flatten(), dim=0) > 0.99


def test_a_policy_resolved_once_quantizes_as_the_policy_does():
    policy = _policy()
    a, b = TinyMLP().eval(), TinyMLP().eval()
    inventory = {n: type(m).__name__ for n, m in a.named_modules() if n}
    resolved = policy.resolved(inventory)
    assert resolved.target.name == "cpu-reference" and resolved.modules == inventory
    assert resolved.int8() == {
        "fc1": QuantSpec(Precision.W8A8, smoothquant_alpha=0.5),
        "fc2": QuantSpec(Precision.W8A8_DYNAMIC),
    }
    assert resolved.resolution["act"].rule == "default"
    assert dict(resolved.specs) == dict(policy.resolved_for(a).specs)
    quantize(a, resolved, forward_loop_for(a))
    quantize(b, policy, forward_loop_for(b))
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ConfigError, match="the module inventory is empty"):
        policy.resolved({})


def test_resolve_earlier_glob_beats_later_exact_name():
    p = PrecisionPolicy(
        model="m",
        target="cpu-reference",
        rules=[
            Rule(
                match="n", precision=Precision.W8A8
            ),  # exact, but int8 does not apply to a LayerNorm
            Rule(match="u.*", precision=Precision.FP16),
            Rule(match="u.a", precision=Precision.FP32),
            Rule(match="*", precision=Precision.BF16),
            Rule(match="n", precision=Precision.FP32),
        ],
    )
    types = {"u.a": "Linear", "n": "LayerNorm", "x": "Linear"}
    r = p.resolve(["u.a", "n", "x"], types)
    assert (r["u.a"].precision, r["u.a"].rule) == (Precision.FP16, 1)
    assert (r["n"].precision, r["n"].rule) == (Precision.BF16, 3)
    assert (r["x"].precision, r["x"].rule) == (Precision.BF16, 3)


def test_quant_fields_are_quantspecs_fields_without_precision():
    import dataclasses

    spec_fields = [f for f in dataclasses.fields(QuantSpec) if f.name != "precision"]
    assert list(QuantFields.model_fields) == [f.name for f in spec_fields]
    for f in spec_fields:
        assert QuantFields.model_fields[f.name].default == f.default, f.name
    spec = QuantSpec("w8a8", activation_symmetric=False, observer="mse", smoothquant_alpha=0.4)
    fields = QuantFields.from_spec(spec)
    assert fields.to_spec(Precision.W8A8) == spec
    rule = Rule(match="fc1", precision=Precision.W8A8, quant=fields)
    assert rule.quant_spec() == spec


def test_printing_a_policy_shows_each_modalitys_decision():
    from opsnn_quant.policy.budget import Budget, ModalityLimit
    from opsnn_quant.policy.search import build_policy
    from tests.policy._factory import linear, report

    rep = report(linear("a", 1e-4), linear("b", 1e-2))
    budget = Budget(limits={"denoiser": ModalityLimit(min_sqnr_db=30.0)}, min_int8_mac_share=0.0)
    policy = build_policy(rep, budget, "ascend910b-atc")
    # b (1e-2 > 1e-3) falls back: a alone, 40 dB predicted, half the MACs
    assert str(policy).splitlines() == [
        f"precision policy for tiny on ascend910b-atc: {len(policy.rules)} rules",
        "  denoiser       int8  int8  50% of its MACs, predicted 40.0 dB (>= 30 dB)",
    ]
    assert "PrecisionPolicy(" in repr(policy)
