"""``opsnn_quant.distributed``: sharding by whole batches, gathering in order, failures reaching
every rank (two real gloo processes on loopback), and the checks before a launch."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import pytest
import torch
import torch.multiprocessing as mp

from opsnn_quant.cli._ui import without_nproc
from opsnn_quant.distributed import (
    DistributedError,
    World,
    check_backend,
    check_devices,
    check_nproc,
)
from opsnn_quant.errors import ConfigError


def test_shards_are_whole_batches_in_order_and_cover_everything():
    # 5 items in batches of 2 = 3 batches; 2 ranks: ceil-free split 3*r//2 -> [0, 1), [1, 3)
    assert [World(r, 2).shard(5, 2) for r in range(2)] == [range(0, 2), range(2, 5)]
    # 6 items, batch 1, 4 ranks: batch bounds 0, 1, 3, 4, 6
    assert [World(r, 4).shard(6) for r in range(4)] == [
        range(0, 1), range(1, 3), range(3, 4), range(4, 6),
    ]  # fmt: skip
    # more ranks than batches: the extra ranks get nothing, nothing is repeated
    shards = [World(r, 3).shard(4, 2) for r in range(3)]
    assert shards == [range(0, 0), range(0, 2), range(2, 4)]
    for count, batch, size in [(64, 4, 3), (7, 3, 2), (1, 1, 1), (100, 8, 5)]:
        parts = [World(r, size).shard(count, batch) for r in range(size)]
        assert [i for p in parts for i in p] == list(range(count))
        assert all(p.start % batch == 0 for p in parts if len(p))  # a rank's batches are the
        # single process's batches (same prompts together, same seeds)


@pytest.mark.parametrize("size", [2, 8])
def test_builtin_suites_run_on_2_and_8_ranks_an_idle_rank_runs_nothing(size):
    # shapes-t2i / shapes-dit: 512 prompts in 8 batches of 64 (one batch per rank on 8 ranks);
    # whisper-tiny-en: 512 utterances in 64 batches of 8. Where a suite has fewer batches than
    # ranks, an idle rank never calls the work (an adapter's generate on no prompts raises) and
    # gathers an empty share; the whole suite comes back either way.
    from opsnn_quant.distributed import gather_in_order
    from opsnn_quant.evaluation.suite import builtin_suites, load_suite

    names = builtin_suites()
    assert {"shapes-t2i", "shapes-dit", "whisper-tiny-en"} <= set(names)
    for name in names:
        suite = load_suite(name)
        count, batch = int(suite.data.samples or 0), suite.generation.batch_size
        check_nproc(size, count)  # what --nproc checks before launching
        items = [f"{name} #{i}" for i in range(count)]
        ran: list[int] = []

        def run(part: Sequence[str], first: int, ran: list[int] = ran) -> list[str]:
            if not part:
                raise AssertionError("the calibration data holds no prompts")
            ran.append(first)
            return [x.upper() for x in part]

        gathered = [
            x for r in range(size) for x in gather_in_order(World(r, size), items, batch, run)
        ]
        assert gathered == [x.upper() for x in items], name
        assert len(ran) == min(size, -(-count // batch))  # one call per rank with a batch
        assert ran == sorted(ran) and all(first % batch == 0 for first in ran)


def test_one_process_runs_the_work_itself():
    w = World()
    assert not w.distributed and w.is_main
    assert w.gather(lambda: [1, 2]) == [1, 2]
    assert w.from_main(lambda: "x") == "x" and w.agree(lambda: 3) == 3
    with pytest.raises(ValueError, match="own"):
        w.gather(lambda: (_ for _ in ()).throw(ValueError("own")))


def test_nproc_backend_and_device_checks():
    with pytest.raises(ConfigError, match="more processes than the 4 samples"):
        check_nproc(5, 4)
    with pytest.raises(ConfigError, match="at least 1"):
        check_nproc(0, 4)
    check_nproc(4, 4)
    check_backend("gloo")
    with pytest.raises(ConfigError, match="must be one of hccl, nccl, gloo"):
        check_backend("mpi")
    with pytest.raises(ConfigError, match="torch_npu"):
        check_backend("hccl")
    check_devices("cpu", 64)
    with pytest.raises(ConfigError, match="need 2 cuda devices, but it has 0"):
        check_devices("cuda", 2)


def test_without_nproc_keeps_every_other_argument():
    argv = ["evaluate", "--nproc", "2", "--candidate", "c", "--nproc=3", "-o", "r"]
    assert without_nproc(argv) == ["evaluate", "--candidate", "c", "-o", "r"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_rank(rank: int, size: int, port: int) -> None:
    """This process as torchrun would start rank ``rank`` of ``size`` on this host."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip


def _spawn(fn, size: int) -> dict:
    """``fn(rank, size, port, results)`` in ``size`` processes; every rank's ``results``."""
    port = _free_port()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(fn, args=(size, port, results), nprocs=size, join=True)
        return dict(results)


