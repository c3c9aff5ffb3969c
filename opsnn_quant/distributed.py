"""Request-level parallelism on ``torch.distributed``: one process per device, whole requests each.

A command launched by ``torchrun`` (or ``--nproc N``, which starts torchrun's elastic agent on
this host) finds ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in its environment; :func:`init_world`
joins the process group (``hccl`` for Ascend NPUs, ``nccl`` for CUDA, ``gloo`` on CPU) and binds
each rank to its device (``npu:{local_rank}``, ``cuda:{local_rank}``, or the CPU). Work is split
by :meth:`World.shard`, in whole batches (a rank's batches are the single process's batches, with
the same seeds, so the outputs are the same bytes), and put back together in order by
:meth:`World.gather`, which also carries failures: a rank whose work raised sends its error
instead, and every rank raises :class:`DistributedError` naming that rank (no rank is left
waiting in a collective for a peer that died).

A rank never outlives its launcher: :func:`watch_parent` (started by :func:`launch_local` in each
rank it spawns, and by :func:`init_world` under an external ``torchrun``) ends the rank, with one
``error:`` line, within seconds of its parent process going (a launcher killed by SIGKILL or the
OOM killer); a collective whose peer died (its connection closed) fails at once with a
:class:`DistributedError`, so the 6 h :data:`COLLECTIVE_TIMEOUT` only ever waits for a slow rank.

Gathering goes through ``torch.distributed.all_gather_object``: our own in-process objects
(images, transcripts, figures), pickled between the ranks of one job, never a user's file.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from opsnn_quant.errors import ConfigError, OpsnnQuantError

log = logging.getLogger(__name__)

_T = TypeVar("_T")
BACKENDS = ("hccl", "nccl", "gloo")
# How long a rank waits in a collective: at a gather, a fast rank waits for the slowest rank's
# whole shard of generation (hours on a large suite), not only for the transfer.
COLLECTIVE_TIMEOUT = timedelta(hours=6)
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# How often a rank checks that the process that launched it is still there.
PARENT_POLL_SECONDS = 1.0


class DistributedError(OpsnnQuantError):
    """A rank of a distributed run failed (the message names the rank and its error)."""


@dataclass(frozen=True)
class _Failure:
    """What a rank sends instead of its results when its work raised."""

    rank: int
    message: str


@dataclass(frozen=True)
class World:
    """This process's place in a distributed run (one process, no group, by default).

    Attributes:
        rank, size: this process's rank and the number of processes.
        local_rank: its rank on this host (the device index it binds).
        backend: the process group's backend (None: not distributed).
        device: the device this rank runs on (``cpu``, ``npu:1``, ``cuda:0``...).
        devices: every rank's device, in rank order.
        nodes: the number of hosts (``torchrun --nnodes``).
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: str = "cpu"
    devices: tuple[str, ...] = field(default=("cpu",))
    nodes: int = 1

    @property
    def is_main(self) -> bool:
        """Whether this rank writes the outputs and prints (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether a process group was joined (a ``torchrun`` launch, even of one process)."""
        return self.backend is not None

    def shard(self, count: int, batch: int = 1) -> range:
        """This rank's items of ``count``: a contiguous run of whole batches of ``batch`` items
        (the batches split as evenly as they go, later ranks taking one more: with fewer
        batches than ranks, rank 0, which also computes and writes what follows, is idle)."""
        batches = -(-count // max(batch, 1))
        first = self.rank * batches // self.size
        last = (self.rank + 1) * batches // self.size
        return range(min(first * batch, count), min(last * batch, count))

    def gather(self, work: Callable[[], list[_T]]) -> list[_T]:
        """Run ``work`` (this rank's share) and return every rank's results concatenated in
        rank order, on every rank.

        Raises:
            DistributedError: a rank's ``work`` raised (every rank raises, naming it); this
                rank's own error is re-raised as it was when it is the only one.
        """
        if not self.distributed:
            return work()
        own: list[_T] | _Failure
        error: BaseException | None = None
        try:
            own = work()
        except Exception as exc:  # sent to the peers, then re-raised below
            error, own = exc, _Failure(self.rank, _one_line(exc))
        parts = _all_gather(own, self.size)
        failed = [p for p in parts if isinstance(p, _Failure)]
        if failed:
            if error is not None and len(failed) == 1:
                raise error
            first = failed[0]
            raise DistributedError(f"rank {first.rank} of {self.size} failed: {first.message}")
        return [item for part in parts for item in part]

    def from_main(self, work: Callable[[], _T]) -> _T:
        """Rank 0 runs ``work``; every rank gets its result (failures as in :meth:`gather`)."""
        return self.gather(lambda: [work()] if self.is_main else [])[0]

    def agree(self, step: Callable[[], _T]) -> _T:
        """Run ``step`` on every rank and return this rank's result (nothing is sent but
        success); when one rank raises, every rank raises (see :meth:`gather`). For the steps
        before a collective (loading models, checking inputs) that could fail on one rank."""
        kept: list[_T] = []

        def run() -> list[None]:
            kept.append(step())
            return [None]

        self.gather(run)
        return kept[0]

    def describe(self) -> dict[str, Any]:
        """What a report records of the run: world size, hosts, backend, each rank's device."""
        return {
            "world_size": self.size,
            "nodes": self.nodes,
            "backend": self.backend,
            "devices": list(self.devices),
        }


_WORLD = World()


class Lockstep:
    """The meeting points of a command whose ranks do different work between them (calibrate:
    every rank gathers its share's statistics, rank 0 alone does the rest), met by every rank
    in the same order.

    A rank whose work raised still meets every remaining point, sending its failure, so no
    rank ever waits in a collective for one that left; at the first point that carries a
    failure every rank raises: :class:`DistributedError` naming the first failed rank and its
    error (the failed rank itself re-raises its own error).

    Args:
        world: this rank's world.
        points: the points' names, in order.
        to_main: the points where only rank 0 receives (the others get an empty list, and
            learn of a failure sent there at the next point). Fixed here, not per call: a rank
            walking the points after its failure must make the same collective as the others.
    """

    def __init__(self, world: World, points: Sequence[str], to_main: Sequence[str] = ()) -> None:
        self.world = world
        self.points = tuple(points)
        self.to_main = frozenset(to_main)
        self.met = 0
        self.failure: _Failure | None = None

    def meet(self, point: str, payload: Any = None) -> list[Any]:
        """Meet the others at ``point`` (the next one), with ``payload``.

        Args:
            point: the point's name (checked against the order).
            payload: what this rank brings (pickled).

        Returns:
            Every rank's payload in rank order (on rank 0; on every rank unless the point is
            one of ``to_main``).

        Raises:
            DistributedError: a rank failed (see the class).
        """
        expected = self.points[self.met] if self.met < len(self.points) else None
        if point != expected:
            raise DistributedError(f"rank {self.world.rank} met {point!r}, expected {expected!r}")
        self.met += 1
        parts = self._exchange(self.failure or payload, point in self.to_main)
        failed = [p for p in parts if isinstance(p, _Failure)]
        if failed and self.failure is None:
            first = failed[0]
            self.failure = first
            raise DistributedError(
                f"rank {first.rank} of {self.world.size} failed: {first.message}"
            )
        return parts

    def run(self, work: Callable[[], _T]) -> _T:
        """``work()`` (which meets the points); when it raises, the points it did not meet are
        met with the failure before the error goes on."""
        try:
            return work()
        except BaseException as exc:
            if self.failure is None:
                self.failure = _Failure(self.world.rank, _one_line(exc))
            for point in self.points[self.met :]:
                with contextlib.suppress(DistributedError):
                    self.meet(point)
            raise

    def _exchange(self, payload: Any, to_main: bool) -> list[Any]:
        if not self.world.distributed:
            return [payload]
        if not to_main:
            return _all_gather(payload, self.world.size)
        import torch.distributed as dist

        t0 = time.perf_counter()
        parts: list[Any] | None = [None] * self.world.size if self.world.is_main else None
        with _collective(self.world.rank, self.world.size):
            dist.gather_object(payload, parts, dst=0)
        _GATHER_SECONDS[0] += time.perf_counter() - t0
        return parts or []


@contextlib.contextmanager
def alone() -> Iterator[World]:
    """Run the block as a single process (rank 0 going on by itself while the others wait at
    a :class:`Lockstep` point): nothing inside takes part in a collective."""
    global _WORLD
    kept = _WORLD
    _WORLD = World(device=kept.device, devices=(kept.device,))
    try:
        yield _WORLD
    finally:
        _WORLD = kept


def current_world() -> World:
    """The world :func:`init_world` joined (a single process when it was not called)."""
    return _WORLD


def launched() -> bool:
    """Whether this process was started by torchrun (its environment names a rank)."""
    return all(k in os.environ for k in LAUNCH_ENV)


def init_world(device: str = "cpu", backend: str | None = None) -> World:
    """Join the process group torchrun set up and bind this rank's device.

    Args:
        device: the device kind every rank runs on (``cpu``, ``npu``, ``cuda``; an index is
            replaced by the rank's local rank).
        backend: the process group backend (default: ``hccl`` on NPU, ``nccl`` on CUDA, ``gloo``).

    Returns:
        This rank's :class:`World` (also :func:`current_world` from now on); a single process
        when not launched by torchrun.

    Raises:
        ConfigError: an unknown or unavailable backend, or a device index that does not exist.
    """
    global _WORLD
    if not launched():
        return _WORLD
    import torch.distributed as dist

    watch_parent()  # torchrun's agent (already watched when launch_local spawned this rank)
    kind = device.split(":", 1)[0]
    local_rank = int(os.environ["LOCAL_RANK"])
    chosen = backend or {"npu": "hccl", "cuda": "nccl"}.get(kind, "gloo")
    check_backend(chosen)
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    mine = bind_device(kind, local_rank, local_size)
    if not dist.is_initialized():
        dist.init_process_group(backend=chosen, timeout=COLLECTIVE_TIMEOUT)
    size = dist.get_world_size()
    devices = tuple(str(d) for d in _all_gather(mine, size))
    nodes = _count_nodes(size)
    _WORLD = World(dist.get_rank(), size, local_rank, chosen, mine, devices, nodes)
    return _WORLD


def finish_world() -> None:
    """Leave the process group (at the end of a command); a single process: nothing."""
    global _WORLD
    if _WORLD.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _WORLD = World()


def check_backend(backend: str) -> None:
    """Refuse a backend this machine cannot run.

    Raises:
        ConfigError: not one of :data:`BACKENDS`, or not available here.
    """
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "hccl":
        try:
            import torch_npu  # noqa: F401  (registers hccl)
        except ImportError as exc:
            raise ConfigError("backend hccl needs torch_npu (Ascend), which is not here") from exc
        return
    if not dist.is_available() or not dist.is_backend_available(backend):
        raise ConfigError(f"backend {backend} is not available in this torch build")


def device_count(kind: str) -> int:
    """How many ``kind`` devices this host has (``cpu``: unbounded, one per process).

    Raises:
        ConfigError: an unknown kind, or ``npu`` without torch_npu.
    """
    import torch

    if kind == "cpu":
        return 1 << 30
    if kind == "cuda":
        return int(torch.cuda.device_count())
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError as exc:
            raise ConfigError("device npu needs torch_npu (Ascend), which is not here") from exc
        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    raise ConfigError(f"device must be cpu, npu or cuda, got {kind!r}")


def check_devices(kind: str, per_host: int) -> None:
    """Refuse more processes on this host than it has ``kind`` devices (one each).

    Raises:
        ConfigError: too few devices (or an unknown kind).
    """
    count = device_count(kind)
    if per_host > count:
        raise ConfigError(
            f"{per_host} processes on this host need {per_host} {kind} devices, but it has "
            f"{count}: launch at most {count} per host"
        )


def bind_device(kind: str, local_rank: int, local_size: int) -> str:
    """This rank's device: ``{kind}:{local_rank}`` for NPU/CUDA (made current), else ``cpu``.
    Every rank of a host checks the host's device count first, so all fail alike.

    Raises:
        ConfigError: see :func:`check_devices`.
    """
    check_devices(kind, local_size)
    if kind == "cpu":
        return "cpu"
    import torch

    getattr(torch, kind).set_device(local_rank)
    return f"{kind}:{local_rank}"


def check_nproc(nproc: int, samples: int) -> None:
    """Refuse a process count that leaves a rank without work.

    Raises:
        ConfigError: ``nproc`` below 1, or more processes than samples.
    """
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}")
    if nproc > samples:
        raise ConfigError(
            f"--nproc {nproc} is more processes than the {samples} samples to share: "
            f"use at most {samples}"
        )


