"""Latency and peak memory of a callable, with device synchronisation and labelled backends.

Timing: ``warmup`` untimed calls, then ``runs`` timed calls with ``time.perf_counter`` around
each, synchronising the device before and after on npu/cuda (kernels run asynchronously, so
an unsynchronised timer measures the launch, not the work).

Memory, by device:

* npu / cuda: the allocator's ``max_memory_allocated`` after ``reset_peak_memory_stats``, over
  the timed runs (no overhead, exact for tensors).
* cpu: one extra, untimed call after the timed runs (tracing slows Python down, so it must
  not overlap the timing). Peak RSS above the pre-call RSS, read after glibc's
  ``malloc_trim`` hands free heap pages back (else reused free memory hides the peak): exact
  from the kernel's ``VmHWM``
  when ``/proc/self/clear_refs`` can reset it, otherwise sampled every millisecond by a
  thread (may miss a short spike). Plus tracemalloc's peak of Python-level allocations,
  which does not see tensor storage (C++ allocator): it is reported apart.

CPU timing of a quantized eager model runs the exact Ascend integer arithmetic in emulation:
it is the correctness reference, not a speed figure. Results carry that note.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from opsnn_quant.core.memory import malloc_trim
from opsnn_quant.errors import BackendError, InputError

logger = logging.getLogger(__name__)

CPU_REFERENCE_NOTE = (
    "CPU timing of the quantized eager model runs the exact Ascend int8 arithmetic in "
    "emulation: a correctness reference, not a speed figure. Judge speed on npu."
)
ORT_NOTE = (
    "ONNX Runtime on CPU with the same measurement code: a relative fp32-vs-QDQ figure on this "
    "machine, not an Ascend number."
)
_BACKENDS = {"cpu": "cpu-reference", "cuda": "cuda", "npu": "npu"}

Clock = Callable[[], float]


class LatencyResult(BaseModel):
    """What :func:`measure` measured. Times in milliseconds, memory in bytes.

    Attributes:
        backend: ``cpu-reference``, ``cpu-onnxruntime``, ``cuda`` or ``npu``.
        device: The torch device type the calls ran on.
        throughput_per_s: ``items_per_call / mean`` (e.g. images or utterances per second).
        peak_memory_bytes: Peak above the starting point (see ``memory_method``); None if not
            measured.
        python_peak_bytes: tracemalloc's peak of Python allocations during the memory call (cpu).
        memory_method: How ``peak_memory_bytes`` was obtained.
        samples_ms: Every timed call, in order (for distribution plots).
    """

    model_config = ConfigDict(frozen=True)

    backend: str
    device: str
    warmup: int
    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    items_per_call: int = 1
    throughput_per_s: float
    peak_memory_bytes: int | None = None
    python_peak_bytes: int | None = None
    memory_method: str = ""
    note: str = ""
    samples_ms: list[float] = Field(default_factory=list)


def default_backend(device: str) -> str:
    """Backend label of a torch device type (``cpu`` -> ``cpu-reference``)."""
    kind = device.split(":")[0]
    if kind not in _BACKENDS:
        raise InputError(f"unknown device {device!r}; use cpu, cuda or npu")
    return _BACKENDS[kind]


def accelerator_module(device: str) -> Any | None:
    """``torch.cuda`` or ``torch.npu`` (torch_npu imported lazily), None for cpu."""
    kind = device.split(":")[0]
    if kind == "cpu":
        return None
    import torch

    if kind == "npu":
        try:
            importlib.import_module("torch_npu")
        except ImportError as err:
            raise BackendError("device 'npu' needs torch_npu (Ascend CANN toolkit)") from err
    module = getattr(torch, kind, None)
    if module is None or not module.is_available():
        raise BackendError(f"device {device!r} is not available")
    return module


def synchronize(device: str) -> None:
    """Wait for queued kernels on ``device`` (no-op on cpu)."""
    acc = accelerator_module(device)
    if acc is not None:
        acc.synchronize()


CPU_RSS_METHOD = "cpu: RSS after malloc_trim"


def rss_bytes(trim: bool = False) -> int:
    """Resident set size of this process, from ``/proc/self/statm`` (no psutil).

    Args:
        trim: First return free heap pages to the OS (glibc ``malloc_trim(0)``), so the figure
            approaches memory in use: without it, memory freed earlier stays resident and a
            later allocation reusing it shows no growth.
    """
    if trim and (fn := malloc_trim()) is not None:
        fn(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _page_size()


def _page_size() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0); False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class RssSampler:
    """Samples RSS in a background thread; ``peak`` is the largest value seen."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def cpu_peak_memory(fn: Callable[[], Any]) -> tuple[int, int, str]:
    """Run ``fn`` once; return (peak RSS above start, Python peak, method description)."""
    start = rss_bytes(trim=True)
    exact = _reset_hwm()
    tracemalloc.start()
    try:
        with RssSampler() as sampler:
            fn()
        _, py_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    hwm = _hwm_bytes() if exact else None
    if hwm is not None:
        return max(hwm - start, 0), py_peak, "cpu: peak RSS above trimmed start (VmHWM reset)"
    return max(sampler.peak - start, 0), py_peak, "cpu: peak RSS above trimmed start (1 ms samples)"


