"""The calibrate output's layout and the classification of a directory a user passes
(opsnn_quant/pipeline/outputs.py)."""

from __future__ import annotations

from pathlib import Path

from opsnn_quant.pipeline.outputs import CalibrateOutput, DirectoryKind, classify


def test_the_layout_names_every_file_once(tmp_path):
    out = CalibrateOutput(tmp_path / "OUT")
    rel = {k: getattr(out, k).relative_to(out.root).as_posix()
           for k in ("probe", "policy", "timings", "quant", "export", "report")}  # fmt: skip
    assert rel == {"probe": "probe.json", "policy": "policy.yaml", "timings": "timings.json",
                   "quant": "quant", "export": "export", "report": "report"}  # fmt: skip
    assert out.read_by_consumers() == [out.quant, out.probe, out.policy]


def test_directories_are_classified_by_what_they_hold(tmp_path):
    calib = tmp_path / "calib"
    (calib / "quant").mkdir(parents=True)
    av1 = calib / "export" / "ascendv1"
    (av1 / "unet").mkdir(parents=True)
    (av1 / "unet" / "quant_model_description.json").write_text("{}")  # a component's files
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    assert classify(calib) is DirectoryKind.CALIBRATE_OUTPUT
    assert classify(av1) is DirectoryKind.ASCENDV1
    assert classify(model) is DirectoryKind.MODEL
    assert classify(tmp_path / "missing") is DirectoryKind.MODEL  # a named source, say


def test_an_export_knows_the_output_holding_it(tmp_path):
    assert CalibrateOutput.holding(tmp_path / "OUT" / "export" / "ascendv1") == CalibrateOutput(
        tmp_path / "OUT"
    )
    assert CalibrateOutput.holding(Path("/somewhere/msmodelslim-out")) is None
