"""``calibrate`` on torch.distributed (gloo over loopback on this CPU): the probe's pass 1 shared
by rank, the statistics merged exactly, rank 0 doing the rest and writing
(opsnn_quant/pipeline/sharing.py). The output of ``torchrun --nproc-per-node 2 -m opsnn_quant
calibrate`` is the single process's, byte for byte but the run's own files (``timings.json``,
the run-token markers), at the same threads per process (``OMP_NUM_THREADS=1``: CPU kernels may
sum in another order with more threads)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsnn_quant.cli import main
from tests.tiny_pipelines import save_tiny_sd

RUN_OWN = {"timings.json", ".opsnn-quant.json"}  # wall-clock times, run-token markers


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads at 1 in this process for the block."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in RUN_OWN
    }


def _torchrun(nproc: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``torchrun`` of ``nproc`` ranks (0: one process without torchrun), one thread each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    cmd = [sys.executable, *(launcher if nproc else []), "-m", "opsnn_quant", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_ranks_write_the_single_process_output_of_the_demo(tmp_path):
    # the demo recipe, smaller: 4 prompts in 2 batches of 2 (a batch per rank), 2 steps
    args = ["calibrate", "shapes-t2i", "--limit", "4", "--set", "steps=2", "--set",
            "batch_size=2", "--quiet"]  # fmt: skip
    with one_thread():  # as each rank has
        assert main([*args, "-o", str(tmp_path / "one")]) == 0
    done = _torchrun(2, [*args, "-o", str(tmp_path / "two")], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = _files(tmp_path / "one"), _files(tmp_path / "two")
    assert {"policy.yaml", "probe.json", "quant/model.safetensors"} <= one.keys()
    assert any(k.startswith("export/") for k in one)
    assert two == one  # policy, probe report, checkpoint, every export: the same bytes
    # rank 0 ran the probe's pass 1 over its batch only (the other batch's statistics merged)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]  # no temporaries


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("share")
    save_tiny_sd(root / "pipe")
    prompts = ["a red circle", "a blue square", "a green circle", "a red square", "a big circle"]
    (root / "prompts.txt").write_text("\n".join(prompts) + "\n")
    return root


def _tiny_args(root: Path, out: Path) -> list[str]:
    return ["calibrate", "--model", str(root / "pipe"), "--data", str(root / "prompts.txt"),
            "--set", "steps=2", "--set", "batch_size=2", "-o", str(out), "--quiet"]  # fmt: skip


def test_bad_distributed_input_is_one_line_exit_2_nothing_written(tiny, tmp_path, capsys):
    out = tmp_path / "o"
    for extra, message in [
        # 5 prompts in batches of 2: 3 batches, never split
        (["--nproc", "4"], "4 processes share 5 calibration records in batches of 2: 3 batch"),
        (["--nproc", "0"], "--nproc must be at least 1"),
        (["--nproc", "2", "--dist-backend", "nccl"], "backend nccl is not available"),
        (["--nproc", "2", "--device", "cuda"], "need 2 cuda devices, but it has 0"),
    ]:
        assert main([*_tiny_args(tiny, out), *extra]) == 2, extra
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
        assert not out.exists()


@pytest.mark.parametrize("command", ["calibrate", "probe"])
def test_a_failure_on_rank_0_ends_every_rank_with_its_error(tiny, tmp_path, command):
    # rank 0 refuses the output (not this command's output) before any work; rank 1 learns it
    # at the first meeting point (calibrate: after loading the model; probe: the check itself
    # is rank 0's, shared) and exits too, naming rank 0
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    args = _tiny_args(tiny, out)
    if command == "probe":
        args = ["probe", str(tiny / "pipe"), *args[3:]]
    done = _torchrun(2, args, tmp_path)
    assert done.returncode != 0
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 2, done.stderr[-3000:]
    own = next(e for e in errors if "rank 0 of 2 failed" not in e)
    assert str(out) in own, own
    assert any(e.startswith("error: rank 0 of 2 failed: ") for e in errors), errors
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
