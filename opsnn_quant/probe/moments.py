"""GPTQ's input moments when they do not all fit in memory at once: streamed to files, collected
group by group.

Every Linear/Conv2d with a GPTQ or bias-corrected candidate keeps the K x K second moments of its
inputs, in two halves of its rows (:class:`~opsnn_quant.quant.gptq.SplitMoments`): 24 bytes per
K^2 in memory while a data batch is open (a float64 sum and a float32 batch accumulator per
half), 16 after. At a model's real widths that is far more than its weights (FLUX.1-dev: 226 MB
per 3072-wide Linear, about 400 of them), so:

* When all of them take at most :func:`moments_memory` bytes, pass 1 collects them and they
  stay in memory, as they always did.
* Above it, every module's moments stream to a temporary directory
  (:class:`~opsnn_quant.quant.gptq.MomentStore`) from their first rows: only the open batch's
  float32 sums stay in memory (8 bytes per K^2), each closed batch is added into the float64
  sums in the files. The modules are cut, in the model's order, into groups of at most that many
  streamed bytes: pass 1 collects the first group's; each later group's takes one more pass over
  the forward loop with the moments hook alone (no other statistic is collected twice). They
  are read back one module at a time, when a GPTQ candidate is fitted or ``quantize()`` fits
  the deployed module, and dropped again.

The forward loop is deterministic (pass 1 and :func:`~opsnn_quant.probe.api.recollect` rely on
it already) and a module's moments see the same rows in the same batches in either pass, so the
sums, and every integer GPTQ picks from them, are bit for bit those of one pass. Not for a
sharded pass 1 (each process's share is merged in memory): that keeps every module's moments.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

from torch import nn

from opsnn_quant.core.memory import trim_heap
from opsnn_quant.core.tensors import first_tensor
from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.hooks import in_rerun
from opsnn_quant.probe.local import LocalProbe
from opsnn_quant.probe.passes import HookSet, _run
from opsnn_quant.quant.gptq import MomentStore
from opsnn_quant.types import ForwardLoop

MOMENTS_MEMORY_ENV = "OPSNN_QUANT_MOMENTS_MEMORY"
# The cap, unless the environment sets one (see moments_memory): half the model's weights, so
# the moments stay a term of the size of what a float inference holds anyway (peak RSS <= 1.5x
# a float inference is the goal), within these bounds; but no smaller than a share of all the
# moments that makes at most MAX_EXTRA_PASSES more passes, up to the ceiling (a 3x3 conv's K is
# 9x its input channels: a small UNet's moments are 40x its weights, 494 MB for 13 MB).
DEFAULT_MOMENTS_MEMORY = 512 * 2**20  # the ceiling: at a model's real widths, more passes
MIN_MOMENTS_MEMORY = 64 * 2**20
MAX_EXTRA_PASSES = 4
# bytes per K^2 of one module's moments while a batch is open: two halves, float64 + float32
BYTES_PER_K2 = 2 * (8 + 4)
# ... streamed to files: the two halves' float32 batch sums (the float64 ones in the files)
STREAMED_BYTES_PER_K2 = 2 * 4


def moments_memory(total: int | None = None, weight_bytes: int = 0) -> int:
    """The bytes the moments being collected may take at once: ``OPSNN_QUANT_MOMENTS_MEMORY``
    (bytes) when set; else, for moments of ``total`` bytes in all and a model of
    ``weight_bytes``, half the weights within [:data:`MIN_MOMENTS_MEMORY`,
    :data:`DEFAULT_MOMENTS_MEMORY`], raised to ``total / (1 + MAX_EXTRA_PASSES)`` (at most
    that many more passes) but never above the ceiling; ``total`` None: the ceiling.

    Measured (``bench_calibrate_scale.py --rows shapes-t2i --gemm native``, a quiet 2-core
    Intel Xeon with AMX): the 512 MiB ceiling alone, 34.3 s, peak RSS 1.99x a float inference;
    this rule (a fifth of the moments, four more passes), 34.3 s, 1.36x.

    Raises:
        ConfigError: the variable is not a positive integer.
    """
    raw = os.environ.get(MOMENTS_MEMORY_ENV)
    if raw is None or raw == "":
        if total is None:
            return DEFAULT_MOMENTS_MEMORY
        share = -(-total // (1 + MAX_EXTRA_PASSES))
        own = min(max(weight_bytes // 2, MIN_MOMENTS_MEMORY), DEFAULT_MOMENTS_MEMORY)
        return min(max(own, share), DEFAULT_MOMENTS_MEMORY)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{MOMENTS_MEMORY_ENV}={raw!r}: give a positive number of bytes")
    return value


def moment_bytes(lp: LocalProbe, streamed: bool = False) -> int:
    """What one module's moments take in memory while a batch is open (0: it keeps none)."""
    if lp.moments is None:
        return 0
    k = lp.moments.channels
    return (STREAMED_BYTES_PER_K2 if streamed else BYTES_PER_K2) * k * k