def _rank(rank: int, size: int, port: int, results: dict) -> None:
    _as_rank(rank, size, port)
    from opsnn_quant.distributed import finish_world, init_world

    world = init_world("cpu")
    out: dict[str, object] = {"world": world.describe()}
    # each rank's share, back in item order on every rank
    items = list(range(10))
    part = world.shard(len(items), 2)
    out["gathered"] = world.gather(lambda: [i * i for i in items[part.start : part.stop]])
    out["main"] = world.from_main(lambda: f"from rank {world.rank}")
    # one batch of 2 items: rank 0 is idle (the later ranks take the extra batches), never runs
    # the work and gathers an empty share
    from opsnn_quant.distributed import gather_in_order

    def generate(part: Sequence[str], first: int) -> list[str]:
        if not part:
            raise ValueError("the calibration data holds no prompts")
        return [f"{x} from rank {world.rank}" for x in part]

    out["one batch"] = gather_in_order(world, ["a", "b"], 2, generate)

    def fails_on_rank_1() -> list[int]:
        if world.rank == 1:
            raise RuntimeError("out of memory on this card\nsecond line")
        return [world.rank]

    # per-rank latency: every rank's samples pooled, each rank's own line (rank 0: 1-3 ms,
    # rank 1: 10-30 ms, hand-made results)
    from opsnn_quant.evaluation.evaluate import rank_latency_notes
    from opsnn_quant.evaluation.latency import LatencyResult
    from opsnn_quant.evaluation.timing import LatencyFigures, stability_by_rank

    samples = [1.0, 2.0, 3.0] if world.rank == 0 else [10.0, 20.0, 30.0]
    mid, top = samples[1], samples[2]
    result = LatencyResult(backend="cpu", device="cpu", warmup=0, runs=3, p50_ms=mid, p90_ms=top,
                           p99_ms=top, mean_ms=mid, std_ms=0.0, min_ms=samples[0], max_ms=top,
                           throughput_per_s=1.0, samples_ms=samples)  # fmt: skip
    out["notes"] = rank_latency_notes(world, LatencyFigures(candidate=result))
    out["stability"] = sorted(stability_by_rank(world, "own row" if world.rank else "row 0"))  # type: ignore[arg-type]
    out["features"] = _features_both_ways(world)
    try:
        world.gather(fails_on_rank_1)
    except DistributedError as exc:
        out["error"] = f"DistributedError: {exc}"
    except RuntimeError as exc:
        out["error"] = f"own RuntimeError: {exc}"
    # a peer that dies (rank 1 exits without a word): rank 0's gather fails at once, one line
    if world.rank == 1:
        results[rank] = out
        os._exit(0)
    import time

    started = time.monotonic()
    try:
        world.gather(lambda: [0])
    except DistributedError as exc:
        out["peer gone"] = (str(exc).splitlines(), time.monotonic() - started)
    finish_world()
    results[rank] = out


