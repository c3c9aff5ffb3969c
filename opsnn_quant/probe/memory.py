"""Give freed heap memory back to the operating system between probe phases.

Each phase (statistics pass, local-error pass, one attribution per root) allocates and frees
activation-sized buffers of sizes the next phase does not reuse. glibc keeps freed chunks in its
per-thread arenas, so without a trim the resident set only grows and one phase's leftovers add to
the next phase's peak. ``malloc_trim(0)`` (glibc only) releases them; elsewhere this only runs the
garbage collector.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys

log = logging.getLogger(__name__)

_TRIM: object | None = None
_CHECKED = False


def _malloc_trim() -> object | None:
    global _TRIM, _CHECKED
    if not _CHECKED:
        _CHECKED = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _TRIM = getattr(libc, "malloc_trim", None)  # absent on musl
            except OSError:
                _TRIM = None
    return _TRIM


def release_memory() -> bool:
    """Collect garbage and, on glibc, return free heap pages to the OS.

    Returns:
        True if ``malloc_trim`` ran.
    """
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # type: ignore[operator]
    return True
