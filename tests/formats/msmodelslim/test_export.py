"""``-f msmodelslim-v1``: golden files, and every Linear configured once, with the right scheme,
by msModelSlim's own matching rule (``utils/config_map.py``: exact name or fnmatch glob)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import yaml

from opsnn_quant.formats.policy_files import export_policy, modules_from_model
from opsnn_quant.policy.schema import PrecisionPolicy
from tests.formats.test_policy_files import GOLDEN, GoldenNet

LLM_POLICY = """\
schema_version: 1
model: tiny-llm
target: ascend910b-eager
modalities: {'': text_decoder}
defaults: {text_decoder: fp16}
rules:
- {match: layers.3.fc2, precision: fp16, reason: sensitive}
- {match: 'layers.*.fc1', precision: w8a8_dynamic, reason: per-token}
- {match: lm_head, precision: w8a16, reason: weight only}
- {match: layers.0.q, precision: w8a8, quant: {smoothquant_alpha: auto}, reason: searched}
- {match: '*', precision: w8a8, quant: {smoothquant_alpha: 0.5}, reason: bulk}
"""
LAYER = ("q", "k", "v", "o", "fc1", "fc2")
LLM_MODULES = {f"layers.{i}.{p}": "Linear" for i in range(4) for p in LAYER} | {"lm_head": "Linear"}
# msModelSlim's Linear IR registry (msmodelslim/ir/*.py): (act scope, dtype, symmetric, method)
STATIC = ("per_tensor", "int8", True, "minmax")
DYNAMIC = ("per_token", "int8", True, "minmax")
WEIGHT_ONLY = ("per_tensor", "float", True, "none")
# the four QConfig enums of msmodelslim/ir/qal/qbase.py and the act methods of the registry
SCOPES = {
    "per_tensor",
    "per_channel",
    "per_group",
    "per_block",
    "per_token",
    "pd_mix",
    "per_head",
    "dual_scale",
}
DTYPES = {"float", "int8", "int4", "mxfp8", "mxfp4", "fp8_e4m3"}
METHODS = {"minmax", "histogram", "none", "ssz", "gptq"}


def _llm() -> tuple[PrecisionPolicy, dict[str, str]]:
    return PrecisionPolicy.from_yaml(LLM_POLICY), dict(LLM_MODULES)


def _golden_net() -> tuple[PrecisionPolicy, dict[str, str]]:
    return PrecisionPolicy.load(GOLDEN / "policy.yaml"), modules_from_model(GoldenNet())


CASES = [("msmodelslim_v1.yaml", _golden_net), ("msmodelslim_v1_llm.yaml", _llm)]


@pytest.mark.parametrize(("golden", "make"), CASES, ids=[c[0] for c in CASES])
def test_golden(golden, make, tmp_path):
    policy, modules = make()
    text = export_policy(policy, "msmodelslim-v1", modules).text
    assert text == (Path(GOLDEN) / golden).read_text()


def _matches(proc: dict, name: str) -> bool:
    def hit(patterns: list[str]) -> bool:
        return any(p == name or fnmatchcase(name, p) for p in patterns)

    return hit(proc.get("include") or []) and not hit(proc.get("exclude") or [])


def _act(proc: dict) -> tuple:
    a = proc["qconfig"]["act"]
    return (a["scope"], a["dtype"], a["symmetric"], a["method"])


def test_every_int8_linear_is_configured_once_with_its_scheme():
    policy, modules = _llm()
    doc = yaml.safe_load(export_policy(policy, "msmodelslim-v1", modules).text)
    assert doc["apiversion"] == "modelslim_v1"
    procs = doc["spec"]["process"]
    linear = [p for p in procs if p["type"] == "linear_quant"]
    for p in linear:
        for side in ("act", "weight"):
            c = p["qconfig"][side]
            assert set(c) == {"scope", "dtype", "symmetric", "method"}  # all required in code
            assert c["scope"] in SCOPES and c["dtype"] in DTYPES and c["method"] in METHODS
        assert p["qconfig"]["weight"] == {"scope": "per_channel", "dtype": "int8",
                                          "symmetric": True, "method": "minmax"}  # fmt: skip
    expected = {n: STATIC for n in LLM_MODULES} | {f"layers.{i}.fc1": DYNAMIC for i in range(4)}
    expected |= {"lm_head": WEIGHT_ONLY, "layers.3.fc2": None}
    for name, scheme in expected.items():
        hits = [p for p in linear if _matches(p, name)]
        assert len(hits) == (0 if scheme is None else 1), name
        if scheme is not None:
            assert _act(hits[0]) == scheme, name
    smooth = {p["type"]: p for p in procs if p["type"] != "linear_quant"}
    assert smooth["flex_smooth_quant"]["alpha"] is None  # "auto": searched by msModelSlim
    assert smooth["smooth_quant"]["alpha"] == 0.5
    assert [n for n in expected if _matches(smooth["flex_smooth_quant"], n)] == ["layers.0.q"]
    assert procs.index(smooth["smooth_quant"]) < procs.index(linear[0])  # outliers first
    assert doc["spec"]["save"] == [{"type": "ascendv1_saver", "part_file_size": 0}]


def test_a_diffusion_policy_covers_the_denoiser_with_relative_names():
    policy, modules = _golden_net()
    result = export_policy(policy, "msmodelslim-v1", modules)
    doc = yaml.safe_load(result.text)
    assert doc["apiversion"] == "multimodal_sd_modelslim_v1"
    linear = [p for p in doc["spec"]["process"] if p["type"] == "linear_quant"]
    assert {_act(p): p["include"] for p in linear} == {
        DYNAMIC: ["attn.to_q"],
        ("per_tensor", "int8", False, "histogram"): ["attn.to_k"],  # asymmetric, percentile
    }
    assert any("te.fc1, te.fc2" in n and "denoiser (unet) only" in n for n in result.notes)
    assert any("unet.down.0.conv" in n and "nn.Linear only" in n for n in result.notes)


ATTN_POLICY = """\
schema_version: 1
model: tiny-dit
target: ascend910b-eager
modalities: {'': denoiser}
defaults: {denoiser: fp16}
rules:
- {match: blocks.2.attn, precision: fp16, reason: sensitive}
- {match: blocks.0.attn, precision: a8, quant: {k_mean: true}, reason: searched}
- {match: 'blocks.*.attn', precision: a8, reason: searched}
- {match: '*', precision: w8a8_dynamic, reason: bulk}
"""


def test_int8_attention_is_one_fa3_quant_step_over_exactly_those_modules() -> None:
    modules = {}
    for i in range(4):
        modules[f"blocks.{i}"] = "Block"
        modules[f"blocks.{i}.attn"] = "SDPA"
        modules |= {f"blocks.{i}.attn.{p}": "Linear" for p in ("to_q", "to_k", "to_v")}
    result = export_policy(PrecisionPolicy.from_yaml(ATTN_POLICY), "msmodelslim-v1", modules)
    doc = yaml.safe_load(result.text)
    fa3 = [p for p in doc["spec"]["process"] if p["type"] == "fa3_quant"]
    assert len(fa3) == 1
    # msModelSlim's own default FA3 qconfig (fa3/processor.py l.68-71), all four fields
    assert fa3[0]["qconfig"] == {
        "scope": "per_head", "dtype": "int8", "symmetric": True, "method": "minmax"
    }  # fmt: skip
    assert fa3[0]["qconfig"]["scope"] in SCOPES and fa3[0]["qconfig"]["method"] in METHODS
    chosen = {n for n, t in modules.items() if t == "SDPA" and _matches(fa3[0], n)}
    assert chosen == {"blocks.0.attn", "blocks.1.attn", "blocks.3.attn"}
    # the Linears stay with linear_quant, never with the attention step
    linear = [p for p in doc["spec"]["process"] if p["type"] == "linear_quant"]
    assert all(_matches(linear[0], n) for n, t in modules.items() if t == "Linear")
    notes = "\n".join(result.notes)
    assert "1 int8 module(s) (blocks.0.attn): K-mean smoothing" in notes
    assert "3 attention module(s) in int8" in notes