Entry = Callable[[list[str]], int] | str
"""What a rank runs with its arguments: a function, or one named ``"module:function"`` (a
program's entry point, as its console script names it: imported in the rank)."""


def launch_local(nproc: int, entry: Entry, argv: list[str]) -> int:
    """Run ``entry(argv)`` in ``nproc`` processes on this host under torchrun's elastic agent
    (what ``torchrun --standalone --nproc-per-node N`` does) and return the run's exit code:
    rank 0's, or the first other rank's when rank 0's is 0.

    On CPU each process gets ``cores // nproc`` OpenMP threads unless ``OMP_NUM_THREADS`` is set.

    Raises:
        DistributedError: a process died without returning (a crash or a signal).

    Each rank watches this process (:func:`watch_parent`): killed, even by SIGKILL, it takes its
    ranks with it within seconds instead of leaving them waiting in a collective.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"opsnn-quant-{os.getpid()}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, start_method="spawn",
    )  # fmt: skip
    try:
        # the ranks are this process's own children (spawn): each watches this pid
        codes = elastic_launch(config, _rank_entry)(entry, argv, os.getpid())
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise DistributedError(
            f"rank {rank} of {nproc} died (exit code {failure.exitcode}); rerun with one process "
            "to see its error"
        ) from exc
    ordered = [int(codes[r] or 0) for r in sorted(codes)]
    return ordered[0] or next((c for c in ordered if c), 0)


def _rank_entry(entry: Entry, argv: list[str], launcher: int) -> int:
    """A rank :func:`launch_local` spawned: watch the launcher first, then ``entry(argv)``."""
    _no_death_signal()
    watch_parent(launcher)
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
        assert callable(entry), name
    return entry(argv)


def _no_death_signal() -> None:
    """Drop the SIGINT torch's spawn asks the kernel to send when the launcher dies: the CLI
    turns SIGINT into an exception the main thread raises only between Python steps (never
    while it waits in a collective) and that makes a rank meet its peers again; the watch
    alone ends the rank, the same way wherever it is."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG: none


