"""Give freed heap memory back to the operating system between phases of work.

Each phase (probe statistics pass, local-error pass, one attribution per root, a latency run) allocates and frees
activation-sized buffers of sizes the next phase does not reuse. glibc keeps freed chunks in its
per-thread arenas, so without a trim the resident set only grows and one phase's leftovers add to
the next phase's peak. ``malloc_trim(0)`` (glibc only) releases them; elsewhere this only runs the
garbage collector.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable, Iterator

_TRIM: Callable[[int], int] | None = None
_CHECKED = False


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once; None where there is none (musl, macOS)."""
    global _TRIM, _CHECKED
    if not _CHECKED:
        _CHECKED = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                fn = getattr(libc, "malloc_trim", None)
                if fn is not None:
                    fn.argtypes = [ctypes.c_size_t]
                    fn.restype = ctypes.c_int
                _TRIM = fn
            except OSError:
                _TRIM = None
    return _TRIM


def _trim() -> bool:
    trim = malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def trim_heap() -> bool:
    """Return free heap pages to the OS (glibc's ``malloc_trim``) without a garbage collection:
    after a phase whose tensors are already freed (a collection walks every live object: ~0.3 s
    with a pipeline loaded).

    Returns:
        True if ``malloc_trim`` ran.
    """
    return _trim()


def release_memory() -> bool:
    """Collect garbage and, on glibc, return free heap pages to the OS.

    Returns:
        True if ``malloc_trim`` ran.
    """
    gc.collect()
    return _trim()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Run the block with the objects alive at its start out of the garbage collector's sight.

    A loaded pipeline with its tokenizers is ~500k tracked objects: every full collection (each
    :func:`release_memory`, and Python's own) walked them all for ~0.3 s and found nothing, as
    they outlive the block. ``gc.freeze()`` moves them to a generation no collection visits;
    objects made inside the block are collected as usual. Restored at exit (untouched when a
    caller already froze the heap: its freeze is not ours to undo).
    """
    if gc.get_freeze_count():
        yield
        return
    # The young generations only: what just became garbage is freed now, not kept frozen. A
    # full collection here walked the whole loaded pipeline for 0.6 s (shapes-t2i) and found
    # nothing; older garbage, if any, is frozen with the rest and collected after the block.
    gc.collect(1)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class TrimBudget:
    """Calls ``malloc_trim`` once the probe's hooks have churned through ``every`` bytes.

    The hooks allocate and free several activation-sized temporaries per module call (candidate
    outputs, fp16 re-runs) of many different sizes; between trims glibc keeps the freed chunks
    resident and, failing to reuse them for the next size, touches new pages. Trimming every
    ~256 MB of churn keeps the resident set near the live one for ~1 ms per trim.
    """

    def __init__(self, every: int = 256 << 20) -> None:
        self.every = every
        self.churn = 0

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` of temporaries just freed; trim when the budget is spent."""
        self.churn += nbytes
        if self.churn >= self.every:
            self.churn = 0
            _trim()


TRIM = TrimBudget()
