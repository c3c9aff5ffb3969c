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
    # (oneMKL developer guide, "Reproducibility Conditions": ?gemm in strict mode). MKL reads it
    # at its first call, not when torch loads: it must be set before the first matmul.
    "MKL_CBWR": "AUTO,STRICT",
    # Idle OpenMP threads spin by default, which starves other work on small shared machines.
    "OMP_WAIT_POLICY": "PASSIVE",
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


def gemm_rows_invariant() -> bool:
    """Whether this process's float GEMM gives a row the same bits whatever the rows beside
    it: a (1, 384) and a (3, 384) product against the same rows of an (8, 384) one. False
    where MKL's strict reproducibility is not in effect (``MKL_CBWR`` set after the process's
    first matmul, or to another mode) on a CPU whose kernel choice follows the row count;
    outputs then depend on how inputs were batched. A few microseconds."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 384, generator=g)
    w = torch.randn(384, 384, generator=g)
    with torch.no_grad():
        full = torch.nn.functional.linear(x, w)
        return all(torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]) for m in (1, 3))


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
