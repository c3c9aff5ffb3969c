"""``run_calibrate`` end to end (through the CLI) on tiny pipelines."""

from __future__ import annotations

import pytest
import yaml

from opsnn_quant.cli import main
from tests._deps import needs_espeak
from tests.planted import PLANTED, save_planted_sd


@pytest.mark.slow
def test_planted_fp16_overflows_of_every_kind_are_pinned_in_policy_and_keep_dtype(tmp_path, capsys):
    # Linear output, Conv output, norm variance, softmax input and residual add overflows, all
    # in one pipeline: calibrate runs to the end (exit 0, no traceback) and pins every planted
    # module to fp32 (ascend310p has no bf16), each with its own evidence in the reason, and
    # lists their ONNX nodes in ATC's --keep_dtype file.
    save_planted_sd(tmp_path / "pipe")
    (tmp_path / "prompts.txt").write_text("a red circle\na blue square\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"name: planted\n"
        f"model: {{family: diffusers-sd, source: {tmp_path / 'pipe'}, settings: {{steps: 2, batch_size: 2}}}}\n"
        f"data: {{calibration: {tmp_path / 'prompts.txt'}}}\n"
        f"probe: {{max_root_calls: 2}}\n"
        f"target: ascend310p\n"
    )
    out = tmp_path / "out"
    assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    rules = {r["match"]: r for r in yaml.safe_load((out / "policy.yaml").read_text())["rules"]}
    evidence = {
        "linear": "output absmax",
        "residual": "output absmax",
        "norm": "sum of squares",
        "softmax": "softmax input",
        "conv": "output absmax",
    }
    for kind, name in PLANTED.items():
        assert name in rules, f"{kind}: {name} not pinned"
        assert rules[name]["precision"] == "fp32", kind
        assert evidence[kind] in rules[name]["reason"], (kind, rules[name]["reason"])
    keep = (out / "export" / "atc_keep_dtype.cfg").read_text().splitlines()
    te = "/text_encoder/encoder/layers.0"
    for node in (f"{te}/Add", f"{te}/Add_1", f"{te}/mlp/fc2/MatMul",
                 f"{te}/layer_norm1/LayerNormalization", f"{te}/self_attn/Softmax",
                 "/vae/decoder/conv_out/Conv"):  # fmt: skip
        assert node in keep, node
    # the int8 candidates of the overflowing Linear are recorded as infeasible, not as errors
    import json

    probe = json.loads((out / "probe.json").read_text())
    fc2 = next(m for m in probe["modules"] if m["name"] == PLANTED["linear"])
    assert all(e["infeasible"] for e in fc2["w8a8"].values())


@pytest.mark.slow
def test_calibrate_evaluate_prints_the_verdict_and_exits_3_on_fail(tmp_path, capsys):
    # A suite no quantized model can meet (median PSNR >= 200 dB against the fp32 images): the
    # acceptance run says FAIL, so calibrate --evaluate exits 3 (as evaluate does) after writing
    # the whole output, report included.
    from tests.tiny_pipelines import save_tiny_sd

    save_tiny_sd(tmp_path / "pipe")
    (tmp_path / "prompts.txt").write_text("a red circle\na blue square\n")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "prompts.txt").write_text("a red circle\na blue square\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"name: tiny\n"
        f"model: {{family: diffusers-sd, source: {tmp_path / 'pipe'}, settings: {{steps: 2, batch_size: 2}}}}\n"
        f"data: {{calibration: {tmp_path / 'prompts.txt'}}}\n"
        f"probe: {{max_root_calls: 2}}\n"
        f"target: ascend910b-atc\n"
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "schema_version: 1\nname: tiny\ntask: t2i\n"
        "data: {folder: eval, samples: 2}\n"
        "generation: {steps: 2, guidance_scale: 5.0, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {psnr_min: 200.0}}\n"
        "latency: {warmup: 0, runs: 1}\n"
    )
    out = tmp_path / "out"
    rc = main(["calibrate", str(recipe), "-o", str(out), "--evaluate", str(suite), "--quiet"])
    assert rc == 3
    printed = capsys.readouterr().out
    # --quiet still says where the output went and the verdict
    assert f"wrote {out}/" in printed and "acceptance (" in printed and ": FAIL" in printed
    assert "FAIL" in (out / "report" / "report.md").read_text()
    assert (out / "policy.yaml").is_file() and (out / "quant" / "model.safetensors").is_file()


