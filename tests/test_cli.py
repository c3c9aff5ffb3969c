"""The ``opsnn-quant`` command: calibrate end to end on a tiny pipeline, and bad input."""

import json
import re
from pathlib import Path

import pytest

from opsnn_quant.cli import main
from opsnn_quant.output.ownership import MARKER
from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe, tiny_t2i_suite


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    save_tiny_sd(root / "pipe")
    prompts = root / "prompts.txt"
    recipe = tiny_sd_recipe(
        root, "tiny", data=f"{{calibration: {prompts}, holdout: {prompts}}}",
        extra="budget: {limits: {denoiser: {min_sqnr_db: 20}}}\n",
    )  # fmt: skip
    return root, recipe


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones included), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _pop_run_times(tree: dict[str, bytes]) -> dict[str, float]:
    """Take the wall-clock "Run times" out of the report in ``tree`` (JSON field, Markdown and
    HTML section: the only figures of the report that differ between two runs); returns them."""
    doc = json.loads(tree["report/report.json"])
    times = doc.pop("timings")
    tree["report/report.json"] = json.dumps(doc, sort_keys=True).encode()
    md, page = tree["report/report.md"].decode(), tree["report/report.html"].decode()
    tree["report/report.md"] = re.sub(r"## Run times\n.*?(?=\n## |\Z)", "", md, flags=re.S).encode()
    tree["report/report.html"] = re.sub(r"<h2>Run times</h2>.*?</ul>", "", page).encode()
    assert b"Run times" not in tree["report/report.md"] + tree["report/report.html"]
    return times


@pytest.mark.slow
def test_calibrate_writes_the_design_layout_byte_identically_on_a_rerun(
    tiny, tmp_path, capsys, monkeypatch
):
    # Two runs into two different directories: the same files, every byte the same (the ONNX
    # graphs and ATC scripts of ascend910b-atc, the AscendV1 export, the acceptance report and
    # its plots), except timings.json (the run's wall-clock times) and the run token in each
    # output's marker. The report's date is SOURCE_DATE_EPOCH's (the reproducible-builds convention);
    # on this CPU nothing is timed for an NPU target's latency criteria.
    root, recipe = tiny
    suite = tiny_t2i_suite(tmp_path)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for out in ("a", "b"):
        argv = ["calibrate", str(recipe), "-o", str(tmp_path / out), "--evaluate", str(suite)]
        assert main([*argv, "--quiet"]) == 0, capsys.readouterr()
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    for rel in ("probe.json", "policy.yaml", "quant/model.safetensors", "quant/description.json",
                "export/amct.cfg", "export/atc_keep_dtype.cfg", "export/atc_customize_dtypes.cfg",
                "export/atc_modify_mixlist.json", "export/amct_eager.json", "export/atc/unet.sh",
                "export/atc/unet.onnx", "export/atc/unet.qdq.onnx",
                "export/ascendv1/unet/quant_model_weights.safetensors", "report/report.json",
                "report/report.html", "report/plots/pair-0000.png", "timings.json"):  # fmt: skip
        assert rel in a, rel
    timings = [json.loads(t.pop("timings.json")) for t in (a, b)]
    run_times = [_pop_run_times(t) for t in (a, b)]  # the report's own copy of the times
    assert list(run_times[0]) == list(run_times[1])
    assert {"probe", "quantize", "baseline outputs", "candidate outputs"} <= set(run_times[0])
    assert sorted(a) == sorted(b)
    # Markers name their run (a random token, opsnn_quant/output/ownership.py): what they list is equal.
    markers = [rel for rel in a if rel.endswith(MARKER)]
    assert {"quant/" + MARKER, "export/ascendv1/" + MARKER, MARKER} <= set(markers)
    for rel in markers:
        ma, mb = json.loads(a.pop(rel)), json.loads(b.pop(rel))
        assert ma["token"] != mb["token"], rel
        for m in (ma, mb):  # the sizes the times may change (report/... in the outer marker)
            timed = ("timings.json", "report.json", "report.md", "report.html")
            for name in [k for k in m["manifest"] if k.rsplit("/", 1)[-1] in timed]:
                m["manifest"].pop(name)
        assert ma["manifest"] == mb["manifest"], rel
    assert [rel for rel in a if a[rel] != b[rel]] == []
    # no output path in any file (the suite's path is an input, named in the report)
    outputs = [str(tmp_path / d).encode() for d in ("a", "b")]
    assert not [rel for rel, data in a.items() if any(o in data for o in outputs)]
    assert json.loads(a["report/report.json"])["created"] == "2023-11-14T22:13:20+00:00"
    # the wall-clock figures are in timings.json only
    assert timings[0]["probe"]["pass1_seconds"] > 0 and timings[0]["phases_seconds"]["total"] > 0
    assert set(timings[0]["probe"]) == set(timings[1]["probe"])
    probe_doc = json.loads(a["probe.json"])
    assert "costs" not in probe_doc
    desc = json.loads(a["quant/description.json"])
    assert desc["source_model"] == str(root / "pipe")
    assert any(m["precision"].startswith("w8a8") for m in desc["modules"].values())
    assert not list(tmp_path.glob("*.tmp-*"))


