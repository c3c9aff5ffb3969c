"""The policy file form (schema 2): presets named from their settings, one line per rule, and
schema 1 files from earlier releases read as the same policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.pipeline.calibrate import load_recipe_model
from opsnn_quant.pipeline.recipe import load_recipe
from opsnn_quant.policy.form import preset_name
from opsnn_quant.policy.rule import Rule
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.types import Modality, Precision

ZOO = Path(__file__).parent / "golden" / "zoo"


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"precision": "w8a8"}, "w8a8"),
        ({"precision": "w8a8", "observer": "mse", "smoothquant_alpha": 0.7}, "w8a8-mse-sq0.7"),
        (
            {"precision": "w8a8", "activation_symmetric": False, "percentile": 99.9},
            "w8a8-asym-p99.9",
        ),
        ({"precision": "w8a8", "smoothquant_alpha": "auto"}, "w8a8-sqauto"),
        ({"precision": "w8a8", "timestep_bounds": [0, 4, 8]}, "w8a8-t0.4.8"),
        ({"precision": "w4a16", "group_size": 64, "output_dtype": "bfloat16"}, "w4a16-bf16out-g64"),
        (
            {
                "precision": "w8a8",
                "engine": "mindie-sd",
                "output_dtype": "bfloat16",
                "smoothquant_alpha": 0.7,
            },
            "w8a8-sq0.7-bf16out-mindie-sd",
        ),
    ],
)
def test_preset_name_lists_what_differs_from_the_defaults(settings, name):
    assert preset_name(settings) == name


# The policies calibrate wrote for the three zoo recipes before presets (schema 1, one rule
# every 9 lines) and after (schema 2), from the same probe: same model, data and seed.
@pytest.mark.parametrize("recipe", ["shapes-t2i", "shapes-dit", "whisper-tiny-en"])
def test_schema1_and_schema2_files_of_the_zoo_resolve_identically(recipe):
    old = PrecisionPolicy.load(ZOO / f"{recipe}.schema1.yaml")
    new = PrecisionPolicy.load(ZOO / f"{recipe}.yaml")
    assert "schema_version: 1" in (ZOO / f"{recipe}.schema1.yaml").read_text()
    model = load_recipe_model(load_recipe(recipe)).model
    a, b = old.resolved_for(model), new.resolved_for(model)
    assert list(a.specs) == list(b.specs)
    assert dict(a.specs) == dict(b.specs)  # precision and every quant setting, module by module
    assert len(a.int8()) > 20
    # Only the form (and the shorter reasons) differ: the same rules in the same order.
    assert [(r.match, r.precision, r.quant) for r in old.rules] == [
        (r.match, r.precision, r.quant) for r in new.rules
    ]
    assert old.model_copy(update={"rules": new.rules}) == new


def test_the_demo_policy_is_short():
    lines = (ZOO / "shapes-t2i.yaml").read_text().splitlines()
    assert len(lines) <= 200
    assert len((ZOO / "shapes-t2i.schema1.yaml").read_text().splitlines()) > 700
    assert sum(line.startswith("- {match: ") for line in lines) == 80  # one line per rule


def test_schema1_policy_is_written_as_schema2_and_reads_back_equal():
    old = PrecisionPolicy.load(ZOO / "whisper-tiny-en.schema1.yaml")
    text = old.to_yaml()
    assert "schema_version: 2" in text and "\npresets:\n" in text and "quant:" not in text
    assert PrecisionPolicy.from_yaml(text) == old
    assert PrecisionPolicy.from_yaml(text).to_yaml() == text


def test_int8_rule_without_settings_equals_its_file_round_trip():
    p = PrecisionPolicy(
        model="m",
        target="cpu-reference",
        modalities={"": Modality.OTHER},
        rules=[Rule(match="fc1", precision=Precision.W8A8)],
    )
    text = p.to_yaml()
    assert "  w8a8: {precision: w8a8}\n" in text and "- {match: fc1, preset: w8a8}\n" in text
    assert PrecisionPolicy.from_yaml(text) == p


BASE = """\
schema_version: 2
model: m
target: cpu-reference
presets:
  w8a8-mse: {precision: w8a8, observer: mse}
rules:
- {match: fc1, preset: w8a8-mse, reason: r}
"""


@pytest.mark.parametrize(
    ("change", "message", "needle"),
    [
        (("preset: w8a8-mse,", "preset: w8a8-kl,"), "rules.0.preset: unknown preset 'w8a8-kl' (presets: w8a8-mse)", "w8a8-kl"),
        (("{match: fc1, preset", "{match: fc1, precision: fp16, preset"), "rules.0.preset: a rule names a preset or its own precision/quant, not both", "fp16"),
        (("- {match: fc1, preset: w8a8-mse, reason: r}", "- {match: fc1, precision: fp16}"), "presets.w8a8-mse: preset 'w8a8-mse' is used by no rule", "w8a8-mse:"),
        (("{precision: w8a8, observer: mse}", "{precision: fp16}"), "presets.w8a8-mse.precision: presets hold int8 settings", "fp16"),
        (("{precision: w8a8, observer: mse}", "{precision: w8a16, smoothquant_alpha: 0.5}"), "presets.w8a8-mse: SmoothQuant needs quantized activations", "w8a16"),
        (("{precision: w8a8, observer: mse}", "{observer: mse}"), "presets.w8a8-mse: a preset is a mapping with a precision", "{observer"),
    ],
)  # fmt: skip
def test_preset_errors_name_the_place_and_the_line(change, message, needle):
    text = BASE.replace(*change)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if needle in t)
    with pytest.raises(ConfigError) as exc:
        PrecisionPolicy.from_yaml(text, source="p.yaml")
    assert str(exc.value).startswith(f"p.yaml: {message}")
    assert str(exc.value).endswith(f"(line {line})")
