"""The checks every user-written config shares (opsnn_quant.core.user_config) and the per-family
settings checked against the model's own config files (opsnn_quant.models.settings)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from opsnn_quant.core.user_config import SEED_MAX, check_limit, check_seed, yaml_error
from opsnn_quant.errors import ConfigError
from opsnn_quant.models.settings import (
    DiTSettings,
    SDSettings,
    WhisperSettings,
    check_fits,
    parse_set_options,
    settings_for,
    whisper_prompt_tokens,
)


@pytest.mark.parametrize("seed", [0, 1, SEED_MAX])
def test_seeds_at_the_ends_of_the_range_pass(seed):
    import numpy as np

    assert check_seed(seed) == seed
    np.random.seed(seed)  # what the range stands for: numpy takes both ends


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1])
def test_seeds_past_the_range_are_refused_like_numpy_does(seed):
    import numpy as np

    with pytest.raises(ValueError):
        np.random.seed(seed)
    with pytest.raises(ConfigError, match=rf"^--seed must be between 0 and {SEED_MAX} .* {seed}$"):
        check_seed(seed)


def test_none_passes_and_the_option_is_named():
    assert check_seed(None) is None and check_limit(None) is None
    with pytest.raises(ConfigError, match=r"^seed must"):
        check_seed(-1, "seed")
    with pytest.raises(
        ConfigError, match=r"^--limit must be between 1 and 1000000 samples, got 0$"
    ):
        check_limit(0)


def test_a_yaml_syntax_error_is_one_line_with_file_and_line():
    text = "a: 1\nb: [1, 2\nc: 3\n"
    with pytest.raises(yaml.YAMLError) as info:
        yaml.safe_load(text)
    msg = str(yaml_error("s.yaml", info.value))
    assert "\n" not in msg
    assert msg == (
        "s.yaml:3: not valid YAML: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence at line 2)"
    )


def test_a_yaml_error_without_a_mark_keeps_its_text_on_one_line():
    msg = str(yaml_error("s.yaml", yaml.YAMLError("bad\n  thing")))
    assert msg == "s.yaml: not valid YAML: bad thing"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_settings_refuse_nan_and_infinities(value):
    with pytest.raises(ConfigError, match="guidance_scale: Input should be a finite number"):
        settings_for("diffusers-sd", {"guidance_scale": value})


def test_set_options_read_values_as_yaml_scalars():
    got = parse_set_options(["steps=4", "guidance_scale=7.5", "name=x=y", "flag=true"])
    assert got == {"steps": 4, "guidance_scale": 7.5, "name": "x=y", "flag": True}
    assert settings_for("diffusers-sd", parse_set_options(["steps=4"])) == SDSettings(steps=4)
    for bad in ("=3", "steps", "steps=[1, 2]", "steps="):
        with pytest.raises(ConfigError, match="--set"):
            parse_set_options([bad])


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_steps_are_bounded_by_the_schedulers_training_timesteps(tmp_path):
    _write(tmp_path / "scheduler" / "scheduler_config.json", {"num_train_timesteps": 1000})
    check_fits(tmp_path, SDSettings(steps=1000))
    with pytest.raises(ConfigError, match=r"^model\.settings\.steps: 1001 is more than the 1000"):
        check_fits(tmp_path, SDSettings(steps=1001))
    with pytest.raises(ConfigError, match=r"^--set steps: 1001"):
        check_fits(tmp_path, DiTSettings(steps=1001), "--set ")


def test_sd3_size_is_bounded_by_its_position_embeddings(tmp_path):
    _write(tmp_path / "transformer" / "config.json", {"pos_embed_max_size": 16, "patch_size": 2})
    _write(tmp_path / "vae" / "config.json", {"block_out_channels": [16, 32, 64, 64]})
    check_fits(tmp_path, DiTSettings(height=256, width=256))  # 16 x 2 x 8
    with pytest.raises(ConfigError, match=r"width: 272 px .* at most 256 px"):
        check_fits(tmp_path, DiTSettings(height=256, width=272))


def test_whisper_tokens_are_bounded_by_the_decoder_positions_less_its_prompt(tmp_path):
    _write(tmp_path / "config.json", {"max_target_positions": 448})
    gen = {"is_multilingual": True, "no_timestamps_token_id": 50363}
    _write(tmp_path / "generation_config.json", gen)
    assert whisper_prompt_tokens(gen) == 4  # sot, language, task, notimestamps
    assert whisper_prompt_tokens(None) == 1
    check_fits(tmp_path, WhisperSettings(max_new_tokens=444))
    with pytest.raises(ConfigError, match=r"445 does not fit .* use at most 444"):
        check_fits(tmp_path, WhisperSettings(max_new_tokens=445))


def test_unreadable_or_missing_model_configs_are_left_to_the_loader(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    check_fits(tmp_path, WhisperSettings(max_new_tokens=10**6))
    check_fits(tmp_path / "missing", SDSettings(steps=10**6))