def test_bad_input_is_one_line_exit_2_and_no_output(tiny, tmp_path, capsys):
    root, recipe = tiny
    out = tmp_path / "out"
    assert main(["calibrate", str(tmp_path / "missing.yaml"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "missing.yaml not found" in err and "\n" not in err

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        recipe.read_text().replace("target: ascend910b-atc", "target: ascend910b-atc\nbudgett: 1")
    )
    assert main(["calibrate", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "budgett" in err and "line 7" in err

    nomodel = tmp_path / "nomodel.yaml"
    nomodel.write_text(recipe.read_text().replace(str(root / "pipe"), str(tmp_path / "nowhere")))
    assert main(["calibrate", str(nomodel), "-o", str(out)]) == 2
    assert f"model {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    # a directory that is no model: the loader says what it lacks
    (tmp_path / "empty_dir").mkdir()
    nomodel.write_text(recipe.read_text().replace(str(root / "pipe"), str(tmp_path / "empty_dir")))
    assert main(["calibrate", str(nomodel), "-o", str(out)]) == 2
    assert "no model_index.json" in capsys.readouterr().err

    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    nodata = tmp_path / "nodata.yaml"
    nodata.write_text(recipe.read_text().replace(str(root / "prompts.txt"), str(empty)))
    assert main(["calibrate", str(nodata), "-o", str(out)]) == 2
    assert "is empty" in capsys.readouterr().err
    assert not out.exists()
    assert main(["probe", "zoo:nope", "-o", str(out), "--data", str(empty)]) == 2
    assert not out.exists()


def test_unknown_builtin_recipe_lists_the_known_ones(capsys, tmp_path):
    assert main(["calibrate", "no-such-recipe", "-o", str(tmp_path / "o")]) == 2
    assert "shapes-t2i" in capsys.readouterr().err


@pytest.mark.slow
def test_probe_command_writes_probe_json(tiny, tmp_path, capsys):
    root, _ = tiny
    rc = main(
        [
            "probe",
            str(root / "pipe"),
            "--data",
            str(root / "prompts.txt"),
            "-o",
            str(tmp_path / "p"),
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "p" / "probe.json").read_text())
    assert report["schema_version"] == 1 and "costs" not in report
    timings = json.loads((tmp_path / "p" / "timings.json").read_text())
    assert timings["probe"]["pass1_seconds"] > 0
    assert {"text_encoder", "denoiser", "image_decoder"} <= set(report["modalities"])
    assert any(m["e2e"] for m in report["modules"])
    # the table's title wraps at 80 columns where the path is long (a pytest-xdist worker's)
    assert "riskiest modules" in " ".join(capsys.readouterr().out.split())


def test_probe_table_shows_each_overflows_value_and_reason(tiny, tmp_path, capsys):
    from tests.planted import PLANTED, save_planted_sd

    root, _ = tiny
    pipe = save_planted_sd(tmp_path / "planted")
    argv = ["probe", str(pipe), "--data", str(root / "prompts.txt"), "-o", str(tmp_path / "p")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "p" / "probe.json").read_text())
    conv = next(m for m in report["modules"] if m["name"] == PLANTED["conv"])
    peak = max(conv["fp16"]["input_absmax"], conv["fp16"]["output_absmax"])
    mantissa, exponent = f"{peak:.1e}".split("e")
    assert peak > 65504 and f"ovf {mantissa}e{int(exponent)} " in out  # fp16 column, 80 cols
    # and the reason, from probe.json, under the table (one line per overflowing module)
    line = next(ln for ln in out.splitlines() if ln.startswith(f"fp16 {PLANTED['conv']}: "))
    assert line == f"fp16 {PLANTED['conv']}: {'; '.join(conv['fp16']['reasons'])}"
    assert "output absmax" in line and "headroom" in line
