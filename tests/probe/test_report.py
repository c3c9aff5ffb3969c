"""SensitivityReport: JSON round trip; wall-clock costs kept out of probe.json."""

import json

from opsnn_quant.pipeline.timings import timings_json, write_timings
from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.probe.report import SensitivityReport
from tests.tiny_models import TinyMLP, forward_loop_for


def _report() -> SensitivityReport:
    model = TinyMLP()
    return probe(
        model, forward_loop_for(model, batches=2), ProbeConfig(), modalities={"": "denoiser"}
    )


def test_report_json_round_trip(tmp_path):
    report = _report()
    path = report.save(tmp_path / "probe.json")
    again = SensitivityReport.load(path)
    # the wall-clock costs stay in memory (timings.json), never in probe.json
    assert report.costs["pass1_seconds"] > 0 and again.costs == {}
    assert again == report.model_copy(update={"costs": {}})
    assert again.to_json() == report.to_json()


def test_probe_json_holds_no_wall_clock_figure_and_timings_json_holds_them(tmp_path):
    report = _report()
    doc = json.loads(report.to_json())
    assert "costs" not in doc
    assert not [k for k in json.dumps(doc).split('"') if k.endswith("_seconds")]
    path = write_timings(tmp_path, probe=report.costs, phases={"probe": 1.25, "total": 2.5})
    assert path == tmp_path / "timings.json"
    timings = json.loads(path.read_text())
    assert timings["schema_version"] == 1
    assert timings["phases_seconds"] == {"probe": 1.25, "total": 2.5}
    assert timings["probe"] == {k: round(v, 6) for k, v in report.costs.items()}
    # where the times were taken: the int8 GEMM path of each size class and the CPU's flags
    env = timings["environment"]
    assert set(env["int8_gemm"]) == {"small", "large"}
    assert set(env["int8_gemm"].values()) <= {"native", "fp32-chunk"}
    assert set(env["cpu_flags"]) == {"avx512_vnni", "avx_vnni", "amx_int8", "avx512f", "avx2"}
    assert "phases_seconds" not in json.loads(timings_json(probe={"pass1_seconds": 0.5}))


def test_an_older_probe_json_with_costs_still_loads(tmp_path):
    report = _report()
    doc = json.loads(report.to_json())
    doc["costs"] = {"pass1_seconds": 1.5}
    (tmp_path / "probe.json").write_text(json.dumps(doc))
    old = SensitivityReport.load(tmp_path / "probe.json")
    assert old.costs == {"pass1_seconds": 1.5}
    assert old.to_json() == report.to_json()  # saved again: without them
