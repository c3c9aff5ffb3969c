"""``opsnn-quant evaluate`` end to end on a tiny pipeline: PASS exits 0, FAIL exits 3,
INCONCLUSIVE exits 4."""

import json

import pytest

from opsnn_quant.cli import main
from opsnn_quant.formats.checkpoint import save_quantized
from opsnn_quant.models import load_adapter
from opsnn_quant.quant.api import quantize
from tests.tiny_pipelines import save_tiny_sd


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    pipe = save_tiny_sd(root / "pipe")
    adapter = load_adapter("diffusers-sd", str(pipe), steps=2, batch_size=2)
    quantize(adapter.model, {"unet.*": "w8a8_dynamic"}, None)  # per-token: no calibration needed
    save_quantized(adapter.model, root / "out" / "quant", source_model=str(pipe))
    (root / "data").mkdir()
    (root / "data" / "prompts.txt").write_text("a red circle\na blue square\n")
    return root


def _suite(root, psnr_min):
    path = root / f"suite_{psnr_min}.yaml"
    path.write_text(
        "schema_version: 1\nname: tiny\ntask: t2i\n"
        f"data: {{folder: {root / 'data'}, samples: 2}}\n"
        "generation: {steps: 2, guidance_scale: 4.0, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: "
        f"{{psnr_min: {psnr_min}, latency_p99_ratio_max: 0.001}}}}\n"
        "latency: {warmup: 0, runs: 1, profile_top: 3}\n"
    )
    return path


@pytest.mark.slow
def test_pass_and_fail_exit_codes(candidate, tmp_path, monkeypatch):
    # The latency bound (0.001) cannot hold, but the cpu-reference figure is not the target's:
    # reported, not judged, and the run passes on PSNR.
    # (--latency all: since issue 43 §1 the default --latency target times nothing the target
    # does not judge, and this run checks the eager figures' rows.)
    ok = main(["evaluate", "--candidate", str(candidate / "out"), "--suite", str(_suite(candidate, 5.0)),
               "-o", str(tmp_path / "r1"), "--quiet", "--target", "ascend910b-atc",
               "--latency", "all"])  # fmt: skip
    assert ok == 0
    report = json.loads((tmp_path / "r1" / "report.json").read_text())
    assert report["verdict"] == "PASS" and report["target"] == "ascend910b-atc"
    assert report["backends"]["quality"] == "cpu-reference"
    lat = {c["key"]: c for c in report["criteria"]}["latency_p99_ratio_max"]
    assert lat["status"] == "NOT JUDGED" and lat["backend"] == "cpu-reference" and lat["value"] > 0
    # No ONNX figure asked: the eager timing is what the criterion reads, measured (with stages
    # and one profile) under --latency all.
    assert [x["result"]["backend"] for x in report["latency"]] == ["cpu", "cpu-reference"]
    assert report["latency_mode"] == "all" and report["latency_skipped"] == []
    assert len(report["top_modules"]["candidate"]) == 3
    assert (tmp_path / "r1" / "report.html").stat().st_size > 1000
    # PSNR fails; nothing is timed, and with no policy.yaml no latency criterion is judged.
    fail = main(["evaluate", "--candidate", str(candidate / "out"), "--suite", str(_suite(candidate, 500.0)),
                 "-o", str(tmp_path / "r2"), "--quiet", "--latency", "none"])  # fmt: skip
    assert fail == 3
    r2 = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert r2["verdict"] == "FAIL" and r2["latency"] == [] and r2["latency_mode"] == "none"
    assert r2["latency_skipped"][0].endswith(": --latency none")
    lat2 = {c["key"]: c for c in r2["criteria"]}["latency_p99_ratio_max"]
    assert lat2["status"] == "NOT JUDGED" and "no deployment target is known" in lat2["note"]
    # Same inputs, no latency timing, fixed timestamp: the same report.json but for its run times.
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    for name in ("r3", "r4"):
        assert main(["evaluate", "--candidate", str(candidate / "out"), "--suite",
                     str(_suite(candidate, 5.0)), "-o", str(tmp_path / name), "-q",
                     "--latency", "none"]) == 0  # fmt: skip
    r3, r4 = (json.loads((tmp_path / n / "report.json").read_bytes()) for n in ("r3", "r4"))
    times = [r.pop("timings") for r in (r3, r4)]  # wall-clock seconds: the run's own
    assert list(times[0]) == ["baseline outputs", "candidate outputs", "quality metrics"]
    assert list(times[0]) == list(times[1]) and all(v >= 0 for v in times[0].values())
    assert r3 == r4
    assert r3["created"] == "2026-01-01T00:00:00+00:00"


