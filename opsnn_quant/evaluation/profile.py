"""Where the time goes: named pipeline stages, top modules by profiler time, stability runs.

* :class:`StageTimer` times named stages (``text_encoder``, ``denoise_step``, ``vae_decode``;
  ``audio_encoder``, ``decoder_step``) by forward pre/post hooks on the modules that run them,
  so a pipeline is timed as it is, without editing its code. Each call is one sample: a UNet
  called once per step gives one ``denoise_step`` sample per step.
* :func:`top_modules` wraps every module's forward in a ``record_function`` range and reads
  ``torch.profiler``'s CPU totals per range (``with_modules`` only names TorchScript frames).
* :func:`stability_run` makes K consecutive calls and reports latency drift and memory growth
  (leaks, caches that never stop growing, thermal or allocator slow-downs).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.latency import (
    CPU_RSS_METHOD,
    Clock,
    accelerator_module,
    default_backend,
    rss_bytes,
    summarize_ms,
)

_RANGE_PREFIX = "module::"


class StageRow(BaseModel):
    """Timing of one named stage over all its calls (milliseconds)."""

    model_config = ConfigDict(frozen=True)

    stage: str
    module: str
    calls: int
    total_ms: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    max_ms: float
    first_ms: float


class StageTimer:
    """Times forward calls of given modules under stage names while the block runs.

    Example::

        stages = {"text_encoder": pipe.text_encoder, "denoise_step": pipe.unet,
                  "vae_decode": pipe.vae.decoder}
        with StageTimer(stages) as st:
            pipe(prompt, num_inference_steps=20)
        rows = st.rows()

    Pass the module whose ``forward`` the stage calls (diffusers' ``vae.decode`` runs
    ``vae.decoder``). Nested calls of the same module are timed once, at the outermost call.

    Args:
        stages: Stage name -> module.
        device: Synchronised around each call on npu/cuda.
        clock: Seconds counter; injectable for tests.
    """

    def __init__(
        self,
        stages: Mapping[str, nn.Module],
        device: str = "cpu",
        clock: Clock = time.perf_counter,
    ) -> None:
        if not stages:
            raise InputError("StageTimer needs at least one stage")
        self.stages = dict(stages)
        self.clock = clock
        self.samples: dict[str, list[float]] = {name: [] for name in stages}
        self._acc = accelerator_module(device)
        self._depth: dict[str, int] = dict.fromkeys(stages, 0)
        self._t0: dict[str, float] = {}
        self._handles: list[Any] = []

    def _sync(self) -> None:
        if self._acc is not None:
            self._acc.synchronize()

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self._depth[name] += 1
            if self._depth[name] == 1:
                self._sync()
                self._t0[name] = self.clock()

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._depth[name] -= 1
            if self._depth[name] == 0:
                self._sync()
                self.samples[name].append((self.clock() - self._t0[name]) * 1e3)

        return hook

    def __enter__(self) -> StageTimer:
        for name, module in self.stages.items():
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post(name), always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def rows(self) -> list[StageRow]:
        """One row per stage that ran, in the order the stages were given."""
        out = []
        for name, s in self.samples.items():
            if not s:
                continue
            st = summarize_ms(s)
            out.append(
                StageRow(
                    stage=name,
                    module=type(self.stages[name]).__name__,
                    calls=len(s),
                    total_ms=float(sum(s)),
                    mean_ms=st["mean_ms"],
                    p50_ms=st["p50_ms"],
                    p90_ms=st["p90_ms"],
                    max_ms=st["max_ms"],
                    first_ms=s[0],
                )
            )
        return out


class ModuleTimeRow(BaseModel):
    """Profiler CPU time of one module (milliseconds; inclusive of its children and ops)."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: str
    calls: int
    total_ms: float
    share: float  # of the profiled call's wall time