def test_run_calibrate_on_a_tiny_pipeline_writes_every_artifact(tmp_path, monkeypatch):
    # The library entry point itself (no CLI), kept small to stay fast: one prompt, one step.
    from opsnn_quant.formats.policy_files import EXPORT_FILES
    from opsnn_quant.pipeline import calibrate as workflow
    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe
    from tests.tiny_pipelines import save_tiny_sd

    loads: list[str] = []
    real_load = workflow.load_recipe_model
    monkeypatch.setattr(
        workflow, "load_recipe_model", lambda r, s=None: loads.append(r.name) or real_load(r, s)
    )

    save_tiny_sd(tmp_path / "pipe")
    (tmp_path / "prompts.txt").write_text("a red circle\n")
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(
        f"name: tiny\n"
        f"model: {{family: diffusers-sd, source: {tmp_path / 'pipe'}, settings: {{steps: 1, batch_size: 1}}}}\n"
        f"data: {{calibration: {tmp_path / 'prompts.txt'}, holdout: {tmp_path / 'prompts.txt'}}}\n"
        f"probe: {{max_root_calls: 1}}\n"
        f"target: ascend910b-atc\n"
    )
    phases: list[str] = []
    result = run_calibrate(load_recipe(str(recipe_path)), tmp_path / "out", progress=phases.append)
    out = tmp_path / "out"
    for rel in ("probe.json", "policy.yaml", "quant/model.safetensors", "quant/description.json"):
        assert (out / rel).is_file(), rel
    for name in EXPORT_FILES.values():
        assert (out / "export" / name).is_file(), name
    assert {r.modality.value for r in result.rows} >= {"text_encoder", "denoiser", "image_decoder"}
    assert result.measured and all("sqnr_db" in v for v in result.measured.values())
    assert phases[0] == "loading the calibration data" and "quantizing" in phases
    assert result.verdict is None and result.seconds["total"] > 0
    # ATC's float graphs came from the model before it was quantized: one load, no second copy
    assert loads == ["tiny"]
    atc = out / "export" / "atc"
    assert {"unet.onnx", "unet.qdq.onnx"} <= {f.name for f in atc.iterdir()}
    assert "unet.onnx" in (atc / "unet.sh").read_text()
    assert not (out / "export" / ".atc-float").exists()