def test_bad_suite_exits_2(candidate, tmp_path, capsys):
    assert main(["evaluate", "--candidate", str(candidate / "out"), "--suite", str(tmp_path / "nope.yaml"),
                 "-o", str(tmp_path / "r")]) == 2  # fmt: skip
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--latency", "bogus"], "error: --latency must be one of none, target, all, got 'bogus'"),
        (["--target", "tpu-v5"], "error: unknown target 'tpu-v5'"),
    ],
)
def test_bad_options_exit_2_with_one_error_line(candidate, tmp_path, capsys, option, message):
    code = main(["evaluate", "--candidate", str(candidate / "out"), "--suite", "shapes-t2i",
                 "-o", str(tmp_path / "r"), "-q", *option])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message)
    assert not (tmp_path / "r").exists()


def _ssim_suite(root, ssim_min):
    path = root / f"ssim_{ssim_min}.yaml"
    path.write_text(
        "schema_version: 1\nname: tiny\ntask: t2i\n"
        f"data: {{folder: {root / 'data'}, samples: 2}}\n"
        "generation: {steps: 2, guidance_scale: 4.0, batch_size: 2}\n"
        f"metrics: {{fid_features: null, thresholds: {{ssim_min: {ssim_min}}}}}\n"
    )
    return path


@pytest.mark.slow
def test_an_interval_across_the_threshold_exits_4(candidate, tmp_path, capsys):
    # Two prompts: a resample's mean SSIM is either pair's or their mean, so the interval runs
    # from the lower pair's SSIM to the higher's; a bound between them is INCONCLUSIVE.
    base = ["evaluate", "--candidate", str(candidate / "out"), "--latency", "none"]
    assert main([*base, "--suite", str(_ssim_suite(candidate, 0.5)), "-o", str(tmp_path / "r1"),
                 "-q"]) == 0  # fmt: skip
    first = json.loads((tmp_path / "r1" / "report.json").read_text())
    low, high = sorted(p["ssim"] for p in first["image_pairs"])
    assert low < high
    ssim = {c["key"]: c for c in first["criteria"]}["ssim_min"]
    assert (ssim["ci_level"], ssim["n"]) == (0.95, 2)
    assert (ssim["ci_low"], ssim["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    capsys.readouterr()
    bound = (low + high) / 2 + (high - low) / 8
    rc = main([*base, "--suite", str(_ssim_suite(candidate, bound)), "-o", str(tmp_path / "r2")])
    assert rc == 4
    report = json.loads((tmp_path / "r2" / "report.json").read_text())
    row = {c["key"]: c for c in report["criteria"]}["ssim_min"]
    assert report["verdict"] == "INCONCLUSIVE" and row["status"] == "INCONCLUSIVE"
    assert row["samples_to_decide"] > 2 and "samples would decide it" in row["note"]
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps at 80 columns
    assert printed.startswith("INCONCLUSIVE mean SSIM vs baseline [cpu-reference]: ")
    assert "(95%) n=2 (threshold >= " in printed


def test_calibrate_evaluate_exits_4_when_inconclusive(tmp_path, monkeypatch, capsys):
    # calibrate --evaluate maps the acceptance verdict to evaluate's exit codes.
    from types import SimpleNamespace

    from opsnn_quant.cli import calibrate as cli

    for verdict, code in (("INCONCLUSIVE", 4), ("FAIL", 3), ("PASS", 0)):
        steps = [] if verdict == "PASS" else [f"next: after {verdict}"]
        fake = SimpleNamespace(verdict=verdict, next_steps=steps)
        monkeypatch.setattr(cli.CalibrateCommand, "main", lambda self, quiet, sharing, f=fake: f)
        out = tmp_path / verdict
        argv = ["calibrate", "shapes-t2i", "-o", str(out), "--evaluate", "shapes-t2i", "-q"]
        assert main(argv) == code
        printed = capsys.readouterr().out
        assert f"acceptance (shapes-t2i): {verdict}" in printed
        assert ("next: after" in printed) == (verdict != "PASS")  # what to try, under the verdict


def _criteria(out):
    report = json.loads((out / "report.json").read_text())
    return {c["key"]: (c["status"], c["value"]) for c in report["criteria"]}


def test_a_random_whisper_baseline_fails_by_default_and_a_nan_candidate_always(tmp_path):
    # issue 58: a random-weight Whisper says one token over and over for every utterance; it
    # got PASS (rc 0, broken-baseline share 0) against itself without --allow-broken-baseline
    from safetensors.torch import load_file, save_file

    from tests.tiny_pipelines import save_tiny_whisper

    model = save_tiny_whisper(tmp_path / "w", max_target_positions=80)
    suite = tmp_path / "asr.yaml"
    suite.write_text(
        "schema_version: 1\nname: tiny-asr\ntask: asr\n"
        "data: {dataset: speech, split: eval, samples: 4}\n"
        "generation: {max_new_tokens: 8, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {wer_delta_max_points: 100.0}}\n"
    )
    args = ["evaluate", "--suite", str(suite), "--latency", "none", "--quiet"]
    assert main([*args, "--candidate", str(model), "-o", str(tmp_path / "r")]) == 3
    rows = _criteria(tmp_path / "r")
    assert rows["wer_delta_max_points"][0] == "PASS"  # it matches itself...
    assert rows["baseline_sane"] == ("FAIL", 1.0)  # ...but says nothing
    assert rows["candidate_finite"] == ("PASS", 0.0)
    allowed = [*args, "--allow-broken-baseline"]
    assert main([*allowed, "--candidate", str(model), "-o", str(tmp_path / "ok")]) == 0
    assert _criteria(tmp_path / "ok")["baseline_sane"] == ("NOT JUDGED", 1.0)
    # a candidate whose encoder computes NaN: its transcripts are empty strings, which say
    # nothing of NaN; it fails whatever --allow-broken-baseline says
    nan = tmp_path / "nan"
    nan.mkdir()
    for f in model.iterdir():
        (nan / f.name).write_bytes(f.read_bytes())
    weights = load_file(nan / "model.safetensors")
    weights["model.encoder.layers.0.fc1.weight"][0, 0] = float("nan")
    save_file(weights, nan / "model.safetensors", metadata={"format": "pt"})
    argv = [*allowed, "--candidate", str(nan), "--baseline", str(model), "-o", str(tmp_path / "n")]
    assert main(argv) == 3
    assert _criteria(tmp_path / "n")["candidate_finite"] == ("FAIL", 1.0)


def test_a_pipeline_candidate_whose_images_are_nan_fails(candidate, tmp_path):
    # NaN pixels become black uint8 images, which a loose PSNR bound may pass: counted instead
    import shutil

    from safetensors.torch import load_file, save_file

    nan = tmp_path / "nan"
    shutil.copytree(candidate / "pipe", nan)
    file = nan / "unet" / "diffusion_pytorch_model.safetensors"
    weights = load_file(file)
    name = next(k for k in weights if k.endswith("conv_out.weight"))
    weights[name][0] = float("nan")
    save_file(weights, file, metadata={"format": "pt"})
    argv = ["evaluate", "--candidate", str(nan), "--baseline", str(candidate / "pipe"),
            "--suite", str(_suite(candidate, 0.0)), "-o", str(tmp_path / "r"), "--quiet",
            "--latency", "none"]  # fmt: skip
    assert main(argv) == 3
    rows = _criteria(tmp_path / "r")
    assert rows["psnr_min"][0] == "PASS"  # a bound of 0 dB passes anything
    assert rows["candidate_finite"] == ("FAIL", 1.0)
    assert rows["baseline_finite"] == ("PASS", 0.0) and rows["baseline_sane"][0] == "PASS"


def test_evaluate_into_an_output_holds_it_for_the_whole_run(candidate, tmp_path, monkeypatch):
    # issue 58 §3: evaluate -o OUT/report took no lock on OUT: a calibrate -o OUT meanwhile
    # swapped the report away. Now the calibrate is refused while the evaluate runs.
    import subprocess
    import sys

    from opsnn_quant.output.directories import atomic_dir

    out = tmp_path / "out"
    with atomic_dir(out, "calibrate") as tmp:  # a calibrate output to put the report in
        (tmp / "policy.yaml").write_text("x\n")
    code = "import sys\nfrom opsnn_quant.output.locks import output_lock\nwith output_lock(sys.argv[1]): pass"
    tried = []

    def calibrate_meanwhile(*args, **kwargs):  # the evaluate is running
        argv = [sys.executable, "-c", code, str(out)]
        tried.append(subprocess.run(argv, capture_output=True, text=True))
        raise KeyboardInterrupt

    monkeypatch.setattr("opsnn_quant.formats.candidates.load_candidate", calibrate_meanwhile)
    argv = ["evaluate", "--candidate", str(candidate / "out"), "--suite",
            str(_suite(candidate, 5.0)), "-o", str(out / "report"), "--quiet"]  # fmt: skip
    assert main(argv) == 130
    (proc,) = tried
    assert proc.returncode != 0
    assert f"output {out} is being written by another opsnn-quant run" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [".opsnn-quant.json", "policy.yaml"]
