"""``evaluate`` sharded by request on torch.distributed (gloo over loopback on this CPU): the
report of 2 or 3 ranks — one host with ``--nproc N``, or two torchrun agents (``--nnodes 2``) —
is the single process's, but for the run's own lines (timings, world, date), at the same threads
per process (``OMP_NUM_THREADS=1``: CPU kernels may sum in another order with more threads)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from opsnn_quant.cli import main
from opsnn_quant.formats.checkpoint import save_quantized
from opsnn_quant.models import load_adapter
from opsnn_quant.quant.api import quantize
from tests.tiny_pipelines import save_tiny_sd

PROMPTS = ["a red circle", "a blue square", "a green circle", "a small red square", "a big blue circle"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    pipe = save_tiny_sd(root / "pipe")
    adapter = load_adapter("diffusers-sd", str(pipe), steps=2, batch_size=2)
    quantize(adapter.model, {"unet.*": "w8a8_dynamic"}, None)
    save_quantized(adapter.model, root / "out" / "quant", source_model=str(pipe))
    (root / "data").mkdir()
    (root / "data" / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    suite = root / "suite.yaml"  # 5 prompts x 2 seeds in batches of 2: ranks get 1 and 2 batches
    suite.write_text(
        "schema_version: 1\nname: tiny\ntask: t2i\n"
        f"data: {{folder: {root / 'data'}, samples: 5}}\nseeds: [0, 100]\n"
        "generation: {steps: 2, guidance_scale: 4.0, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {psnr_min: 5.0}}\n"
    )
    return root, suite


def _args(root, suite, out) -> list[str]:
    return ["evaluate", "--candidate", str(root / "out"), "--suite", str(suite), "-o", str(out),
            "--latency", "none", "--quiet"]  # fmt: skip


def _without_run(path) -> tuple[dict, dict, dict]:
    doc = json.loads((path / "report.json").read_text())
    run = {k: doc.pop(k, None) for k in ("timings", "world", "created")}
    md = (path / "report.md").read_text()
    lines = [ln for ln in md.split("## Run times")[0].splitlines()
             if not ln.startswith(("- run:", "- created:"))]  # fmt: skip
    return doc, run, {"md": lines}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_ranks_on_one_or_two_hosts_write_the_single_process_report(tiny, tmp_path, monkeypatch):
    root, suite = tiny
    # the same threads per process in every run: CPU kernels may sum in another order otherwise
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(_args(root, suite, tmp_path / "one")) == 0
    assert main([*_args(root, suite, tmp_path / "two"), "--nproc", "2"]) == 0
    assert main([*_args(root, suite, tmp_path / "three"), "--nproc", "3"]) == 0  # a batch each
    port = _free_port()
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-id",
                "sim",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "-m",
                "opsnn_quant",
                *_args(root, suite, tmp_path / "hosts"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    for agent in agents:
        log = agent.communicate(timeout=600)[0]
        assert agent.returncode == 0, log[-3000:]
    one, run1, md1 = _without_run(tmp_path / "one")
    assert run1["world"] == {}  # one process, no torchrun: no world line
    for name, size, nodes in (("two", 2, 1), ("three", 3, 1), ("hosts", 2, 2)):
        doc, run, md = _without_run(tmp_path / name)
        assert doc == one and md == md1, name
        assert run["world"] == {"world_size": size, "nodes": nodes, "backend": "gloo",
                                "devices": ["cpu"] * size}  # fmt: skip
        assert [k for k in run["timings"] if k != "gather (rank 0)"] == list(run1["timings"])
        assert run["timings"]["gather (rank 0)"] >= 0
        page = (tmp_path / name / "report.md").read_text()
        ranks = ", ".join(f"rank {r} cpu" for r in range(size))
        assert f"- run: {size} processes on {nodes} host(s), backend gloo: {ranks}" in page
    assert len(one["image_pairs"]) == 10  # every (prompt, seed), gathered in suite order
    # only rank 0 wrote: one report, no temporaries
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts", "one", "three", "two"]


@pytest.mark.slow  # ~22 s on 2 shared cores: two ranks start, load both models
def test_an_idle_rank_takes_part_with_an_empty_share(tiny, tmp_path, monkeypatch, capfd):
    # a suite of one batch (as the built-in shapes suites: 64 prompts in one batch of 64) on 2
    # ranks: rank 0 has no work (the later ranks take the extra batches); it skips generation
    # and gathers an empty share (it used to fail "the calibration data holds no prompts", with
    # torchrun's traceback), and still computes the metrics and writes the report
    root, _ = tiny
    suite = tmp_path / "one-batch.yaml"
    suite.write_text(
        "schema_version: 1\nname: one-batch\ntask: t2i\n"
        f"data: {{folder: {root / 'data'}, samples: 2}}\nseeds: [0]\n"
        "generation: {steps: 2, guidance_scale: 4.0, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {psnr_min: 5.0}}\n"
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main([*_args(root, suite, tmp_path / "one")]) == 0
    capfd.readouterr()
    assert main([*_args(root, suite, tmp_path / "two"), "--nproc", "2"]) == 0
    logs = "".join(capfd.readouterr())
    assert "Traceback" not in logs and "error" not in logs.lower(), logs[-3000:]
    one, _, md1 = _without_run(tmp_path / "one")
    two, run, md2 = _without_run(tmp_path / "two")
    assert two == one and md2 == md1  # rank 0's batch is the whole suite, as in one process
    assert len(two["image_pairs"]) == 2 and run["world"]["world_size"] == 2


def test_bad_distributed_input_is_one_line_exit_2_nothing_written(tiny, tmp_path, capsys):
    root, suite = tiny
    out = tmp_path / "r"
    for extra, message in [
        (["--nproc", "6"], "--nproc 6 is more processes than the 5 samples to share"),
        (["--nproc", "2", "--dist-backend", "nccl"], "backend nccl is not available"),
        (["--nproc", "2", "--device", "cuda"], "not available here"),
    ]:
        assert main([*_args(root, suite, out), *extra]) == 2, extra
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
        assert not out.exists()


@pytest.mark.slow
def test_an_asr_suite_shards_the_same_and_scores_on_rank_0(tmp_path, monkeypatch):
    # WER/CER are torchmetrics metrics: computed on rank 0 alone over the gathered transcripts,
    # without the collective torchmetrics would otherwise wait in (a hang before this test)
    from tests.tiny_pipelines import save_tiny_whisper

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    model = save_tiny_whisper(tmp_path / "whisper", max_target_positions=80)
    suite = tmp_path / "asr.yaml"
    suite.write_text(
        "schema_version: 1\nname: tiny-asr\ntask: asr\n"
        "data: {dataset: speech, split: eval, samples: 3}\n"
        "generation: {max_new_tokens: 8, batch_size: 1}\n"
        "metrics: {fid_features: null, thresholds: {wer_delta_max_points: 100.0}}\n"
    )
    args = ["evaluate", "--candidate", str(model), "--candidate-dtype", "float16", "--suite",
            str(suite), "--latency", "none", "--quiet", "--allow-broken-baseline"]  # fmt: skip
    assert main([*args, "-o", str(tmp_path / "one")]) in (0, 3)
    assert main([*args, "-o", str(tmp_path / "two"), "--nproc", "2"]) in (0, 3)
    one, _, md1 = _without_run(tmp_path / "one")
    two, run, md2 = _without_run(tmp_path / "two")
    assert one == two and md1 == md2
    assert run["world"]["world_size"] == 2 and len(one["transcripts"]) > 0