class _Scaled(torch.nn.Module):
    """uint8 pixels (what feature modules take) to floats in [0, 1]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() / 255.0


def _features_both_ways(world) -> bool:
    """Whether the FD features each rank extracted of its share, gathered, are the bits of one
    process's extraction (40 images: feature batches of 16, 16 and 8)."""
    from types import SimpleNamespace

    import numpy as np
    from torch import nn

    from opsnn_quant.evaluation.evaluate import QualityInputs
    from opsnn_quant.evaluation.fid import extract_features

    torch.manual_seed(0)
    module = nn.Sequential(_Scaled(), nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    rng = np.random.default_rng(0)
    base = [rng.integers(0, 256, (12, 12, 3), dtype=np.uint8) for _ in range(40)]
    cand = [np.flipud(img).copy() for img in base]
    metrics = QualityInputs(SimpleNamespace(task="t2i"), [], [], [], None, module)  # type: ignore[arg-type]
    fb, fc = metrics.shared_features(world, base, cand)  # type: ignore[misc]
    whole = extract_features(base, module, 16), extract_features(cand, module, 16)
    return torch.equal(fb, whole[0]) and torch.equal(fc, whole[1]) and fb.shape == (40, 4)


def test_two_gloo_ranks_gather_in_order_and_share_one_ranks_failure():
    got = _spawn(_rank, 2)
    for rank in (0, 1):
        assert got[rank]["world"] == {
            "world_size": 2, "nodes": 1, "backend": "gloo", "devices": ["cpu", "cpu"],
        }  # fmt: skip
        assert got[rank]["gathered"] == [i * i for i in range(10)]
        assert got[rank]["main"] == "from rank 0"
        assert got[rank]["one batch"] == ["a from rank 1", "b from rank 1"]
        # numpy's linear percentiles of 1, 2, 3, 10, 20, 30: p50 = 6.5, p99 = 20 + 0.95 * 10
        assert got[rank]["notes"] == [
            "candidate latency over 2 ranks: p50 6.5 ms, p99 29.5 ms; per rank: rank 0 (cpu) "
            "p50 2.0 / p99 3.0 ms; rank 1 (cpu) p50 20.0 / p99 30.0 ms"
        ]
        assert got[rank]["stability"] == ["candidate (rank 0, cpu)", "candidate (rank 1, cpu)"]
        assert got[rank]["features"]  # each rank's share of the FD features: one process's
    # the failing rank re-raises its own error; the other names it, on one line, and is not
    # left waiting in the collective
    assert got[1]["error"].startswith("own RuntimeError: out of memory on this card")
    assert got[0]["error"] == (
        "DistributedError: rank 1 of 2 failed: RuntimeError: out of memory on this card"
    )
    lines, waited = got[0]["peer gone"]
    assert len(lines) == 1 and lines[0].startswith("rank 0 of 2: a collective failed"), lines
    assert waited < 30, waited  # not the 6 h collective timeout


def _lockstep_rank(rank: int, size: int, port: int, results: dict) -> None:
    _as_rank(rank, size, port)
    from opsnn_quant.distributed import Lockstep, finish_world, init_world

    world = init_world("cpu")
    out: dict[str, object] = {}
    points = ("ready", "statistics", "done")

    def run(fail_rank: int | None, fail_at: str) -> object:
        """Every rank meets the points; ``fail_rank`` raises just before ``fail_at``."""
        step = Lockstep(world, points, to_main=("statistics",))
        got: dict[str, object] = {}

        def work() -> None:
            for point in points:
                if world.rank == fail_rank and point == fail_at:
                    raise ValueError(f"bad shard on rank {world.rank}")
                got[point] = step.meet(point, f"r{world.rank}")

        try:
            step.run(work)
        except (DistributedError, ValueError) as exc:
            got["error"] = f"{type(exc).__name__}: {exc}"
        return got

    out["ok"] = run(None, "")
    out["rank 2 fails in its pass"] = run(2, "statistics")
    out["rank 0 fails after"] = run(0, "done")
    finish_world()
    results[rank] = out


def test_lockstep_every_rank_meets_every_point_and_one_failure_ends_them_all():
    got = _spawn(_lockstep_rank, 3)
    for rank in range(3):
        ok = got[rank]["ok"]
        assert ok["ready"] == ok["done"] == ["r0", "r1", "r2"]
        assert ok["statistics"] == (["r0", "r1", "r2"] if rank == 0 else [])  # to rank 0 only
    # rank 2 fails before sending its statistics: rank 0 learns it there, rank 1 at "done"
    failed = {r: got[r]["rank 2 fails in its pass"]["error"] for r in range(3)}
    assert failed[2] == "ValueError: bad shard on rank 2"
    assert (
        failed[0]
        == failed[1]
        == "DistributedError: rank 2 of 3 failed: ValueError: bad shard on rank 2"
    )
    assert "statistics" in got[1]["rank 2 fails in its pass"]  # rank 1 had sent its own
    # rank 0 fails after the statistics (writing the output): the others at "done"
    late = {r: got[r]["rank 0 fails after"]["error"] for r in range(3)}
    assert late[0] == "ValueError: bad shard on rank 0"
    assert (
        late[1]
        == late[2]
        == "DistributedError: rank 0 of 3 failed: ValueError: bad shard on rank 0"
    )


def _wait_in_a_collective(argv: list[str]) -> int:
    """A rank that writes its pid into ``argv[0]`` and waits in a collective nobody completes
    (a receive from its peer: the 6 h timeout), as a rank idle in a gather does."""
    from pathlib import Path

    import torch.distributed as dist

    from opsnn_quant.distributed import init_world

    world = init_world("cpu")
    Path(argv[0], f"rank{world.rank}.pid").write_text(str(os.getpid()))
    dist.recv(torch.zeros(1), src=1 - world.rank)
    return 0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_ranks_end_when_their_launcher_is_killed(tmp_path):
    # launch_local's ranks (what --nproc starts) waiting in a collective; the launcher is
    # SIGKILLed (or OOM-killed): each rank sees its parent gone and exits within seconds with
    # one error line, instead of idling for the 6 h collective timeout holding its memory
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    launcher = (
        "import sys\n"
        "from opsnn_quant.distributed import launch_local\n"
        "from tests.test_distributed import _wait_in_a_collective\n"
        "sys.exit(launch_local(2, _wait_in_a_collective, [sys.argv[1]]))\n"
    )
    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", launcher, str(tmp_path)], cwd=root,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120  # two ranks import torch on a busy machine
        while len(files := sorted(tmp_path.glob("rank*.pid"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(0.5)  # both in the receive by now
        pids = [int(f.read_text()) for f in files]
        assert all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        while any(_alive(p) for p in pids) and time.monotonic() - killed < 30:
            time.sleep(0.1)
        took = time.monotonic() - killed
        assert not any(_alive(p) for p in pids), f"ranks still there {took:.0f} s after"
        assert took < 10, took  # a check a second
        print(f"ranks gone {took:.1f} s after the launcher was killed")
        # the first rank to see it says so; its peer may see it too, or first see its
        # receive fail (the connection closed) and end as a failed rank
        said = {ln for ln in log.read_text().splitlines() if "is gone" in ln}
        assert said and said <= {
            f"error: rank {r} of 2: its launcher (pid {proc.pid}) is gone; exiting" for r in (0, 1)
        }, log.read_text()[-3000:]
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
