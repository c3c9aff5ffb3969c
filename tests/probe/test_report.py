"""SensitivityReport: JSON round trip."""

from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.probe.report import SensitivityReport
from tests.tiny_models import TinyMLP, forward_loop_for


def test_report_json_round_trip(tmp_path):
    model = TinyMLP()
    report = probe(
        model, forward_loop_for(model, batches=2), ProbeConfig(), modalities={"": "denoiser"}
    )
    path = report.save(tmp_path / "probe.json")
    again = SensitivityReport.load(path)
    assert again == report
    assert again.to_json() == report.to_json()
