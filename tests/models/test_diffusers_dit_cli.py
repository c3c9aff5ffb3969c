"""``opsnn-quant calibrate`` end to end on a tiny random-config SD3 pipeline (diffusers-dit)."""

import hashlib
import json

import pytest
import yaml

from opsnn_quant.cli import main
from tests.tiny_pipelines import save_tiny_sd3

pytest.importorskip("diffusers")


def _recipe(root, family="diffusers-dit"):
    path = root / f"{family}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-sd3",
                "model": {
                    "family": family,
                    "source": str(root / "pipe"),
                    "settings": {"steps": 2, "batch_size": 2, "height": 16, "width": 16}
                    | ({"max_sequence_length": 16} if family == "diffusers-dit" else {}),
                },
                "data": {
                    "calibration": str(root / "prompts.txt"),
                    "holdout": str(root / "holdout.txt"),
                },
                "probe": {"max_root_calls": 2},
                "budget": {"limits": {"denoiser": {"min_sqnr_db": 20}}},
                "search": "full",  # every root's end-to-end estimate (below)
                "target": "ascend910b-atc",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("dit-cli")
    save_tiny_sd3(root / "pipe")
    (root / "prompts.txt").write_text("a red circle\na blue square\na green circle at the top\n")
    (root / "holdout.txt").write_text("a large blue circle\na small red square\n")
    return root


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_calibrate_quantizes_the_transformer_deterministically(tiny, tmp_path):
    from safetensors import safe_open

    recipe = _recipe(tiny)
    for out in ("a", "b"):
        assert main(["calibrate", str(recipe), "-o", str(tmp_path / out), "--quiet"]) == 0
    for rel in ("policy.yaml", "quant/model.safetensors", "quant/description.json"):
        assert _digest(tmp_path / "a" / rel) == _digest(tmp_path / "b" / rel), rel
    out = tmp_path / "a"
    desc = json.loads((out / "quant" / "description.json").read_text())
    int8 = {n for n, m in desc["modules"].items() if m["precision"].startswith("w8a8")}
    blocks = {n for n in int8 if n.startswith("transformer.transformer_blocks.")}
    assert blocks, "no transformer block Linear is int8"
    # Every text encoder is a root of its own, with its own end-to-end estimate.
    probe = json.loads((out / "probe.json").read_text())
    with_e2e = {m["name"].split(".")[0] for m in probe["modules"] if m.get("e2e")}
    assert {"transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"} <= with_e2e
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    assert policy["model"] == str(tiny / "pipe")
    name = sorted(blocks)[0]
    with safe_open(str(out / "quant" / "model.safetensors"), "pt") as f:
        assert str(f.get_tensor(f"{name}.weight").dtype) == "torch.int8"


def test_family_mismatch_is_one_line_exit_2(tiny, tmp_path, capsys):
    recipe = _recipe(tiny, family="diffusers-sd")
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tiny / 'pipe'} is a StableDiffusion3Pipeline whose denoiser is a "
        "transformer, not a UNet: use family diffusers-dit"
    ]
    assert not (tmp_path / "o").exists()
