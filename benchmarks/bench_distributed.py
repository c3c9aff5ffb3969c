"""``opsnn-quant evaluate`` on 1 and 2 processes (torch.distributed, gloo on CPU), side by side.

For each demo suite and sample count: the wall time of one process (no torchrun) and of
``--nproc 2`` (torchrun's elastic agent, one rank per process, whole batches each), the speed-up,
and what distributing cost: rank 0's seconds in collectives ("gather", waiting for the slower
rank included) as a share of the run, from the report's run times, and whether the 2-process
report is the same, but for its run lines, as that of one process with the threads each rank
has (CPU kernels may sum in another order with another thread count, so one process at its
default threads can differ in the last bits of an image; on an NPU each rank is one device, as
the single process is). The sample counts double, so a gather that is linear in
samples shows as a share that stays flat.

Demo suites: ``shapes-t2i`` on the demo's calibrate output (built first when missing, ~35 s),
and ``whisper-tiny-en`` with the zoo Whisper (``zoo:whisper-tiny.en``) cast to fp16 as the candidate (no calibration
needed). Each suite is copied with ``data.samples`` set and latency off (``--latency none``):
what is timed is generation, metrics and gathering.

On a machine with C cores, N processes each get C // N OpenMP threads: on 2 cores, 2 ranks of
1 thread share the cores 1 process of 2 threads has, so the speed-up is bounded by the cores
(2x here), and above 1x only where one process does not keep both cores busy (small models, the
Python between kernels). On an Ascend host each rank has its own NPU.

With ``--calibrate``: ``opsnn-quant calibrate`` of the demo recipe (``shapes-t2i``, 10 steps,
batches of 4) over ``--limits`` calibration prompts, on 1 and 2 processes: wall time, rank 0's
probe statistics pass (its share of the batches) against the single process's, the merge (rank 0
waiting for the other rank's statistics and folding them in, from ``timings.json``) as a share
of the run, and whether every file but the run's own (``timings.json``, run-token markers) is the
same bytes as one process's at the threads each rank has. Only the statistics pass is shared:
the rest of the probe (the attribution's replays of a bounded reservoir of recorded calls) and
quantize / exports run on rank 0, so the speed-up is bounded by the pass's share of the run.

Run from the repository root: ``python benchmarks/bench_distributed.py [--samples 16 32 64]``,
``python benchmarks/bench_distributed.py --calibrate [--limits 8 16 32]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from opsnn_quant.evaluation.suite import suite_file

DEMO = Path("out/shapes-t2i")


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    wanted = ("avx2", "avx512f", "avx512_vnni", "amx_int8", "asimd", "sve")
    return " ".join(f for f in wanted if f in flags) or "none of avx2/avx512/amx/neon"


def _suite(name: str, samples: int, directory: Path) -> Path:
    doc = yaml.safe_load(suite_file(name).read_text())
    doc["data"]["samples"] = samples
    # batches small enough that 2 ranks both get work (a batch is never split between ranks)
    doc["generation"]["batch_size"] = min(doc["generation"].get("batch_size") or 8, 8)
    path = directory / f"{name}-{samples}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _evaluate(
    candidate: list[str], suite: Path, out: Path, nproc: int, threads: int | None = None
) -> tuple[float, dict]:
    cmd = ["opsnn-quant", "evaluate", *candidate, "--suite", str(suite), "-o", str(out),
           "--latency", "none", "--quiet", "--force"]  # fmt: skip
    seconds = _timed(cmd, nproc, threads, ok=(0, 3, 4))  # 3 FAIL, 4 INCONCLUSIVE: still timed runs
    return seconds, json.loads((out / "report.json").read_text())


def _timed(cmd: list[str], nproc: int, threads: int | None, ok: tuple[int, ...] = (0,)) -> float:
    """Seconds ``cmd`` took (with ``--nproc`` above 1 process; ``threads`` OpenMP threads)."""
    if nproc > 1:
        cmd = [*cmd, "--nproc", str(nproc)]
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode not in ok:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return seconds


def _without_run(report: dict) -> dict:
    """The report but its run's own fields (date, run times, world)."""
    return {k: v for k, v in report.items() if k not in ("created", "timings", "world")}


