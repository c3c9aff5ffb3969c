"""Shipped recipes validate; templates load their model family on tiny stand-ins of the classes."""

import re
from pathlib import Path

import pytest
import yaml

from opsnn_quant.errors import ConfigError
from opsnn_quant.pipeline.recipe import builtin_recipes, load_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_recipe_validates():
    names = builtin_recipes()
    assert {
        "shapes-t2i",
        "whisper-tiny-en",
        "sd15-template",
        "sdxl-template",
        "whisper-template",
        "sd3-template",
        "flux-template",
        "pixart-sigma-template",
        "wan-t2v-template",
    } <= set(names)
    for name in names:
        r = load_recipe(name)
        assert r.model.family in ("diffusers-sd", "diffusers-dit", "whisper")


def test_recipe_errors_name_field_and_line(tmp_path):
    text = (ROOT / "calibrate" / "shapes-t2i.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("min_int8_mac_share: 0.5", "min_int8_mac_share: 5"))
    with pytest.raises(ConfigError, match=r"line \d+: budget\.min_int8_mac_share"):
        load_recipe(str(bad))
    bad.write_text(text.replace("family: diffusers-sd", "family: llama"))
    with pytest.raises(
        ConfigError, match=r"model\.family: must be one of diffusers-dit, diffusers-sd, whisper"
    ):
        load_recipe(str(bad))


def test_estimator_batch_per_modality(tmp_path):
    assert load_recipe("whisper-tiny-en").probe.estimator_batch == {"audio_encoder": 1}
    text = (ROOT / "calibrate" / "whisper-tiny-en.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    for value, match in (
        ("{audio_encodr: 1}", "unknown modality"),
        ("{audio_encoder: 0}", "positive"),
        ("0", "positive"),
    ):
        bad.write_text(
            text.replace("estimator_batch: {audio_encoder: 1}", f"estimator_batch: {value}")
        )
        with pytest.raises(ConfigError, match=match):
            load_recipe(str(bad))
        bad.write_text(
            text.replace(
                "estimator_batch: {audio_encoder: 1}",
                f"estimator_batch: {{audio_encoder: 1}}\n  estimator_samples: {value}",
            )
        )
        with pytest.raises(ConfigError, match=match.replace("positive", "estimator_samples")):
            load_recipe(str(bad))
    bad.write_text(text.replace("estimator_batch: {audio_encoder: 1}", "estimator_samples: 2"))
    assert load_recipe(str(bad)).probe_config().estimator_samples == 2


@pytest.mark.slow
def test_sd15_template_runs_on_a_tiny_stand_in(tmp_path):
    """The SD template with its paths pointed at a tiny random-config StableDiffusionPipeline."""
    from opsnn_quant.models.data import load_records
    from opsnn_quant.pipeline.calibrate import load_recipe_model
    from tests.tiny_pipelines import save_tiny_sd

    save_tiny_sd(tmp_path / "pipe")
    (tmp_path / "prompts.txt").write_text("a red circle\na blue square\n")
    data = yaml.safe_load((ROOT / "calibrate" / "sd15-template.yaml").read_text())
    data["model"]["source"] = str(tmp_path / "pipe")
    data["model"]["settings"].update(steps=2, height=16, width=16, batch_size=2)
    data["data"] = {"calibration": str(tmp_path / "prompts.txt")}
    path = tmp_path / "sd15.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(str(path))
    adapter = load_recipe_model(recipe)
    images = adapter.generate(load_records(recipe.data.calibration), seed=0)
    assert len(images) == 2 and images[0].shape == (16, 16, 3)


def test_model_device_and_dtype_are_checked_and_overridable(tmp_path):
    text = (ROOT / "calibrate" / "shapes-t2i.yaml").read_text()
    r = load_recipe("shapes-t2i")
    assert (r.model.device, r.model.dtype) == ("cpu", "float32")
    placed = r.with_placement("npu:1", "bfloat16")
    assert (placed.model.device, placed.model.dtype) == ("npu:1", "bfloat16")
    assert placed.model.settings == r.model.settings
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace("  source: zoo:shapes-t2i", "  source: zoo:shapes-t2i\n  device: tpu")
    )
    with pytest.raises(ConfigError, match=r"line \d+: model\.device: String should match pattern"):
        load_recipe(str(bad))
    bad.write_text(
        text.replace("  source: zoo:shapes-t2i", "  source: zoo:shapes-t2i\n  dtype: int8")
    )
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        load_recipe(str(bad))
    with pytest.raises(ConfigError, match="--device: String should match pattern"):
        r.with_placement("gpu", None)


