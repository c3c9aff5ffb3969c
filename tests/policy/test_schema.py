"""PrecisionPolicy: YAML round trip, errors with field and line, resolution, validate, quantize()."""

import pytest
import torch
from pydantic import BaseModel
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy import _yaml
from opsnn_quant.policy.rule import QuantFields, Rule
from opsnn_quant.policy.schema import PrecisionPolicy, derive_prefixes
from opsnn_quant.policy.targets import get_target
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
    with pytest.raises(
        ConfigError, match=r"cannot be w8a8: norm1 \(LayerNorm\); w8a8 runs on Conv2d/Linear only"
    ):
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
    policy = build_policy(rep, budget, get_target("ascend910b-atc"))
    # b (1e-2 > 1e-3) falls back: a alone, 40 dB predicted, half the MACs
    assert str(policy).splitlines() == [
        f"precision policy for tiny on ascend910b-atc: {len(policy.rules)} rules",
        "  denoiser       int8  int8  50% of its MACs, predicted 40.0 dB (>= 30 dB)",
    ]
    assert "PrecisionPolicy(" in repr(policy)


# issue 41 §2: sizes bounded before any work (a 10 MB glob took 203 s, 100 000 rules 165 s)


def _no_matching(monkeypatch):
    """Make every glob compile or match, and the rules' expansion, fail loudly."""
    import opsnn_quant.policy.rule as rule_mod
    import opsnn_quant.policy.schema as schema_mod

    def refuse(*a, **k):
        raise AssertionError("the policy was matched or built before its size was checked")

    monkeypatch.setattr(rule_mod, "glob_matcher", refuse)
    monkeypatch.setattr(schema_mod, "glob_matcher", refuse)
    monkeypatch.setattr("fnmatch.translate", refuse)
    monkeypatch.setattr("difflib.get_close_matches", refuse)


def test_a_glob_past_the_cap_is_refused_by_validation_before_any_matching(monkeypatch):
    from opsnn_quant.policy.rule import MAX_GLOB_CHARS

    _no_matching(monkeypatch)
    text = _policy().to_yaml().replace("match: fc2", f"match: '{'fc*' * MAX_GLOB_CHARS}'")
    with pytest.raises(ConfigError) as exc:
        PrecisionPolicy.from_yaml(text, source="policy.yaml")
    assert str(exc.value) == (
        f"policy.yaml: rules.1.match: String should have at most {MAX_GLOB_CHARS} characters "
        f"(line {_line(text, 'fc*fc*')})"
    )
    with pytest.raises(ValueError, match=f"at most {MAX_GLOB_CHARS} characters"):
        Rule(match="x" * (MAX_GLOB_CHARS + 1), precision=Precision.FP16)
    assert Rule(match="x" * MAX_GLOB_CHARS, precision=Precision.FP16)  # the cap itself is fine


def test_too_many_rules_are_refused_before_any_rule_is_built(monkeypatch):
    from opsnn_quant.policy import form
    from opsnn_quant.policy.schema import MAX_RULES

    _no_matching(monkeypatch)
    monkeypatch.setattr(form, "from_document", lambda *a: pytest.fail("rules were built"))
    lines = "".join(f"- {{match: m{i}, precision: fp16}}\n" for i in range(MAX_RULES + 1))
    text = "model: m\ntarget: cpu-reference\nrules:\n" + lines
    with pytest.raises(ConfigError) as exc:
        PrecisionPolicy.from_yaml(text, source="policy.yaml")
    assert str(exc.value) == (
        f"policy.yaml: rules: more than the {MAX_RULES} entries it may hold (line 3)"
    )
    # aliases do not get around it, nor a flow sequence
    text = "r: &r {match: m, precision: fp16}\nrules: [" + "*r, " * (MAX_RULES + 1) + "]\n"
    with pytest.raises(ConfigError, match=r"rules: more than the \d+ entries it may hold"):
        PrecisionPolicy.from_yaml(text)
    with pytest.raises(ValueError, match=f"at most {MAX_RULES} items"):
        _policy(rules=[Rule(match="fc1", precision=Precision.FP16)] * (MAX_RULES + 1))