@pytest.mark.slow
def test_a_mindie_sd_target_deploys_its_policy_and_mindie_sd_computes_our_modules(tmp_path):
    # The tiny SD3 pipeline for ascend910b-mindie-sd: export/mindie-sd holds every int8 Linear
    # of the policy (the share it deploys is the policy's own), and MindIE-SD's consumer on those
    # files gives our quantized transformer's output bit for bit.
    import torch

    from opsnn_quant.formats.checkpoint import load_quantized
    from opsnn_quant.formats.mindie_sd.reader import apply_mindie_sd_dir
    from opsnn_quant.pipeline.calibrate import load_recipe_model, run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe
    from opsnn_quant.recording import record_roots, replay
    from tests.tiny_pipelines import save_tiny_sd3, tiny_sd_recipe

    save_tiny_sd3(tmp_path / "pipe")
    recipe_path = tiny_sd_recipe(tmp_path, "tiny_dit", target="ascend910b-mindie-sd")
    recipe_path.write_text(recipe_path.read_text().replace("diffusers-sd", "diffusers-dit"))
    recipe = load_recipe(str(recipe_path))
    out = tmp_path / "out"
    result = run_calibrate(recipe, out)
    assert result.int8_mac_share and result.int8_mac_share > 0.5
    assert result.deployed["mindie-sd"]["overall"] == pytest.approx(result.int8_mac_share)
    assert "deployed by mindie-sd" in (out / "policy.yaml").read_text()
    # both pipelines in MindIE-SD's dtype: its Linear returns bfloat16 whatever comes in
    # (mindiesd 3.1.0 quantization/layer.py 347-363), so the engine runs bf16 pipelines
    in_bf16 = recipe.with_placement(None, "bfloat16")
    ours = load_recipe_model(in_bf16)
    engine = load_recipe_model(in_bf16)
    calls = record_roots(ours, ours.forward_loop([{"prompt": "a red circle"}]), 1, seed=3).calls
    load_quantized(ours.model, out / "quant")
    replaced = apply_mindie_sd_dir(engine.model, out / "export" / "mindie-sd")
    assert any(n.startswith("transformer.") for n in replaced)
    with torch.no_grad():
        a = replay(ours.model.transformer, calls["transformer"][0])
        b = replay(engine.model.transformer, calls["transformer"][0])
    assert torch.equal(a, b)
    _evaluate_the_mindie_sd_export(tmp_path, out)


def _evaluate_the_mindie_sd_export(tmp_path, out):
    """evaluate --candidate OUT/export/mindie-sd runs MindIE-SD's consumer: the same figures as
    OUT (our modules), and a file MindIE-SD would refuse is one error line, no report."""
    import json
    import os

    from opsnn_quant.cli import main
    from tests.tiny_pipelines import tiny_t2i_suite

    suite = tiny_t2i_suite(tmp_path, psnr_min=1.0)
    mindie = out / "export" / "mindie-sd"
    figures = {}
    for name, candidate in (("ours", out), ("mindie", mindie)):
        rc = main(["evaluate", "--candidate", str(candidate), "--suite", str(suite),
                   "-o", str(tmp_path / name), "--latency", "none", "--quiet"])  # fmt: skip
        assert rc == 0
        figures[name] = json.loads((tmp_path / name / "report.json").read_text())["measured"]
    assert figures["ours"] == figures["mindie"]
    weights = next((mindie / "transformer").glob("quant_model_weight_*.safetensors"))
    os.chmod(weights, 0o644)
    rc = main(["evaluate", "--candidate", str(mindie), "--suite", str(suite),
               "-o", str(tmp_path / "refused"), "--quiet"])  # fmt: skip
    assert rc == 2 and not (tmp_path / "refused").exists()


@pytest.mark.slow
@needs_espeak
def test_a_vllm_target_deploys_its_policy_in_ascendv1(tmp_path):
    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe
    from tests.tiny_pipelines import save_tiny_whisper

    save_tiny_whisper(tmp_path / "w")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"name: tiny_whisper\n"
        f"model: {{family: whisper, source: {tmp_path / 'w'}, settings: {{batch_size: 2, max_new_tokens: 4}}}}\n"
        "data: {calibration: zoo:speech/calibration, limit: 2}\n"
        "probe: {max_root_calls: 1}\n"
        "budget: {min_int8_mac_share: 0.0}\n"
        "target: ascend910b-vllm-ascend\n"
    )
    result = run_calibrate(load_recipe(str(recipe)), tmp_path / "out")
    assert result.int8_mac_share and result.int8_mac_share > 0
    # every int8 Linear of the policy is written int8 in AscendV1 (SmoothQuant only in the
    # probe's smoothing groups, each folded into its norm)
    assert result.deployed["ascendv1"]["overall"] == pytest.approx(result.int8_mac_share)


