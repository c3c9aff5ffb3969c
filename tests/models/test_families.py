"""The built-in families (opsnn_quant/models/families.py): each one entry of the family table,
registered as a team's own would be; detection reads config files only."""

from __future__ import annotations

import json

import pytest

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.evaluation.evaluate import generation_settings
from opsnn_quant.evaluation.suite import load_suite
from opsnn_quant.models import families as builtin
from opsnn_quant.models.family import detect_family, families, family_names, get_family
from opsnn_quant.models.settings import settings_for
from opsnn_quant.pipeline.recipe import load_recipe


def test_the_built_ins_are_registered_in_message_order():
    assert family_names()[:3] == ["diffusers-sd", "whisper", "diffusers-dit"]
    assert [f.name for f in families()[:3]] == family_names()[:3]


@pytest.mark.parametrize(
    ("files", "family"),
    [
        ({"model_index.json": {"unet": ["diffusers", "UNet2DConditionModel"]}}, "diffusers-sd"),
        (
            {
                "model_index.json": {
                    "transformer": ["diffusers", "SD3Transformer2DModel"],
                    "unet": [None, None],
                }
            },
            "diffusers-dit",
        ),
        # a pipeline naming a UNet is a UNet pipeline, whatever else it names
        (
            {"model_index.json": {"transformer": ["diffusers", "X"], "unet": ["diffusers", "Y"]}},
            "diffusers-sd",
        ),
        ({"config.json": {"model_type": "whisper"}}, "whisper"),
        ({"config.json": {"model_type": "llama"}}, None),
        ({"config.json": ["not", "an", "object"]}, None),
        ({}, None),
    ],
)
def test_detection_by_config_files(tmp_path, files, family):
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    found = detect_family(tmp_path)
    assert (found.name if found else None) == family


@pytest.mark.parametrize("name", ["model_index.json", "config.json"])
def test_a_broken_config_is_one_line(tmp_path, name):
    (tmp_path / name).write_text("{")
    with pytest.raises(ModelLoadError, match=rf"{name} is not valid JSON$"):
        detect_family(tmp_path)


@pytest.mark.parametrize("family", [builtin.DIFFUSERS_SD, builtin.WHISPER, builtin.DIFFUSERS_DIT])
def test_each_built_in_names_its_adapter_recipe_and_suite(family):
    assert get_family(family.name) is family
    assert family.adapter_class().family == family.name  # type: ignore[attr-defined]
    assert family.recipe is not None and family.suite is not None
    assert load_recipe(family.recipe).model.family == family.name
    suite = load_suite(family.suite)  # its generation settings are the family's to run
    settings_for(family.name, generation_settings(suite, family.name))
    assert family.steps == ("steps" in family.settings.model_fields)
