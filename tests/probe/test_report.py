"""SensitivityReport: JSON round trip; wall-clock costs kept out of probe.json."""

import json
import math

import pytest
from pydantic import ValidationError

from opsnn_quant.errors import ConfigError
from opsnn_quant.pipeline.timings import timings_json, write_timings
from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.probe.report import (
    EndToEnd,
    Finding,
    Fp16Stats,
    ModuleSensitivity,
    SchemeError,
    SensitivityReport,
)
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


# issue 41 §1: probe.json read back is a user file: no NaN, no negative counts, finite figures


def _edited(tmp_path, edit) -> str:
    doc = json.loads(_report().to_json())
    edit(doc)
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(doc))  # json.dumps writes NaN/Infinity bare, as a hand edit would
    return str(path)


def _fp16(doc):
    return next(m for m in doc["modules"] if m.get("fp16"))["fp16"]


def _linear(doc):
    return next(m for m in doc["modules"] if m["type"] == "Linear")


@pytest.mark.parametrize(
    ("edit", "where", "msg"),
    [
        (lambda d: _fp16(d).update(output_absmax=math.nan), "fp16.output_absmax",
         "Input should be a number, not NaN"),
        (lambda d: _fp16(d).update(input_absmax=-1.0), "fp16.input_absmax",
         "Input should be greater than or equal to 0"),
        (lambda d: _fp16(d).update(headroom_out=math.inf), "fp16.headroom_out",
         "Input should be a finite number"),  # the writer writes null for it
        (lambda d: _fp16(d).update(inf_nan_count=-3), "fp16.inf_nan_count",
         "Input should be greater than or equal to 0"),
        (lambda d: _linear(d).update(macs=-5), "macs", "Input should be greater than or equal to 0"),
        (lambda d: _linear(d).update(calls=1.5), "calls", "Input should be a valid integer"),
        (lambda d: _linear(d).update(weight_shape=[-1, 4]), "weight_shape.0",
         "Input should be greater than or equal to 0"),
        (lambda d: next(iter(_linear(d)["w8a8"].values())).update(cosine=math.nan), "cosine",
         "Input should be a finite number"),
        (lambda d: next(iter(_linear(d)["w8a8"].values())).update(sqnr_db=-math.inf), "sqnr_db",
         "Input should be a finite number"),
        (lambda d: d["config"].update(min_headroom=math.nan), "config",
         "min_headroom is NaN"),
        (lambda d: next(iter(d["modalities"].values())).update(macs=-1), "macs",
         "Input should be greater than or equal to 0"),
    ],
    ids=["nan-absmax", "negative-absmax", "inf-headroom", "negative-count", "negative-macs",
         "fractional-calls", "negative-shape", "nan-cosine", "inf-sqnr", "nan-config",
         "negative-modality-macs"],
)  # fmt: skip
def test_a_probe_json_with_bad_figures_is_refused_naming_the_file_and_the_field(
    tmp_path, edit, where, msg
):
    path = _edited(tmp_path, edit)
    with pytest.raises(ConfigError) as exc:
        SensitivityReport.load(path)
    text = str(exc.value)
    assert text.startswith(f"{path}: ") and where in text and msg in text, text
    assert "\n" not in text


def test_infinite_maxima_are_written_as_the_writer_writes_them_and_read_back_the_same(tmp_path):
    # A module fed an additive -inf attention mask has an fp32 |x| max of inf: json.dumps writes
    # it as Infinity, and it reads back; the figures stored as null for an infinity stay null.
    fp16 = Fp16Stats(
        input_absmax=math.inf, output_absmax=1.0, headroom_in=0.0, headroom_out=math.inf,
        sumsq_absmax=math.inf, rel_error_fp16=math.nan,
    )  # fmt: skip
    assert fp16.headroom_out is None and fp16.rel_error_fp16 is None  # normalised by the probe
    module = ModuleSensitivity(
        name="attn", type="Linear", modality="denoiser", macs=10, calls=1, fp16=fp16,
        w8a8={"w8a8": SchemeError(sqnr_db=math.inf, cosine=1.0)},
        e2e=EndToEnd(scheme="w8a8", contribution=math.inf, rank=1),
    )  # fmt: skip
    report = SensitivityReport(
        model="m", modules=[module],
        findings=[Finding(kind="softmax_input", where="attn", modality="denoiser", value=math.inf)],
    )  # fmt: skip
    path = report.save(tmp_path / "probe.json")
    assert '"input_absmax": Infinity' in path.read_text()
    again = SensitivityReport.load(path)
    assert again == report and again.to_json() == report.to_json()


def test_a_report_built_with_a_negative_count_is_refused():
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        ModuleSensitivity(name="a", type="Linear", modality="denoiser", macs=-1)


def test_a_report_listing_a_module_twice_is_refused(tmp_path):
    # issue 58: it was read, and the module's MACs counted twice (int8_mac_share halved)
    module = {"name": "fc", "type": "Linear", "modality": "other"}
    doc = {"model": "m", "modules": [module, {**module}]}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        SensitivityReport.load(path)
    assert str(info.value) == (
        f"{path}: modules: fc is listed twice; a probe report lists each module once"
    )
    doc["modules"][1]["name"] = "fc2"
    path.write_text(json.dumps(doc))
    assert [m.name for m in SensitivityReport.load(path).modules] == ["fc", "fc2"]