def _metric_setup(tmp_path, psnr_min: float):
    """A tiny SD pipeline, a 4-prompt suite (2 acceptance samples, so the slice is prompts 2
    and 3) and a recipe whose budget is a median-PSNR bound measured on that slice."""
    from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe

    save_tiny_sd(tmp_path / "pipe")
    (tmp_path / "eval").mkdir()
    prompts = ["a red circle", "a blue square", "a green circle", "a small red square"]
    (tmp_path / "eval" / "prompts.txt").write_text("\n".join(prompts) + "\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "schema_version: 1\nname: tiny\ntask: t2i\ndata: {folder: eval, samples: 2}\n"
        "generation: {steps: 2, guidance_scale: 5.0, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {psnr_min: 5.0}}\n"
    )
    budget = (
        f"budget: {{metric: {{suite: {suite}, samples: 2, psnr_min: {psnr_min}}}, "
        "max_evaluations: 4, min_int8_mac_share: 0.0}\n"
    )
    return tiny_sd_recipe(tmp_path, "tiny", extra=budget), prompts[2:]


def test_a_metric_budget_chooses_by_measurement_and_the_figure_is_the_written_models(
    tmp_path, capsys
):
    # Every candidate measured (baselines first), the chosen one at least as good as every
    # passing one by (coverage, quality), its notes in policy.yaml, and its measured median PSNR
    # exactly what `evaluate` measures on the written quant/ model over the same prompts.
    import json

    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe

    recipe, slice_prompts = _metric_setup(tmp_path, psnr_min=5.0)
    out = tmp_path / "out"
    result = run_calibrate(load_recipe(str(recipe)), out)
    walk = result.search
    assert walk is not None and 1 <= walk.evaluations <= 4
    assert walk.rounds[0].candidate.label == "all-w8a8-minmax"
    chosen = walk.chosen
    assert all(chosen.rank() >= r.rank() for r in walk.rounds if r.passed)
    assert result.int8_mac_share == pytest.approx(chosen.candidate.share)
    notes = yaml.safe_load((out / "policy.yaml").read_text())["notes"]
    assert f"measured search chose {chosen.candidate.label}" in " ".join(notes)
    assert sum(n.startswith("measured round") for n in notes) == len(walk.rounds)
    # the same prompts as an acceptance suite of their own, on the written model
    (tmp_path / "slice").mkdir()
    (tmp_path / "slice" / "prompts.txt").write_text("\n".join(slice_prompts) + "\n")
    (tmp_path / "slice.yaml").write_text(
        (tmp_path / "suite.yaml").read_text().replace("folder: eval", "folder: slice")
    )
    report = tmp_path / "report"
    main(["evaluate", "--candidate", str(out), "--suite", str(tmp_path / "slice.yaml"),
          "-o", str(report), "--latency", "none", "--quiet"])  # fmt: skip
    measured = json.loads((report / "report.json").read_text())["measured"]
    assert chosen.measurement is not None
    # quality: the bound's figure (median PSNR), then t2i's closeness figure (the same)
    assert chosen.measurement.quality == (measured["psnr_median_db"],) * 2


def test_a_metric_budget_nothing_meets_falls_back_to_float(tmp_path, capsys):
    # 200 dB median PSNR: no int8 candidate passes; the walk ends on the float rung.
    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe

    recipe, _ = _metric_setup(tmp_path, psnr_min=200.0)
    result = run_calibrate(load_recipe(str(recipe)), tmp_path / "out")
    assert result.search is not None and result.search.chosen.candidate.share == 0.0
    assert not any(r.passed for r in result.search.rounds if r.measurement is not None)
    assert result.int8_mac_share == 0.0