def test_probe_switches_reach_the_probe_config(tmp_path):
    text = (ROOT / "calibrate" / "shapes-t2i.yaml").read_text()
    path = tmp_path / "r.yaml"
    path.write_text(
        text.replace(
            "probe:\n", "probe:\n  fp16: false\n  bf16: false\n  smoothquant_alphas: [0.5]\n"
        )
    )
    cfg = load_recipe(str(path)).probe_config()
    assert (cfg.fp16, cfg.bf16, cfg.smoothquant_alphas) == (False, False, (0.5,))
    default = load_recipe("shapes-t2i").probe_config(seed=7)
    assert (
        default.fp16 and default.bf16 and default.seed == 7 and len(default.smoothquant_alphas) == 6
    )
    path.write_text(text.replace("probe:\n", "probe:\n  smoothquant_alphas: [1.5]\n"))
    with pytest.raises(ConfigError, match=r"probe\.smoothquant_alphas\.0"):
        load_recipe(str(path))


def test_timestep_groups_only_for_models_with_denoising_steps(tmp_path):
    text = (ROOT / "calibrate" / "whisper-tiny-en.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("probe:\n", "probe:\n  timestep_groups: 2\n"))
    with pytest.raises(
        ConfigError, match=r"probe\.timestep_groups: whisper models have no denoising steps"
    ):
        load_recipe(str(bad))
    sd = (ROOT / "calibrate" / "shapes-t2i.yaml").read_text()
    ok = tmp_path / "ok.yaml"
    ok.write_text(sd.replace("probe:\n", "probe:\n  timestep_groups: 3\n"))
    assert load_recipe(str(ok)).probe_config().timestep_groups == 3


# Template -> (tiny stand-in builder, output shape of one generated sample).
DIT_TEMPLATES = {
    "sd3-template": ("save_tiny_sd3", (16, 16, 3)),
    "flux-template": ("save_tiny_flux", (16, 16, 3)),
    "pixart-sigma-template": ("save_tiny_pixart", (16, 16, 3)),
    "wan-t2v-template": ("save_tiny_wan", (5, 16, 16, 3)),
}


@pytest.mark.parametrize("template", list(DIT_TEMPLATES))
def test_dit_templates_run_on_tiny_stand_ins(template, tmp_path):
    """Each DiT template, its paths pointed at a tiny random-config pipeline of its class and its
    size shrunk, loads through the recipe (family, dtype, settings as written) and samples."""
    import tests.tiny_pipelines as tiny
    from opsnn_quant.models.data import load_records
    from opsnn_quant.pipeline.calibrate import load_recipe_model

    builder, shape = DIT_TEMPLATES[template]
    kwargs = {"sigma": True} if template.startswith("pixart") else {}
    getattr(tiny, builder)(tmp_path / "pipe", **kwargs)
    (tmp_path / "prompts.txt").write_text("a red circle\na blue square\n")
    data = yaml.safe_load((ROOT / "calibrate" / f"{template}.yaml").read_text())
    written = dict(data["model"]["settings"])
    data["model"]["source"] = str(tmp_path / "pipe")
    small = {"steps": 2, "height": 16, "width": 16, "max_sequence_length": 16}
    if "num_frames" in written:
        small["num_frames"] = 5
    data["model"]["settings"].update(small)
    data["data"] = {"calibration": str(tmp_path / "prompts.txt")}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(str(path))
    adapter = load_recipe_model(recipe)
    assert adapter.family == "diffusers-dit"
    assert adapter.settings.guidance_scale == written["guidance_scale"]
    # The dtype the template names (a few modules stay fp32 by the class's own choice: Wan's
    # _keep_in_fp32_modules), e.g. the transformer's output projection:
    assert str(adapter.model.transformer.proj_out.weight.dtype) == f"torch.{recipe.model.dtype}"
    out = adapter.generate(load_records(recipe.data.calibration), seed=0)
    assert len(out) == 2 and out[0].shape == shape


def test_dit_settings_are_checked_with_field_and_line(tmp_path):
    text = (ROOT / "calibrate" / "wan-t2v-template.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("num_frames: 17", "num_frames: seventeen"))
    with pytest.raises(
        ConfigError, match=r"line \d+: model\.settings\.num_frames: Input should be a valid int"
    ):
        load_recipe(str(bad))
    bad.write_text(text.replace("num_frames: 17", "frames: 17"))
    with pytest.raises(ConfigError, match=r"model\.settings\.frames: Extra inputs"):
        load_recipe(str(bad))
    bad.write_text(text.replace("height: 480", "height: 472"))
    with pytest.raises(ConfigError, match=r"model\.settings\.height: Input should be a multiple"):
        load_recipe(str(bad))


def test_probe_schemes_are_the_targets_and_reach_the_probe(tmp_path):
    text = (ROOT / "calibrate" / "shapes-t2i.yaml").read_text()  # target ascend910b-atc
    path = tmp_path / "r.yaml"
    path.write_text(text.replace("probe:\n", "probe:\n  schemes: [w8a8, w8a8_timestep]\n"))
    with pytest.raises(
        ConfigError, match=r"probe\.schemes: ascend910b-atc cannot run w8a8_timestep"
    ):
        load_recipe(str(path))
    path.write_text(text.replace("probe:\n", "probe:\n  schemes: [w8a8]\n"))
    assert load_recipe(str(path)).probe_config().schemes == ("w8a8",)


def test_probe_local_errors_reaches_the_probe_config(tmp_path):
    assert load_recipe("shapes-t2i").probe_config().local_errors == "replayed"  # the default
    text = (ROOT / "calibrate" / "whisper-tiny-en.yaml").read_text()
    path = tmp_path / "r.yaml"
    anchor = "  estimator_batch: {audio_encoder: 1}"
    path.write_text(text.replace(anchor, anchor + "\n  local_errors: forward_loop"))
    cfg = load_recipe(str(path)).probe_config()
    assert cfg.local_errors == "forward_loop" and not cfg.replays_local_errors
    path.write_text(text.replace(anchor, anchor + "\n  local_errors: pass2"))
    with pytest.raises(ConfigError, match=r"probe\.local_errors"):
        load_recipe(str(path))


def test_budget_metric_is_checked_with_field_and_line(tmp_path):
    text = (ROOT / "calibrate" / "whisper-tiny-en.yaml").read_text()
    recipe = load_recipe(str(ROOT / "calibrate" / "whisper-tiny-en.yaml"))
    metric = recipe.budget.metric
    assert metric is not None and metric.suite == "whisper-tiny-en"
    assert metric.bounds().set_names() == {"wer_delta_max_points"}
    bad = tmp_path / "bad.yaml"
    for old, new, error in (
        ("wer_delta_max_points: 0.5", "latency_p99_ratio_max: 1.0",
         "line 23: budget.metric: latency_p99_ratio_max is a speed bound"),
        (", wer_delta_max_points: 0.5", "", "line 23: budget.metric: sets no bound"),
        ("samples: 64", "samples: 0", "line 23: budget.metric.samples: Input should be greater"),
        ("max_evaluations: 6", "max_evaluations: 0", "line 24: budget.max_evaluations: Input"),
        ("seed: 0", "seed: 0\nstrategy: all-w8a8-dynamic",
         "line 23: budget.metric: strategy all-w8a8-dynamic is not searched"),
    ):  # fmt: skip
        assert old in text
        bad.write_text(text.replace(old, new))
        with pytest.raises(ConfigError, match=re.escape(error)):
            load_recipe(str(bad))


def test_a_baseline_strategy_drops_the_metric_the_search_would_measure():
    recipe = load_recipe("whisper-tiny-en")
    assert recipe.budget.metric is not None
    naive = recipe.with_strategy("all-w8a8-dynamic")
    assert naive.strategy == "all-w8a8-dynamic" and naive.budget.metric is None
    assert naive.budget.min_int8_mac_share == recipe.budget.min_int8_mac_share
    assert recipe.with_strategy("search").budget.metric == recipe.budget.metric


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ("min_int8_mac_share", "min_int8_mac_shar",
         "budget.min_int8_mac_shar: Extra inputs are not permitted; did you mean 'min_int8_mac_share'?"),
        ("batch_size: 4", "batch_sise: 4",
         "model.settings.batch_sise: Extra inputs are not permitted; did you mean 'batch_size'?; "
         "whisper settings are: batch_size, max_new_tokens, num_beams, language, task"),
        ("seed: 0", "sed: 0", "sed: Extra inputs are not permitted; did you mean 'seed'?"),
        ("seed: 0", "seed: 0\nzzz: 1", "zzz: Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_an_unknown_field_says_which_known_one_it_is_close_to(tmp_path, old, new, error):
    text = (ROOT / "calibrate" / "whisper-tiny-en.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_recipe(str(bad))
    assert str(info.value).endswith(error)
