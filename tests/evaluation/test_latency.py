"""measure()/Timer with a fake clock (exact percentiles) and real CPU memory measurement."""

from __future__ import annotations

import numpy as np
import pytest

from opsnn_quant.errors import BackendError, InputError
from opsnn_quant.evaluation.latency import (
    CPU_REFERENCE_NOTE,
    Timer,
    cpu_peak_memory,
    default_backend,
    measure,
    summarize_ms,
)


class FakeClock:
    """Advances only when the work says so: each call of ``work`` takes the next duration."""

    def __init__(self, durations_s: list[float]) -> None:
        self.now = 0.0
        self.durations = list(durations_s)
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def test_percentiles_and_throughput_hand_computed():
    # 2 warmup calls (10 s each, not counted), then runs of 1..10 ms.
    clock = FakeClock([10.0, 10.0] + [i / 1000 for i in range(1, 11)])
    r = measure(clock.work, warmup=2, runs=10, items_per_call=4, memory=False, clock=clock)
    assert r.samples_ms == pytest.approx([float(i) for i in range(1, 11)])
    # numpy linear interpolation on 1..10: p50 = 5.5, p90 = 9.1, p99 = 9.91.
    assert (r.p50_ms, r.p90_ms, r.p99_ms) == pytest.approx((5.5, 9.1, 9.91))
    assert (r.mean_ms, r.min_ms, r.max_ms) == pytest.approx((5.5, 1.0, 10.0))
    assert r.throughput_per_s == pytest.approx(4 / 0.0055)
    assert r.backend == "cpu-reference" and r.note == CPU_REFERENCE_NOTE
    assert r.peak_memory_bytes is None and clock.calls == 12


def test_timed_context_wraps_only_the_timed_calls():
    clock = FakeClock([0.001])
    seen = []

    class Ctx:
        def __enter__(self):
            seen.append(("enter", clock.calls))

        def __exit__(self, *exc):
            seen.append(("exit", clock.calls))

    measure(clock.work, warmup=2, runs=3, memory=True, clock=clock, timed=Ctx())
    # Entered after the 2 warmup calls, left after the 3 timed ones, before the memory call.
    assert seen == [("enter", 2), ("exit", 5)] and clock.calls == 6


def test_backend_labels():
    assert default_backend("cpu") == "cpu-reference"
    assert default_backend("cuda:1") == "cuda"
    assert default_backend("npu:0") == "npu"
    with pytest.raises(InputError):
        default_backend("tpu")
    r = measure(lambda: None, warmup=0, runs=1, memory=False, backend="cpu-onnxruntime")
    assert r.backend == "cpu-onnxruntime" and r.note == ""


def test_unavailable_device_and_bad_counts():
    with pytest.raises(BackendError, match="npu"):
        measure(lambda: None, device="npu")
    with pytest.raises(InputError, match="runs"):
        measure(lambda: None, runs=0)


def test_cpu_peak_memory_sees_a_transient_allocation():
    size = 64 * 1024 * 1024

    def work() -> None:
        buf = np.ones(size // 8)  # 64 MiB, touched, freed on return
        buf.sum()

    peak, py_peak, method = cpu_peak_memory(work)
    assert peak >= 0.8 * size, (peak, method)
    assert method.startswith("cpu: peak RSS")
    # numpy reports its buffers to tracemalloc, so the Python peak sees it too.
    assert py_peak >= 0.8 * size
    r = measure(work, warmup=0, runs=2)
    assert r.peak_memory_bytes is not None and r.peak_memory_bytes >= 0.8 * size


def test_timer_blocks():
    clock = FakeClock([0.002, 0.004, 0.010])
    timer = Timer(clock=clock)
    for _ in range(2):
        with timer("denoise_step"):
            clock.work()
    with timer("vae_decode"):
        clock.work()
    s = timer.summary()
    assert s["denoise_step"]["calls"] == 2 and s["denoise_step"]["total_ms"] == pytest.approx(6.0)
    assert s["vae_decode"]["p50_ms"] == pytest.approx(10.0)


def test_summarize_empty():
    with pytest.raises(InputError):
        summarize_ms([])


class FakeAccelerator:
    """Stands in for torch.cuda / torch.npu: counts synchronisations, fixed allocator stats."""

    def __init__(self) -> None:
        self.syncs = 0
        self.resets = 0

    def synchronize(self) -> None:
        self.syncs += 1

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1

    def memory_allocated(self) -> int:
        return 100

    def max_memory_allocated(self) -> int:
        return 600


def test_accelerator_path_synchronises_and_reads_allocator(monkeypatch):
    import opsnn_quant.evaluation.latency as lat

    acc = FakeAccelerator()
    monkeypatch.setattr(lat, "accelerator_module", lambda device: acc)
    r = measure(lambda: None, warmup=1, runs=3, device="npu:0")
    # One sync after warmup, then one before and one after each timed call.
    assert acc.syncs == 1 + 2 * 3 and acc.resets == 1
    assert r.backend == "npu" and r.note == ""
    assert r.peak_memory_bytes == 500 and r.memory_method.startswith("npu: max_memory_allocated")
    assert r.python_peak_bytes is None
