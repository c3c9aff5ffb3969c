"""Wan2.1 end to end (plumbing): the shipped template recipe and template suite, pointed at a tiny
random Wan directory in diffusers layout, run probe -> policy -> quantize -> export -> evaluate
in one ``calibrate --evaluate`` command."""

from __future__ import annotations

import json

import yaml

from opsnn_quant.cli import main
from tests.pipeline.test_recipe import ROOT


def _template_recipe(tmp_path, prompts):
    data = yaml.safe_load((ROOT / "calibrate" / "wan-t2v-template.yaml").read_text())
    data["model"]["source"] = str(tmp_path / "pipe")
    data["model"]["settings"].update(
        {"steps": 2, "height": 16, "width": 16, "num_frames": 5, "max_sequence_length": 16}
    )
    data["data"] = {"calibration": str(prompts), "holdout": str(prompts), "holdout_limit": 2}
    data["probe"].update({"max_root_calls": 2})
    path = tmp_path / "wan.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _template_suite(tmp_path):
    data = yaml.safe_load((ROOT / "evaluate" / "wan-t2v-template.yaml").read_text())
    data["data"] = {"folder": str(tmp_path / "prompts"), "samples": 4}
    data["generation"].update(
        {"steps": 2, "height": 16, "width": 16, "num_frames": 5, "batch_size": 2}
    )
    # no CLIP in a test: the two CLIP bounds go with it
    data["metrics"]["clip"] = None
    for key in ("clip_score_delta_min", "clip_temp_delta_min"):
        del data["metrics"]["thresholds"][key]
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_wan_template_and_its_suite_run_end_to_end_on_a_tiny_random_wan(tmp_path):
    from tests.tiny_pipelines import save_tiny_wan

    save_tiny_wan(tmp_path / "pipe")
    (tmp_path / "prompts").mkdir()
    prompts = tmp_path / "prompts" / "prompts.txt"
    prompts.write_text("a red circle\na blue square\na green star\na white triangle\n")
    recipe, suite, out = (
        _template_recipe(tmp_path, prompts),
        _template_suite(tmp_path),
        tmp_path / "out",
    )
    argv = ["calibrate", str(recipe), "-o", str(out), "--evaluate", str(suite),
            "--latency", "none", "--quiet", "--allow-broken-baseline"]  # fmt: skip
    # a random model's videos: whatever the verdict, the run completes and writes everything
    assert main(argv) in (0, 3, 4)
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    assert policy["target"] == "ascend910b-mindie-sd"
    # Wan's time embedding stays float (diffusers_dit.PIPELINES keep_float)
    assert policy["modalities"]["transformer.condition_embedder.time_embedder"] == "other"
    # the denoiser's blocks get int8 rules (their Linears: the budget's limits are loose)
    assert [r for r in policy["rules"] if r["match"].startswith("transformer.blocks.")]
    mindie = out / "export" / "mindie-sd" / "transformer"
    assert list(mindie.glob("quant_model_weight_*.safetensors"))
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["task"] == "t2v"
    measured = report["measured"]
    for key in (
        "video_psnr_median_db",
        "video_ssim_mean",
        "temporal_psnr_median_db",
        "flicker_delta",
    ):
        assert key in measured, key
    judged = {c["key"]: c for c in report["criteria"]}
    for key in ("video_psnr_min", "temporal_psnr_min", "flicker_delta_max"):
        c = judged[key]
        assert c["n"] == 4 and c["status"] in ("PASS", "FAIL", "INCONCLUSIVE"), c
        assert c["ci_low"] is not None and c["ci_low"] <= c["value"] <= c["ci_high"], c
    # float and candidate side by side: frame strips in the report
    assert list((out / "report" / "plots").glob("pair-*.png"))


def test_a_naive_strategy_keeps_wans_time_embedding_float(tmp_path):
    # the naive baselines made every Linear int8, Wan's time embedding too: its forward reads
    # its first parameter's dtype and failed (StopIteration) on the int8 module
    from tests.tiny_pipelines import save_tiny_wan

    save_tiny_wan(tmp_path / "pipe")
    (tmp_path / "prompts").mkdir()
    prompts = tmp_path / "prompts" / "prompts.txt"
    prompts.write_text("a red circle\na blue square\n")
    recipe, out = _template_recipe(tmp_path, prompts), tmp_path / "out"
    argv = ["calibrate", str(recipe), "-o", str(out), "--strategy", "all-w8a8-dynamic", "--quiet"]
    assert main(argv) == 0
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    matched = [r["match"] for r in policy["rules"]]
    assert matched and not [m for m in matched if "time_embedder" in m]
    assert [m for m in matched if m.startswith("transformer.blocks.")]