class MomentPlan(NamedTuple):
    """How the moments are collected: ``groups`` of modules (model order), the first by pass
    1, each later one by a pass of its own; ``streamed``: into files from their first rows."""

    groups: list[list[str]]
    streamed: bool


def plan_groups(
    local: Mapping[str, LocalProbe], cap: int | None = None, weight_bytes: int = 0
) -> MomentPlan:
    """The modules that keep moments: all in memory in one group when they take at most
    ``cap`` bytes there; else streamed, in groups of at most ``cap`` streamed bytes (one module
    alone when that is more). Every module outside the first group stops collecting its
    moments in pass 1.

    Args:
        local: the probe's modules, in model order.
        cap: bytes; None: :func:`moments_memory` of these moments (in memory) and
            ``weight_bytes`` (the model's weights).
    """
    in_memory = sum(moment_bytes(lp) for lp in local.values())
    if cap is None:
        cap = moments_memory(in_memory, weight_bytes)
    streamed = in_memory > cap
    groups: list[list[str]] = [[]]
    used = 0
    for name, lp in local.items():
        size = moment_bytes(lp, streamed)
        if not size:
            continue
        if groups[-1] and used + size > cap:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size
    for group in groups[1:]:
        for name in group:
            local[name].collect_moments = False
    return MomentPlan(groups if groups[0] else [], streamed and bool(groups[0]))


def start_streaming(local: Mapping[str, LocalProbe], plan: MomentPlan) -> MomentStore | None:
    """Before pass 1: a streamed plan's moments into the files of a new store (returned)."""
    if not plan.streamed:
        return None
    store = MomentStore()
    for group in plan.groups:
        for name in group:
            moments = local[name].moments
            assert moments is not None
            moments.stream_to(store)
    return store


def collect_groups(
    local: Mapping[str, LocalProbe],
    model: nn.Module,
    forward_loop: ForwardLoop,
    plan: MomentPlan,
    store: MomentStore,
) -> float:
    """After pass 1 (which collected ``plan.groups[0]``): close the first group's files, then
    one pass over ``forward_loop`` per later group, its files closed when the pass ends.
    Returns the passes' seconds."""
    seconds = 0.0
    for index, group in enumerate(plan.groups):
        members = [local[n] for n in group]
        if index:
            hooks = HookSet()
            for lp in members:
                lp.collect_moments = True
                hooks.add(lp.module.register_forward_hook(partial(_moments_hook, lp)))
            t0 = time.perf_counter()
            _run(forward_loop, model, hooks)
            seconds += time.perf_counter() - t0
        for lp in members:
            assert lp.moments is not None
            lp.moments.spill(store)
        trim_heap()  # the group's batch sums are freed: their pages back before the next group's
    return seconds


def _moments_hook(lp: LocalProbe, module: nn.Module, args: tuple, out: Any) -> None:
    if in_rerun():
        return
    x, y = first_tensor(args), first_tensor(out)
    if x is None or y is None:
        return
    lp.collect_moments_only(x)
