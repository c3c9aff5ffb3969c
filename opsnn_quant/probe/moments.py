"""GPTQ's input moments when they do not all fit in memory at once: collected group by group.

Every Linear/Conv2d with a GPTQ or bias-corrected candidate keeps the K x K second moments of its
inputs, in two halves of its rows (:class:`~opsnn_quant.quant.gptq.SplitMoments`): 24 bytes per
K^2 while a data batch is open (a float64 sum and a float32 batch accumulator per half), 16
after. At a model's real widths that is far more than its weights (FLUX.1-dev: 226 MB per
3072-wide Linear, about 400 of them), so:

* When all of them take at most :func:`moments_memory` bytes, pass 1 collects them and they
  stay in memory, as they always did.
* Above it, the modules are cut, in the model's order, into groups of at most that many bytes.
  Pass 1 collects the first group's; each later group's takes one more pass over the forward
  loop with the moments hook alone (no other statistic is collected twice); and each group's
  moments are spilled to a temporary directory (:class:`~opsnn_quant.quant.gptq.MomentStore`)
  as soon as its pass ends. They are read back one module at a time, when a GPTQ candidate is
  fitted or ``quantize()`` fits the deployed module, and dropped again.

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
from typing import Any

from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.memory import trim_heap
from opsnn_quant.probe.hooks import in_rerun
from opsnn_quant.probe.local import LocalProbe
from opsnn_quant.probe.passes import HookSet, _run
from opsnn_quant.quant.gptq import MomentStore
from opsnn_quant.tensors import first_tensor
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


def moment_bytes(lp: LocalProbe) -> int:
    """What one module's moments take while a batch is open (0: it keeps none)."""
    if lp.moments is None:
        return 0
    k = lp.moments.channels
    return BYTES_PER_K2 * k * k


def plan_groups(
    local: Mapping[str, LocalProbe], cap: int | None = None, weight_bytes: int = 0
) -> list[list[str]]:
    """The modules that keep moments, in groups collected together (model order, each of at
    most ``cap`` bytes, or one module alone when that is more): one group when all fit.
    Every module outside the first group stops collecting its moments in pass 1.

    Args:
        local: the probe's modules, in model order.
        cap: bytes per group; None: :func:`moments_memory` of these moments and
            ``weight_bytes`` (the model's weights).
    """
    if cap is None:
        cap = moments_memory(sum(moment_bytes(lp) for lp in local.values()), weight_bytes)
    groups: list[list[str]] = [[]]
    used = 0
    for name, lp in local.items():
        size = moment_bytes(lp)
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
    return groups if groups[0] else []


def collect_groups(
    local: Mapping[str, LocalProbe],
    model: nn.Module,
    forward_loop: ForwardLoop,
    groups: list[list[str]],
) -> float:
    """After pass 1 (which collected ``groups[0]``): spill the first group's moments, then one
    pass over ``forward_loop`` per later group, its moments spilled when the pass ends. Nothing
    to do for one group (the moments stay in memory). Returns the passes' seconds."""
    if len(groups) < 2:
        return 0.0
    store = MomentStore()
    seconds = 0.0
    for index, group in enumerate(groups):
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
        trim_heap()  # the group's sums are freed: their pages back before the next group's
    return seconds


def _moments_hook(lp: LocalProbe, module: nn.Module, args: tuple, out: Any) -> None:
    if in_rerun():
        return
    x, y = first_tensor(args), first_tensor(out)
    if x is None or y is None:
        return
    lp.collect_moments_only(x)