@contextmanager
def _module_ranges(model: nn.Module, names: set[str]) -> Iterator[None]:
    import torch

    stacks: dict[str, list[Any]] = {}
    handles = []

    def pre(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            rf = torch.profiler.record_function(_RANGE_PREFIX + name)
            rf.__enter__()
            stacks.setdefault(name, []).append(rf)

        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if stacks.get(name):
                stacks[name].pop().__exit__(None, None, None)

        return hook

    for name, module in model.named_modules():
        if name in names:
            handles.append(module.register_forward_pre_hook(pre(name)))
            handles.append(module.register_forward_hook(post(name), always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# What torch's profiler (Kineto) writes to the process's stderr on every start and stop
# ("USDT:... profiler_start", "STAGE:... Completed Stage: Warm Up"), whatever KINETO_LOG_LEVEL.
_CHATTER = re.compile(rb"^(USDT|STAGE):\S+ \S+ \S+ \S+\.cpp:\d+\] ")


@contextmanager
def _without_profiler_chatter() -> Iterator[None]:
    """Keep the profiler's own lines out of the command's output: the process's stderr (file
    descriptor 2, where the C++ library writes) goes to a temporary file while the block runs,
    and everything else written there is passed on when it ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not _CHATTER.match(line)]  # fmt: skip
            if kept:
                os.write(2, b"".join(kept))


def top_modules(
    model: nn.Module,
    fn: Callable[[], Any],
    top: int = 10,
    leaf_only: bool = True,
    warmup: int = 1,
) -> list[ModuleTimeRow]:
    """The ``top`` modules of ``model`` by CPU time while ``fn()`` runs, under torch.profiler.

    Args:
        model: The module tree to attribute time to (``fn`` must call into it).
        fn: The work (one representative call; profiled once after ``warmup`` calls).
        top: Rows to return.
        leaf_only: Only modules without children (Linear, Conv2d, norms...), so times do not
            double-count parents; ``False`` ranks every module, blocks included.
        warmup: Unprofiled calls first, so one-time initialisation (kernel selection, lazy
            buffers) is not charged to whichever module happens to run first.

    On npu/cuda the CPU times are launch times; use the vendor profiler for kernel time.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    types = {}
    for name, module in model.named_modules():
        # A quantized Linear/Conv2d counts as a leaf: its children are parameter holders
        # (input_quantizer/weight_quantizer) that do no work of their own.
        leaf = not any(True for _ in module.children()) or hasattr(module, "input_quantizer")
        if name and (not leaf_only or leaf):
            types[name] = type(module).__name__
    with torch.no_grad():
        for _ in range(warmup):
            fn()
    t0 = time.perf_counter()
    with (
        _without_profiler_chatter(),
        torch.no_grad(),
        _module_ranges(model, set(types)),
        profile(activities=[ProfilerActivity.CPU]) as prof,
    ):
        fn()
    wall_ms = (time.perf_counter() - t0) * 1e3
    rows = []
    for ev in prof.key_averages():
        if not ev.key.startswith(_RANGE_PREFIX):
            continue
        name = ev.key[len(_RANGE_PREFIX) :]
        total = ev.cpu_time_total / 1e3
        rows.append(
            ModuleTimeRow(
                name=name,
                type=types.get(name, "?"),
                calls=int(ev.count),
                total_ms=float(total),
                share=float(total / wall_ms) if wall_ms > 0 else 0.0,
            )
        )
    rows.sort(key=lambda r: (-r.total_ms, r.name))
    return rows[:top]


class StabilityResult(BaseModel):
    """K consecutive calls: latency drift and memory growth.

    Attributes:
        drift_ratio: Median of the last decile of calls / median of the first decile
            (> 1: it slows down over time).
        memory_growth_bytes: Memory after the last call minus after the first (allocated
            tensors on npu/cuda; on cpu, RSS after returning free heap pages to the OS with
            glibc's ``malloc_trim``, so reused free memory does not hide growth); steady
            growth means something accumulates.
    """

    model_config = ConfigDict(frozen=True)

    backend: str
    k: int
    first_decile_median_ms: float
    last_decile_median_ms: float
    drift_ratio: float
    memory_start_bytes: int
    memory_end_bytes: int
    memory_growth_bytes: int
    memory_growth_per_call_bytes: float
    memory_method: str
    samples_ms: list[float] = Field(default_factory=list)


def stability_run(
    fn: Callable[[], Any],
    k: int,
    *,
    device: str = "cpu",
    backend: str | None = None,
    clock: Clock = time.perf_counter,
) -> StabilityResult:
    """Call ``fn`` ``k`` times in a row; compare the last decile with the first.

    Memory is read after the first call (lazy initialisation is not growth) and after the last.

    Raises:
        InputError: ``k < 2``.
    """
    if k < 2:
        raise InputError(f"a stability run needs k >= 2 calls, got {k}")
    acc = accelerator_module(device)

    def memory() -> int:
        if acc is not None:
            acc.synchronize()
            return int(acc.memory_allocated())
        return rss_bytes(trim=True)

    samples = []
    start = 0
    for i in range(k):
        t0 = clock()
        fn()
        if acc is not None:
            acc.synchronize()
        samples.append((clock() - t0) * 1e3)
        if i == 0:
            start = memory()
    end = memory()
    n = max(1, k // 10)
    first = float(np.median(samples[:n]))
    last = float(np.median(samples[-n:]))
    summarize_ms(samples)  # validates
    return StabilityResult(
        backend=backend or default_backend(device),
        k=k,
        first_decile_median_ms=first,
        last_decile_median_ms=last,
        drift_ratio=last / first if first > 0 else float("nan"),
        memory_start_bytes=start,
        memory_end_bytes=end,
        memory_growth_bytes=end - start,
        memory_growth_per_call_bytes=(end - start) / (k - 1),
        memory_method="allocated tensors" if acc is not None else CPU_RSS_METHOD,
        samples_ms=samples,
    )