def test_a_metric_budget_is_checked_before_work(tmp_path, capsys):
    recipe, _ = _metric_setup(tmp_path, psnr_min=5.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text(recipe.read_text().replace(str(tmp_path / "suite.yaml"), "no-such-suite"))
    capsys.readouterr()  # building the tiny pipeline may print (transformers, once a process)
    assert main(["calibrate", str(bad), "-o", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no-such-suite" in err and "Traceback" not in err
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "o2"), "--engine", "amct"]) == 2
    assert "budget.metric measures candidates quantized by opsnn-quant" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_the_acceptance_reports_policy_table_shows_measured_beside_predicted():
    from opsnn_quant.evaluation.render import render_markdown
    from opsnn_quant.evaluation.runner import QualityResult, build_report
    from opsnn_quant.evaluation.suite import parse_suite
    from opsnn_quant.policy.summary import with_measured
    from opsnn_quant.types import Modality

    summary = {"model": "m", "target": "ascend910b-atc", "rules": 3, "modalities": {
        "denoiser": {"chosen": "int8", "predicted_sqnr_db": 31.5, "int8_mac_share": 0.9}}}  # fmt: skip
    summary = with_measured(summary, {Modality.DENOISER: {"sqnr_db": 29.87654, "cosine": 0.99}})
    assert summary["modalities"]["denoiser"]["measured_sqnr_db"] == 29.877
    suite = parse_suite({"name": "s", "task": "t2i", "data": {"dataset": "shapes", "samples": 2},
                         "metrics": {"fid_features": None, "thresholds": {}}})  # fmt: skip
    md = render_markdown(build_report(suite, QualityResult(), policy=summary, created=""))
    assert (
        "measured SQNR dB (held-out)" in md
        and "| denoiser | int8 | 31.500 | 0.900 | 29.877 |" in md
    )


def test_calibrate_passes_allow_broken_baseline_to_the_acceptance_run(tmp_path, monkeypatch):
    # a tiny random pipeline's acceptance: the flag reaches evaluate() (the check itself is
    # tested in tests/evaluation/test_runner.py)
    import opsnn_quant.evaluation.evaluate as ev
    from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe, tiny_t2i_suite

    save_tiny_sd(tmp_path / "pipe")
    recipe = tiny_sd_recipe(tmp_path, "tiny")
    suite = tiny_t2i_suite(tmp_path, extra="latency: {warmup: 0, runs: 1}\n")
    seen = []
    real = ev.evaluate

    def spy(*a, **k):
        seen.append(k.get("allow_broken_baseline"))
        return real(*a, **k)

    monkeypatch.setattr(ev, "evaluate", spy)
    argv = ["calibrate", str(recipe), "-o", str(tmp_path / "out"), "--evaluate", str(suite),
            "--latency", "none", "--quiet", "--allow-broken-baseline"]  # fmt: skip
    assert main(argv) in (0, 3)
    assert seen == [True]
    report = (tmp_path / "out" / "report" / "report.json").read_text()
    assert '"baseline_sane"' in report


def test_a_mindie_sd_candidate_is_judged_in_the_dtype_the_engine_runs():
    # MindIE-SD's Linear returns its dtype (bf16 by default; fp16 or bf16 only), so its
    # pipelines run so: evaluate and calibrate --evaluate judge such candidates in it.
    from opsnn_quant.formats.candidates import run_dtype
    from opsnn_quant.policy.targets import get_target
    from opsnn_quant.quant.engines import MINDIE_SD

    mindie, vllm = get_target("ascend910b-mindie-sd"), get_target("ascend910b-vllm-ascend")
    assert run_dtype(mindie, "float32") == "bfloat16"
    assert run_dtype(mindie, "float16") == "float16"
    assert run_dtype(MINDIE_SD, "bfloat16") == "bfloat16"
    assert run_dtype(vllm, "float32") == "float32"  # its candidates run the params dtype inside
    assert run_dtype(None, "float32") == "float32"


