"""``opsnn-quant evaluate`` end to end on a tiny pipeline: PASS exits 0, FAIL exits 3."""

import json

import pytest

from opsnn_quant.cli import main
from opsnn_quant.models import load_adapter
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.checkpoint import save_quantized
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
        f"metrics: {{fid_features: null, thresholds: {{psnr_min: {psnr_min}}}}}\n"
        "latency: {warmup: 0, runs: 1, profile_top: 3}\n"
    )
    return path


@pytest.mark.slow
def test_pass_and_fail_exit_codes(candidate, tmp_path):
    ok = main(["evaluate", "--candidate", str(candidate / "out"), "--suite", str(_suite(candidate, 5.0)),
               "-o", str(tmp_path / "r1"), "--quiet"])  # fmt: skip
    assert ok == 0
    report = json.loads((tmp_path / "r1" / "report.json").read_text())
    assert report["verdict"] == "PASS"
    assert report["backends"]["quality"] == "cpu-reference"
    assert (tmp_path / "r1" / "report.html").stat().st_size > 1000
    fail = main(["evaluate", "--candidate", str(candidate / "out"), "--suite", str(_suite(candidate, 500.0)),
                 "-o", str(tmp_path / "r2"), "--quiet"])  # fmt: skip
    assert fail == 3
    assert json.loads((tmp_path / "r2" / "report.json").read_text())["verdict"] == "FAIL"


def test_bad_suite_exits_2(candidate, tmp_path, capsys):
    assert main(["evaluate", "--candidate", str(candidate / "out"), "--suite", str(tmp_path / "nope.yaml"),
                 "-o", str(tmp_path / "r")]) == 2  # fmt: skip
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
