"""The calibrate output's layout (opsnn_quant/formats/calibrate_output.py) and what a directory a
user passes is (opsnn_quant/formats/registry.py recognise, one class per format)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.ascendv1.format import AscendV1Format
from opsnn_quant.formats.calibrate_output import CalibrateOutput, CalibrateOutputFormat
from opsnn_quant.formats.mindie_sd.format import MindIESDFormat
from opsnn_quant.formats.registry import Format, ModelSource, recognise, register_format


def test_the_layout_names_every_file_once(tmp_path):
    out = CalibrateOutput(tmp_path / "OUT")
    rel = {k: getattr(out, k).relative_to(out.root).as_posix()
           for k in ("probe", "policy", "timings", "quant", "export", "report")}  # fmt: skip
    assert rel == {"probe": "probe.json", "policy": "policy.yaml", "timings": "timings.json",
                   "quant": "quant", "export": "export", "report": "report"}  # fmt: skip
    # recipe.yaml too: the settings the model is loaded with again (issue 58)
    assert out.read_by_consumers() == [out.quant, out.probe, out.policy, out.recipe]


def test_directories_are_classified_by_what_they_hold(tmp_path):
    calib = tmp_path / "calib"
    (calib / "quant").mkdir(parents=True)
    av1 = calib / "export" / "ascendv1"
    (av1 / "unet").mkdir(parents=True)
    (av1 / "unet" / "quant_model_description.json").write_text("{}")  # a component's files
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    mindie = calib / "export" / "mindie-sd"
    (mindie / "transformer").mkdir(parents=True)
    (mindie / "transformer" / "quant_model_description_w8a8_dynamic.json").write_text("{}")
    assert type(recognise(calib)) is CalibrateOutputFormat
    assert type(recognise(av1)) is AscendV1Format
    assert type(recognise(mindie)) is MindIESDFormat
    assert type(recognise(model)) is ModelSource
    assert type(recognise(tmp_path / "missing")) is ModelSource  # a named source, say
    # what evaluating each reads: an export also reads the policy and quant/ beside it
    assert recognise(av1).inputs(av1) == [
        str(av1),
        str(calib / "policy.yaml"),
        str(calib / "quant"),
    ]
    assert recognise(calib).inputs(calib) == [str(calib / p) for p in ("quant", "probe.json",
                                                                     "policy.yaml", "recipe.yaml")]  # fmt: skip
    assert recognise(model).inputs(model) == [str(model)]
    assert recognise(mindie).engine and recognise(av1).engine and not recognise(calib).engine


def test_an_engine_directory_without_a_known_float_model_asks_for_the_baseline(tmp_path):
    mindie = tmp_path / "elsewhere"
    (mindie / "transformer").mkdir(parents=True)
    with pytest.raises(ConfigError, match="pass --baseline"):
        MindIESDFormat().float_source(mindie, None)
    assert MindIESDFormat().float_source(mindie, "zoo:shapes-dit") == "zoo:shapes-dit"
    assert ModelSource().float_source(tmp_path / "m", None) == str(tmp_path / "m")


def test_a_format_of_ones_own_is_recognised_ahead_of_the_fallback_and_named_once(tmp_path):
    from opsnn_quant.formats import base

    @register_format
    class Marked(Format):
        name = "marked-test"
        kind = "directory"
        read_order = 5  # tried first

        @classmethod
        def recognises(cls, path):
            return (path / "MARK").is_file()

        def float_source(self, path, baseline):
            return "zoo:shapes-t2i"

        def load_candidate(self, path, family, baseline, placement):
            raise NotImplementedError

    try:
        (tmp_path / "MARK").write_text("")
        assert type(recognise(tmp_path)) is Marked
        with pytest.raises(ConfigError, match="registered already"):
            register_format(type("Again", (Marked,), {}))
    finally:
        base.TABLE.pop(Marked)
    assert type(recognise(tmp_path)) is ModelSource


def test_an_export_knows_the_output_holding_it(tmp_path):
    assert CalibrateOutput.holding(tmp_path / "OUT" / "export" / "ascendv1") == CalibrateOutput(
        tmp_path / "OUT"
    )
    assert CalibrateOutput.holding(Path("/somewhere/msmodelslim-out")) is None


def test_one_class_per_format_writes_and_reads(tmp_path):
    from opsnn_quant.formats.registry import exporter, exporters

    av1 = exporter("ascendv1")  # the class that writes export/ascendv1 also reads one
    assert type(av1) is AscendV1Format and av1.read_order is not None
    assert [f.name for f in exporters("model")] == ["ascendv1", "mindie-sd", "atc"]
    assert "calibrate-output" not in [f.name for f in exporters()]  # read only
    with pytest.raises(ConfigError, match="is read, not written"):
        CalibrateOutputFormat().writer()
    with pytest.raises(ConfigError, match="not read as a candidate"):
        exporter("amct-cfg").float_source(tmp_path, None)


def test_a_calibrate_outputs_settings_are_its_recipes(tmp_path):
    out = CalibrateOutput(tmp_path / "OUT")
    assert out.settings() == {}  # none recorded (an older output): the family's defaults
    out.root.mkdir()
    out.recipe.write_text("# c\nname: x\nmodel: {source: m, settings: {max_new_tokens: 8}}\n")
    assert out.settings() == {"max_new_tokens": 8}
    out.recipe.write_text("model: [1\n")
    with pytest.raises(ConfigError, match=r"recipe\.yaml is not YAML"):
        out.settings()