def test_a_naive_strategy_pays_for_pass_1_only_and_writes_the_same_model(tmp_path, monkeypatch):
    # Decide first (issue 43): all-w8a8-dynamic reads no estimate, so only pass 1 runs; the
    # checkpoint and exports are those the whole probe's statistics give (bit for bit).
    from opsnn_quant.pipeline import calibrate as workflow
    from opsnn_quant.pipeline import run as resolution
    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe
    from opsnn_quant.probe.report import SensitivityReport
    from tests.tiny_pipelines import save_tiny_whisper

    save_tiny_whisper(tmp_path / "w")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"name: tiny_whisper\n"
        f"model: {{family: whisper, source: {tmp_path / 'w'}, settings: {{batch_size: 2, max_new_tokens: 4}}}}\n"
        "data: {calibration: zoo:speech/calibration, limit: 2}\n"
        "probe: {max_root_calls: 1}\n"
        "strategy: all-w8a8-dynamic\n"
        "target: ascend910b-vllm-ascend\n"
    )
    phases: list[str] = []
    staged = run_calibrate(load_recipe(str(recipe)), tmp_path / "staged", progress=phases.append)
    assert not any("SmoothQuant" in p or "end-to-end" in p or "pass 2" in p for p in phases)
    assert "probe estimators" not in staged.seconds
    report = SensitivityReport.load(tmp_path / "staged" / "probe.json")
    assert report.not_estimated == "strategy all-w8a8-dynamic reads pass 1 only"
    assert all(not m.w8a8 and m.e2e is None for m in report.modules)
    assert staged.int8_mac_share and staged.int8_mac_share > 0
    assert report.config["schemes"] == ["w8a8_dynamic"]  # no other scheme's observers
    # the same run with every scheme the target runs and the estimators (before issue 43)
    real_config = resolution.probe_config
    monkeypatch.setattr(workflow, "estimators_optional", lambda run: False)
    monkeypatch.setattr(
        resolution,
        "probe_config",
        lambda r, seed, t: real_config(r.model_copy(update={"strategy": "search"}), seed, t),
    )
    whole = run_calibrate(load_recipe(str(recipe)), tmp_path / "whole")
    assert "probe estimators" not in whole.seconds and whole.seconds["probe"] > 0
    full = SensitivityReport.load(tmp_path / "whole" / "probe.json")
    assert len(full.config["schemes"]) > 1 and full.not_estimated is None
    assert any(m.w8a8 for m in full.modules)
    for rel in (
        "quant/model.safetensors",
        "export/ascendv1/quant_model_weights.safetensors",
    ):
        a, b = (tmp_path / d / rel for d in ("staged", "whole"))
        assert a.read_bytes() == b.read_bytes(), rel


_WRITE_REPORT = (
    "import sys\nfrom opsnn_quant.output.directories import atomic_dir\n"
    "with atomic_dir(sys.argv[1], 'report') as tmp:\n    (tmp / 'report.md').write_text('PASS')\n"
)


def test_a_report_into_the_output_is_refused_for_the_whole_calibrate_run(
    tiny_sd_calibrated, tmp_path, monkeypatch
):
    # issue 58 §3: calibrate -o OUT & then evaluate -o OUT/report: evaluate said "wrote", then
    # the calibrate's swap removed OUT/report. The calibrate holds OUT from its first phase.
    import shutil
    import subprocess
    import sys

    from opsnn_quant.pipeline import calibrate as workflow

    _, recipe, done = tiny_sd_calibrated
    out = tmp_path / "out"
    shutil.copytree(done, out)  # an earlier calibrate's output, being replaced
    report = out / "report"
    tried = []

    def evaluate_meanwhile(*args, **kwargs):  # the data is loaded, the model not yet
        argv = [sys.executable, "-c", _WRITE_REPORT, str(report)]
        tried.append(subprocess.run(argv, capture_output=True, text=True))
        raise KeyboardInterrupt  # enough: the run was in flight

    monkeypatch.setattr(workflow, "load_model", evaluate_meanwhile)
    assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 130
    (proc,) = tried
    assert proc.returncode != 0 and not report.exists()
    assert (
        f"output {report} lies in the output {out}, which another opsnn-quant run is writing; "
        "wait for it to finish or choose another output"
    ) in proc.stderr
    # the calibrate gone, the lock is free again
    proc = subprocess.run([sys.executable, "-c", _WRITE_REPORT, str(report)], capture_output=True)
    assert proc.returncode == 0 and (report / "report.md").read_text() == "PASS"