class _Any(BaseModel):
    rules: list[object] = []


def test_the_rule_count_is_checked_on_parser_events_up_to_the_limit():
    data = "x: {rules: [1, 2, 3, 4]}\nrules:\n- a\n- [1, 2, 3, 4, 5]\n- {a: 1, b: 2}\n"
    # nested collections count as one entry each; a key of that name elsewhere is not counted
    assert _yaml.load_model(_Any, data, limits={"rules": 3}).rules == [
        "a",
        [1, 2, 3, 4, 5],
        {"a": 1, "b": 2},
    ]
    with pytest.raises(
        ConfigError, match=r"<string>: rules: more than the 2 entries it may hold \(line 2\)"
    ):
        _yaml.load_model(_Any, data, limits={"rules": 2})
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+"):  # reported as before
        _yaml.load_model(_Any, "rules: [1, 2\n", limits={"rules": 5})


def test_a_policy_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import opsnn_quant.policy.schema as schema_mod
    from opsnn_quant.policy.schema import MAX_POLICY_BYTES

    _no_matching(monkeypatch)
    monkeypatch.setattr(schema_mod, "read_text", lambda p: pytest.fail(f"{p} was read"))
    path = tmp_path / "policy.yaml"
    with path.open("wb") as f:
        f.truncate(MAX_POLICY_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(ConfigError) as exc:
        PrecisionPolicy.load(path)
    assert str(exc.value) == (
        f"{path} is {MAX_POLICY_BYTES + 1} bytes, more than the {MAX_POLICY_BYTES} a policy "
        f"file may hold (at most {schema_mod.MAX_RULES} rules)"
    )


def test_the_caps_hold_a_per_module_policy_of_the_largest_models():
    # One exact rule per module (the search's exact form) with the writer's longest reasons:
    # MAX_RULES of them fit in MAX_POLICY_BYTES, and MAX_RULES is far above the ~1000
    # Linear/Conv2d of FLUX, Wan or Whisper large.
    from opsnn_quant.policy.schema import MAX_POLICY_BYTES, MAX_RULES

    name = "transformer.transformer_blocks.{}.attn.to_add_out"
    reason = (
        "fp16 overflow: output absmax 1.2e+05 > 65504 (headroom 0.53); input absmax 9.9e+04 > "
        "65504 (headroom 0.66) -> fp32 (bf16 rel. error 3.1e-02 >= 0.01)"
    )
    rules = [
        Rule(match=name.format(i), precision=Precision.W8A8 if i % 2 else Precision.FP32,
             quant=QuantFields(smoothquant_alpha=0.5) if i % 2 else None, reason=reason)
        for i in range(100)
    ]  # fmt: skip
    per_rule = len(_policy(rules=rules).to_yaml().encode()) / len(rules)
    assert MAX_RULES * per_rule < MAX_POLICY_BYTES and MAX_RULES >= 10 * 1000


def test_a_search_that_would_write_more_rules_than_a_policy_holds_says_so(monkeypatch):
    import opsnn_quant.policy._rules as rules_mod
    from opsnn_quant.policy.budget import Budget
    from opsnn_quant.policy.search import build_policy

    from ._factory import linear, report

    rep = report(*(linear(f"blocks.{i}.fc", 1e-5) for i in range(4)))
    any_share = Budget(min_int8_mac_share=0.0)
    monkeypatch.setattr(rules_mod, "MAX_RULES", 3)
    # the compact form (its check against one rule per module is not held to the cap) fits
    assert len(build_policy(rep, any_share, get_target("cpu-reference")).rules) <= 3
    with pytest.raises(ConfigError, match=r"would hold 4 rules, more than the 3 a policy may hold"):
        build_policy(rep, any_share, get_target("cpu-reference"), compact=False)
