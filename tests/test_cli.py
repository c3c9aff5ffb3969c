"""The ``opsnn-quant`` command: calibrate end to end on a tiny pipeline, and bad input."""

import hashlib
import json
from pathlib import Path

import pytest

from opsnn_quant.cli import main
from tests.tiny_pipelines import save_tiny_sd


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    save_tiny_sd(root / "pipe")
    (root / "prompts.txt").write_text("a red circle\na blue square\n")
    recipe = root / "recipe.yaml"
    recipe.write_text(
        f"name: tiny\n"
        f"model: {{family: diffusers-sd, source: {root / 'pipe'}, settings: {{steps: 2, batch_size: 2}}}}\n"
        f"data: {{calibration: {root / 'prompts.txt'}, holdout: {root / 'prompts.txt'}}}\n"
        f"probe: {{max_root_calls: 2}}\n"
        f"budget: {{limits: {{denoiser: {{min_sqnr_db: 20}}}}}}\n"
        f"target: ascend910b-atc\n"
    )
    return root, recipe


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_calibrate_writes_the_design_layout_deterministically(tiny, tmp_path, capsys):
    root, recipe = tiny
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "b"), "--quiet"]) == 0
    for rel in ("probe.json", "policy.yaml", "quant/model.safetensors", "quant/description.json",
                "export/amct.cfg", "export/atc_keep_dtype.cfg", "export/atc_customize_dtypes.cfg",
                "export/atc_modify_mixlist.json", "export/amct_eager.json"):  # fmt: skip
        assert (tmp_path / "a" / rel).is_file(), rel
    for rel in ("policy.yaml", "quant/model.safetensors", "quant/description.json"):
        assert _digest(tmp_path / "a" / rel) == _digest(tmp_path / "b" / rel), rel
    # probe.json records wall times under "costs"; everything else must match exactly
    probes = [json.loads((tmp_path / d / "probe.json").read_text()) for d in ("a", "b")]
    for p in probes:
        p.pop("costs")
    assert probes[0] == probes[1]
    desc = json.loads((tmp_path / "a" / "quant" / "description.json").read_text())
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
    assert report["schema_version"] == 1
    assert {"text_encoder", "denoiser", "image_decoder"} <= set(report["modalities"])
    assert any(m["e2e"] for m in report["modules"])
    assert "riskiest modules" in capsys.readouterr().out
