"""Reproducible maths: the same inputs and seed give byte-identical policies and checkpoints.

Call :func:`set_reproducible` first thing, before ``import torch`` (the CLI does, and so should a
script using the Python API): MKL reads its reproducibility switch once, when it loads.
"""

from __future__ import annotations

import logging
import os
import random
import sys

log = logging.getLogger(__name__)

ENV = {
    # MKL may pick different kernels run to run (buffer alignment) and by a product's row count
    # (a decoder step of 1 row rounds otherwise than the same row among 8, so a transcript would
    # depend on the batch it was decoded in); strict conditional numerical reproducibility
    # makes the same inputs give the same bits, whatever the rows beside them and the threads
    # (oneMKL developer guide, "Reproducibility Conditions": ?gemm in strict mode; on a CPU
    # where it holds only from a few rows on, batches are padded to them: gemm_rows_floor).
    # MKL reads it at its first call, not when torch loads: it must be set before the first
    # matmul.
    "MKL_CBWR": "AUTO,STRICT",
    # Not OMP_WAIT_POLICY=PASSIVE (set here until 2026-12-07): idle OpenMP threads that sleep
    # at once pay a wake-up at every parallel region, and a probe's many small ops made the
    # whole calibrate of shapes-t2v 1.4x slower. Where several processes share few cores (the
    # test suite's workers) their launcher sets it: tests/conftest.py.
}


_warned = False  # set_reproducible() said the process's GEMM rows are not invariant


def set_reproducible(seed: int | None = None, threads: int | None = None) -> None:
    """Set up the process for reproducible results.

    Sets :data:`ENV` (values already in the environment win), then, if given, seeds Python,
    NumPy and torch and fixes torch's intra-op thread count (the summation order of CPU kernels
    can follow the thread count).

    Args:
        seed: seed of ``random``, ``numpy`` and ``torch``; None leaves them as they are.
        threads: torch intra-op threads; None leaves torch's default.
    """
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    global _warned
    if "torch" in sys.modules and not _warned and not gemm_rows_invariant():
        _warned = True  # once a process: the pipeline sets up again at each phase
        log.warning(
            "float GEMMs in this process round by their row count: MKL's strict reproducibility "
            "is not in effect (MKL_CBWR=%s; it must be AUTO,STRICT before the process's first "
            "matmul: call set_reproducible() first, or set it in the environment); outputs may "
            "change with how inputs are batched",
            os.environ.get("MKL_CBWR"),
        )
    if threads is not None or seed is not None:
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        if seed is not None:
            import numpy as np

            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)


# Row counts the probe compares (see gemm_rows_floor): a product of PROBE_ROWS rows against
# each of its first 1..PROBE_ROWS - 1 rows alone.
PROBE_ROWS = 16
# The largest floor a batch is padded to: past it the process is called batch-dependent.
MAX_ROWS_FLOOR = 8
_floor: list[int | None] = []  # the process's answer, once measured (it cannot change)


def gemm_rows_floor() -> int | None:
    """The fewest rows from which this process's float GEMM gives a row the same bits whatever
    the rows beside it (1: any count), or None when no count up to :data:`MAX_ROWS_FLOOR` does.

    MKL's strict reproducibility (``MKL_CBWR=AUTO,STRICT`` before the first matmul) makes every
    count agree on an Intel CPU; on an AMD EPYC (AVX-512, measured with torch 2.13's MKL
    2024.2) products of 1 to 3 rows still round otherwise than the same rows among 4 or more,
    whatever ``MKL_CBWR`` says, while every count from 4 agrees. A batch padded to the floor
    (:func:`rows_to_run`) is then computed the same bits in any batch. Without strict mode
    the counts disagree past the floor and the answer is None. Measured once a process: a
    (PROBE_ROWS, 384) x (384, 384) product against its first rows (about a millisecond)."""
    if not _floor:
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randn(PROBE_ROWS, 384, generator=g)
        w = torch.randn(384, 384, generator=g)
        with torch.no_grad():
            full = torch.nn.functional.linear(x, w)
            same = [torch.equal(torch.nn.functional.linear(x[:m], w), full[:m])
                    for m in range(1, PROBE_ROWS)]  # fmt: skip
        _floor.append(floor_of(same))
    return _floor[0]


def floor_of(same: list[bool]) -> int | None:
    """The smallest row count m from which every count agrees (``same[m - 1]``: whether m rows
    alone gave the bits of the full product), or None when it is past :data:`MAX_ROWS_FLOOR`
    or there is none."""
    floor = next((m for m in range(1, len(same) + 1) if all(same[m - 1 :])), None)
    return floor if floor is not None and floor <= MAX_ROWS_FLOOR else None


def gemm_rows_invariant() -> bool:
    """Whether a float GEMM's rows, in batches padded to :func:`gemm_rows_floor` rows
    (:func:`rows_to_run`), are the same bits whatever the rows beside them. False where MKL's
    strict reproducibility is not in effect (``MKL_CBWR`` set after the process's first matmul,
    or to another mode) on a CPU whose kernel choice follows the row count; outputs then depend
    on how inputs were batched."""
    return gemm_rows_floor() is not None


def rows_to_run(rows: int) -> int:
    """How many rows to compute a batch of ``rows`` items in so that each item's result is the
    same bits in any batch: ``rows``, or :func:`gemm_rows_floor` when that is more (the caller
    pads with copies of an item and drops their results). A process whose rows are not
    invariant at any floor runs ``rows`` (its report says the outputs depend on the batch)."""
    return max(rows, gemm_rows_floor() or 1)


# The latest time a report can carry: the end of year 9999, the last a datetime holds (some
# libraries read SOURCE_DATE_EPOCH at import and fail on a larger one: numpy.f2py's time_t).
MAX_EPOCH = 253402300799


def source_date_epoch() -> int | None:
    """``SOURCE_DATE_EPOCH`` (the reproducible-builds convention: the time a report records
    instead of now) as seconds since 1970, or None when it is unset or empty.

    Raises:
        ConfigError: set to anything but a whole number of seconds from 0 to :data:`MAX_EPOCH`.
    """
    from opsnn_quant.errors import ConfigError

    text = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_EPOCH:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ConfigError(
            f"SOURCE_DATE_EPOCH={shown!r} is not a time: give whole seconds since 1970 from 0 to "
            f"{MAX_EPOCH} (9999-12-31), or unset it to record the time of the run"
        )
    return int(text)