def summarize_ms(samples_ms: list[float]) -> dict[str, float]:
    """p50/p90/p99 (numpy linear interpolation), mean, std, min and max of samples."""
    if not samples_ms:
        raise InputError("no latency samples")
    a = np.asarray(samples_ms, dtype=np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
        "mean_ms": float(a.mean()),
        "std_ms": float(a.std()),
        "min_ms": float(a.min()),
        "max_ms": float(a.max()),
    }


def measure(
    fn: Callable[[], Any],
    *,
    warmup: int = 2,
    runs: int = 10,
    device: str = "cpu",
    backend: str | None = None,
    items_per_call: int = 1,
    memory: bool = True,
    note: str | None = None,
    clock: Clock = time.perf_counter,
    timed: contextlib.AbstractContextManager[Any] | None = None,
) -> LatencyResult:
    """Time ``fn()`` and measure its peak memory.

    Args:
        fn: The work, with inputs bound (e.g. ``lambda: pipe(prompt, num_inference_steps=20)``).
        warmup: Untimed calls first (allocator, kernel caches, lazy init).
        runs: Timed calls.
        device: ``cpu``, ``cuda[:i]`` or ``npu[:i]``: what to synchronise and whose memory.
        backend: Label for the report; default from ``device`` (``cpu`` -> ``cpu-reference``).
        items_per_call: Images/utterances per call, for throughput.
        memory: Measure peak memory (one extra untimed call on cpu).
        note: Overrides the default note (the CPU-reference caveat on cpu).
        clock: Seconds counter; injectable for tests.
        timed: Entered around the timed calls only, not the warmup or memory calls: e.g. a
            :class:`~.profile.StageTimer`, so the stage times come from the same calls instead
            of extra ones (its hooks cost microseconds per stage call).

    Raises:
        InputError: ``runs < 1`` or ``warmup < 0``.
        BackendError: The device is not available.
    """
    if runs < 1 or warmup < 0:
        raise InputError(f"need runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    acc = accelerator_module(device)
    label = backend or default_backend(device)

    def sync() -> None:
        if acc is not None:
            acc.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    if acc is not None and memory:
        acc.reset_peak_memory_stats()
        base = acc.memory_allocated()
    samples = []
    with timed if timed is not None else contextlib.nullcontext():
        for _ in range(runs):
            sync()
            t0 = clock()
            fn()
            sync()
            samples.append((clock() - t0) * 1e3)
    peak: int | None = None
    py_peak: int | None = None
    method = ""
    if memory and acc is not None:
        peak = int(acc.max_memory_allocated() - base)
        method = f"{device.split(':')[0]}: max_memory_allocated above start (allocator)"
    elif memory:
        peak, py_peak, method = cpu_peak_memory(fn)
    stats = summarize_ms(samples)
    if note is None:
        note = CPU_REFERENCE_NOTE if label == "cpu-reference" else ""
    return LatencyResult(
        backend=label,
        device=device,
        warmup=warmup,
        runs=runs,
        items_per_call=items_per_call,
        throughput_per_s=items_per_call * 1e3 / stats["mean_ms"] if stats["mean_ms"] > 0 else 0.0,
        peak_memory_bytes=peak,
        python_peak_bytes=py_peak,
        memory_method=method,
        note=note,
        samples_ms=samples,
        **stats,
    )


class Timer:
    """Accumulates wall times of named blocks: ``with timer("vae_decode"): ...``.

    Synchronises ``device`` around each block, so asynchronous kernels are counted where
    they ran.
    """

    def __init__(self, device: str = "cpu", clock: Clock = time.perf_counter) -> None:
        self.device = device
        self.clock = clock
        self.samples: dict[str, list[float]] = {}
        self._acc = accelerator_module(device)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Time the block under ``name`` (milliseconds)."""
        if self._acc is not None:
            self._acc.synchronize()
        t0 = self.clock()
        try:
            yield
        finally:
            if self._acc is not None:
                self._acc.synchronize()
            self.samples.setdefault(name, []).append((self.clock() - t0) * 1e3)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per name: calls, total and the :func:`summarize_ms` figures."""
        return {
            name: {"calls": float(len(s)), "total_ms": float(sum(s)), **summarize_ms(s)}
            for name, s in self.samples.items()
        }