_WATCHED: list[int] = []  # the parent pid this process watches (one watch per process)


def watch_parent(parent: int | None = None, interval: float = PARENT_POLL_SECONDS) -> None:
    """End this process, with one ``error:`` line, as soon as ``parent`` is no longer its
    parent (it died and this rank was handed to init or a subreaper): a daemon thread checks
    ``os.getppid()`` every ``interval`` seconds. Once per process; later calls do nothing.

    The check runs beside whatever the main thread does (waiting in a collective, generating,
    waiting for its result to be read) and exits by ``os._exit``: no signal handler, no
    ``finally`` that would meet the peers again, nothing left holding the device's memory.

    Args:
        parent: the pid to watch (default: this process's parent now); a ``parent`` that is
            already gone ends the process at once.
        interval: seconds between checks.
    """
    if _WATCHED:
        return
    watched = os.getppid() if parent is None else parent
    _WATCHED.append(watched)
    threading.Thread(
        target=_watch, args=(watched, interval), name="opsnn-quant-parent-watch", daemon=True
    ).start()


def _watch(parent: int, interval: float) -> None:
    while os.getppid() == parent:
        time.sleep(interval)
    rank, size = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
    line = f"error: rank {rank} of {size}: its launcher (pid {parent}) is gone; exiting\n"
    with contextlib.suppress(OSError):  # stderr may be a pipe nobody reads any more
        os.write(2, line.encode())
    os._exit(DistributedError.exit_code)