def _calibrate(limit: int, out: Path, nproc: int, threads: int | None = None) -> float:
    cmd = ["opsnn-quant", "calibrate", "shapes-t2i", "--limit", str(limit), "--set",
           "batch_size=4", "-o", str(out), "--quiet", "--force"]  # fmt: skip
    return _timed(cmd, nproc, threads)


def _files(root: Path) -> dict[str, str]:
    """sha1 of every file but the run's own (wall-clock times, run-token markers)."""
    own = {"timings.json", ".opsnn-quant.json"}
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in own
    }


def _probe_costs(out: Path) -> dict[str, float]:
    return dict(json.loads((out / "timings.json").read_text()).get("probe", {}))


def calibrate_table(limits: list[int]) -> None:
    """Time calibrate of the demo at each data size on 1 and 2 processes; print one table."""
    per_rank = max(1, (os.cpu_count() or 1) // 2)
    header = ("prompts", "batches", "1 proc s", "2 procs s", "speed-up", "pass 1 s (1 / 2 procs)",
              "merge s", "merge %", f"same files as 1 proc of {per_rank} thread(s)")  # fmt: skip
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for n in limits:
            one = _calibrate(n, work / "one", 1)
            two = _calibrate(n, work / "two", 2)
            pass1, shared = _probe_costs(work / "one"), _probe_costs(work / "two")
            merge = shared.get("pass1_merge_seconds", 0.0)
            _calibrate(n, work / "ref", 1, threads=per_rank)
            same = "yes" if _files(work / "ref") == _files(work / "two") else "NO"
            print(f"| {n} | {-(-n // 4)} | {one:.1f} | {two:.1f} | {one / two:.2f}x | "
                  f"{pass1['pass1_seconds']:.1f} / {shared['pass1_seconds']:.1f} | {merge:.2f} | "
                  f"{100 * merge / two:.1f} % | {same} |", flush=True)  # fmt: skip


def main() -> None:
    """Time each suite at each sample count on 1 and 2 processes (or calibrate at each data
    size); print one table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--suites", nargs="+", default=["shapes-t2i", "whisper-tiny-en"])
    ap.add_argument("--calibrate", action="store_true", help="time calibrate instead")
    ap.add_argument("--limits", type=int, nargs="+", default=[8, 16, 32])
    args = ap.parse_args()
    print(f"cpu: {platform.machine()}, {os.cpu_count()} cores, flags: {_cpu_flags()}; "
          "backend cpu / cpu-reference; gloo over loopback")  # fmt: skip
    if args.calibrate:
        calibrate_table(args.limits)
        return
    if "shapes-t2i" in args.suites and not (DEMO / "quant").is_dir():
        subprocess.run(["opsnn-quant", "calibrate", "-o", str(DEMO), "--quiet"], check=True)
    candidates = {
        "shapes-t2i": ["--candidate", str(DEMO)],
        "whisper-tiny-en": ["--candidate", "zoo:whisper-tiny.en", "--candidate-dtype", "float16"],
    }
    per_rank = max(1, (os.cpu_count() or 1) // 2)
    header = ("suite", "samples", "1 proc s", "2 procs s", "speed-up", "gather s", "gather %",
              f"same report as 1 proc of {per_rank} thread(s)")  # fmt: skip
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.suites:
            for n in args.samples:
                suite = _suite(name, n, work)
                one, _ = _evaluate(candidates[name], suite, work / "one", 1)
                two, report = _evaluate(candidates[name], suite, work / "two", 2)
                gather = report["timings"].get("gather (rank 0)", 0.0)
                # the same threads per process as each rank has: the bytes to compare with
                _, single = _evaluate(candidates[name], suite, work / "ref", 1, threads=per_rank)
                same = "yes" if _without_run(single) == _without_run(report) else "NO"
                print(f"| {name} | {n} | {one:.1f} | {two:.1f} | {one / two:.2f}x | "
                      f"{gather:.2f} | {100 * gather / two:.1f} % | {same} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
