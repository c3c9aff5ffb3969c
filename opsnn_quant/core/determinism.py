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
    # MKL may pick different kernels run to run (buffer alignment) and so round differently;
    # strict conditional numerical reproducibility makes the same inputs give the same bits.
    "MKL_CBWR": "AUTO,STRICT",
    # Idle OpenMP threads spin by default, which starves other work on small shared machines.
    "OMP_WAIT_POLICY": "PASSIVE",
}


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
    if "torch" in sys.modules and os.environ.get("MKL_CBWR") == ENV["MKL_CBWR"]:
        log.debug("set_reproducible() after torch was imported: MKL_CBWR may come too late")
    if threads is not None or seed is not None:
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        if seed is not None:
            import numpy as np

            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
