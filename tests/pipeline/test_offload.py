"""``calibrate --max-memory`` (issue 43 §5): a tiny diffusion transformer pipeline calibrated in
memory and with its blocks offloaded writes the same files; what does not run offloaded yet
is refused before any work."""

from __future__ import annotations

import json

import pytest

from opsnn_quant.cli import main
from tests.pipeline.conftest import run_files
from tests.tiny_pipelines import save_tiny_sd3, tiny_dit_recipe

NAIVE = ["--strategy", "all-w8a8-dynamic", "--limit", "2", "--set", "steps=2", "--quiet"]


@pytest.fixture(scope="module")
def tiny_dit(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload")
    save_tiny_sd3(root / "pipe")
    return root, tiny_dit_recipe(root, "offload", target="ascend910b-mindie-sd")


def test_an_offloaded_calibrate_writes_the_same_files(tiny_dit, tmp_path, offloads):
    _root, recipe = tiny_dit
    made = offloads
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "mem"), *NAIVE]) == 0
    assert made == []
    # the weights need ~1.4 MB; 128 KiB holds the activations' floor but none of the blocks
    cap = ["--max-memory", "128KiB"]
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "off"), *NAIVE, *cap]) == 0
    (off,) = made  # the run's one model (a naive strategy loads no other copy)
    assert "transformer.transformer_blocks.0" in off.offloaded
    assert "text_encoder_3.encoder.block.1" in off.offloaded
    # each block was loaded for its forwards (2 steps x classifier-free guidance, the text
    # encoders, the VAE...), then freed: the quantized blocks are on the meta device again
    assert off.loads > 2 * len(off.offloaded)
    blocks = off.model.get_submodule("transformer.transformer_blocks")
    tensors = [*blocks.parameters(), *blocks.buffers()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert not off.dir.exists()  # the temporary files removed
    mem, offloaded = run_files(tmp_path / "mem"), run_files(tmp_path / "off")
    assert mem.keys() == offloaded.keys()
    assert any(k.startswith("quant/") and k.endswith(".safetensors") for k in mem)
    assert any(k.startswith("export/mindie-sd/") for k in mem)
    assert any(k.startswith("export/ascendv1/") for k in mem)
    assert [k for k in mem if mem[k] != offloaded[k]] == []
    timings = json.loads((tmp_path / "off" / "timings.json").read_text())
    assert timings  # the one file that may differ


def test_the_search_runs_its_estimators_offloaded_to_the_same_files(tiny_dit, tmp_path, offloads):
    """The recipe's own search (no naive strategy): pass 1, GPTQ's moments, the SmoothQuant
    search (blocks opened one at a time), the structured estimator's backward (checkpointed
    block by block; the candidates built in the block loaded for it, the local errors
    measured there), then quantize and the exports: every file the same bytes as the run all
    in memory (``probe.json`` too: a checkpointed block's recompute is not counted as another
    call). The diagonal estimator: the next test."""
    _root, path = tiny_dit
    flags = ["--limit", "1", "--set", "steps=1", "--search", "full", "--quiet"]
    assert main(["calibrate", str(path), "-o", str(tmp_path / "mem"), *flags]) == 0
    assert offloads == []
    cap = ["--max-memory", "128KiB"]
    assert main(["calibrate", str(path), "-o", str(tmp_path / "off"), *flags, *cap]) == 0
    off = offloads[0]  # the run's model (the held-out measurement may load another copy)
    assert "transformer.transformer_blocks.0" in off.offloaded
    assert all(o.loads > 2 * len(o.offloaded) for o in offloads)
    mem, offloaded = run_files(tmp_path / "mem"), run_files(tmp_path / "off")
    assert mem.keys() == offloaded.keys()
    report = json.loads(mem["probe.json"])
    assert report.get("not_estimated") is None  # the estimators ran (nothing decided first)
    # the gradient crossed the checkpointed blocks: every module of the first block moves
    # the output; GPTQ and SmoothQuant candidates scored there
    first = [m["e2e"] for m in report["modules"]
             if m["name"].startswith("transformer.transformer_blocks.0.") and m["e2e"]]  # fmt: skip
    assert len(first) >= 12 and all(e["contribution"] > 0 for e in first)
    assert {"w8a8_dynamic_gptq", "w8a8_dynamic_smoothquant"} <= set(first[0]["schemes"])
    assert [k for k in mem if mem[k] != offloaded[k]] == []


def test_deciding_first_offloaded_writes_the_same_files(tiny_dit, tmp_path, offloads):
    """The recipe as it is (decide first, no floor): each naive baseline measured quantizes a
    copy loaded again with the run's offload settings; the same files as in memory."""
    _root, path = tiny_dit
    flags = ["--limit", "1", "--set", "steps=1", "--quiet"]
    assert main(["calibrate", str(path), "-o", str(tmp_path / "mem"), *flags]) == 0
    assert offloads == []
    cap = ["--max-memory", "128KiB"]
    assert main(["calibrate", str(path), "-o", str(tmp_path / "off"), *flags, *cap]) == 0
    # the run's model, then a copy per baseline measured (no floor: both, the more accurate wins)
    assert len(offloads) == 3
    assert all("transformer.transformer_blocks.0" in o.offloaded for o in offloads)
    mem, offloaded = run_files(tmp_path / "mem"), run_files(tmp_path / "off")
    report = json.loads(mem["probe.json"])
    assert report["not_estimated"].startswith("decided first: all-w8a8-")
    assert [k for k in mem if mem[k] != offloaded[k]] == []


def test_an_offloaded_probe_writes_the_same_report(tiny_dit, tmp_path, offloads):
    """``probe --max-memory`` offloads too (it checked the memory floor only): the same
    ``probe.json``, the temporary files removed. With the diagonal estimator: its local
    errors in pass 2, each call's candidates built while their block is loaded."""
    root, plain = tiny_dit
    data = json.loads(plain.read_text())
    data["probe"] = {**data["probe"], "estimator": "diagonal"}
    recipe = root / "diagonal.yaml"
    recipe.write_text(json.dumps(data))
    flags = ["--limit", "1", "--set", "steps=1", "--quiet"]
    assert main(["probe", str(recipe), "-o", str(tmp_path / "mem"), *flags]) == 0
    cap = ["--max-memory", "128KiB"]
    assert main(["probe", str(recipe), "-o", str(tmp_path / "off"), *flags, *cap]) == 0
    (off,) = offloads
    assert "transformer.transformer_blocks.0" in off.offloaded and not off.dir.exists()
    assert off.loads > 2 * len(off.offloaded)
    mem, offloaded = (tmp_path / d / "probe.json" for d in ("mem", "off"))
    assert mem.read_bytes() == offloaded.read_bytes()
    report = json.loads(mem.read_text())
    assert report["config"]["estimator"] == "diagonal"
    first = [m["e2e"] for m in report["modules"]
             if m["name"].startswith("transformer.transformer_blocks.0.") and m["e2e"]]  # fmt: skip
    assert len(first) >= 12 and all(e["contribution"] > 0 for e in first)


@pytest.mark.parametrize(
    ("flag", "words"),
    [("--exhaustive", "exhaustive reference"), ("--nproc=2", "leave out --nproc")],
)
def test_what_an_offloaded_probe_does_not_run_is_refused_before_work(
    tiny_dit, tmp_path, capsys, flag, words
):
    _root, recipe = tiny_dit
    code = main(["probe", str(recipe), "-o", str(tmp_path / "o"), flag,
                 "--max-memory", "128KiB", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --max-memory")
    assert words in err[0] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size", ["lots", "0", "-1GiB", "12XB", "nan"])
def test_bad_max_memory_is_one_error_line(tiny_dit, tmp_path, capsys, size):
    _root, recipe = tiny_dit
    code = main(["calibrate", str(recipe), "-o", str(tmp_path / "o"), *NAIVE, "--max-memory", size])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert "--max-memory" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_recipe_max_memory_is_read_as_bytes(tiny_dit, tmp_path, capsys):
    from opsnn_quant.pipeline.recipe import load_recipe

    _root, recipe = tiny_dit
    data = json.loads(recipe.read_text())
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(json.dumps({**data, "model": {**data["model"], "max_memory": "2GiB"}}))
    bad.write_text(json.dumps({**data, "model": {**data["model"], "max_memory": "two gigs"}}))
    assert load_recipe(str(good)).model.max_memory == 2 << 30
    code = main(["calibrate", str(bad), "-o", str(tmp_path / "o"), *NAIVE])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert "max_memory" in err[0] and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        # the recipe's search (no budget.metric) with the exhaustive reference
        (["--quiet"], "exhaustive reference"),
        (["--strategy", "all-w8a8-minmax", "--engine", "amct", "--quiet"], "--engine amct"),
    ],
)
def test_what_does_not_run_offloaded_is_refused_before_work(
    tiny_dit, tmp_path, capsys, monkeypatch, flags, words
):
    root, plain = tiny_dit
    data = json.loads(plain.read_text())
    data["probe"] = {**data["probe"], "exhaustive": True}
    recipe = root / "exhaustive.yaml"
    recipe.write_text(json.dumps(data))
    monkeypatch.setattr(
        "opsnn_quant.pipeline.calibrate.load_data",
        lambda *a, **k: pytest.fail("work started"),
    )
    code = main(["calibrate", str(recipe), "-o", str(tmp_path / "o"), *flags,
                 "--max-memory", "1GiB"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --max-memory")
    assert words in err[0] and list(tmp_path.iterdir()) == []