@contextlib.contextmanager
def _collective(rank: int, size: int) -> Iterator[None]:
    """A collective's backend error (a peer that died closed its connection: gloo fails at
    once) as one :class:`DistributedError` line, not a backend traceback."""
    try:
        yield
    except RuntimeError as exc:  # torch.distributed.DistBackendError included
        text = re.sub(r"\[[^\]]*\.(cc|cpp|h)(:\d+)?\] ", "", _one_line(exc))  # gloo's source line
        raise DistributedError(
            f"rank {rank} of {size}: a collective failed (a peer process is gone?): {text[:300]}"
        ) from exc


# Seconds this process spent in collectives (waiting for peers included): the cost of
# distributing, for reports and benchmarks.
_GATHER_SECONDS = [0.0]


def gather_seconds() -> float:
    """Seconds this process has spent gathering (in collectives) so far."""
    return _GATHER_SECONDS[0]


def _all_gather(obj: Any, size: int) -> list[Any]:
    import torch.distributed as dist

    t0 = time.perf_counter()
    parts: list[Any] = [None] * size
    with _collective(dist.get_rank(), size):
        dist.all_gather_object(parts, obj)
    _GATHER_SECONDS[0] += time.perf_counter() - t0
    return parts


def _count_nodes(size: int) -> int:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    return max(1, size // max(local, 1))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def gather_in_order(
    world: World,
    items: Sequence[_T],
    batch: int,
    run: Callable[[Sequence[_T], int], list[Any]],
) -> list[Any]:
    """``run(items[shard], first_index)`` on this rank's shard of ``items`` (whole batches of
    ``batch``), every rank's results concatenated in item order.

    An idle rank (fewer batches than ranks: a batch is never split) does not call ``run``: it
    takes part in the gather with an empty share. Only when there are no items at all does
    every rank call ``run`` on none (the same error, if any, on every rank)."""
    part = world.shard(len(items), batch)
    batches = -(-len(items) // max(batch, 1))
    if world.is_main and 0 < batches < world.size:
        log.warning(
            "%d of %d processes have no work: %d items in batches of %d make %d batch(es), and "
            "a batch is never split (a smaller batch size shares more)",
            world.size - batches, world.size, len(items), batch, batches,
        )  # fmt: skip

    def share() -> list[Any]:
        if not part and len(items):  # idle: an empty share is not an error
            return []
        return run(items[part.start : part.stop], part.start)

    return world.gather(share)
