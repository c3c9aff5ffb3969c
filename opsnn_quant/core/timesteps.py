"""The denoising step a diffusion model is at: a clock the sampling loop sets, modules read.

Timestep-aware activation quantization (``w8a8_timestep``) keeps static scales per *group of
steps*; the diffusion adapters' sampling loops set the step index here before each denoiser call
(and replays of recorded calls set the step they were recorded at), and the quantizers read it.
Outside a sampling loop the clock reads None.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import itertools
from collections.abc import Iterator, Sequence

_STEP: contextvars.ContextVar[int | None] = contextvars.ContextVar("opsnn_quant_step", default=None)


def current_step() -> int | None:
    """The step index the sampling loop is at (0 = the first), or None outside one."""
    return _STEP.get()


def set_step(step: int | None) -> None:
    """Set the clock (sampling loops; None when the loop ends)."""
    _STEP.set(step)


@contextlib.contextmanager
def at_step(step: int | None) -> Iterator[None]:
    """Run the block with the clock at ``step`` (restored afterwards)."""
    token = _STEP.set(step)
    try:
        yield
    finally:
        _STEP.reset(token)


def group_of(step: int, bounds: Sequence[int]) -> int:
    """The index of the group of ``step``: ``bounds`` are the groups' first steps, ascending,
    starting at 0 (``(0, 4, 8)``: steps 0-3, 4-7, 8 and later)."""
    return max(0, bisect.bisect_right(bounds, step) - 1)


def check_bounds(bounds: Sequence[int]) -> tuple[int, ...]:
    """``bounds`` as a tuple, checked: starts at 0, strictly ascending.

    Raises:
        ValueError: otherwise.
    """
    b = tuple(int(x) for x in bounds)
    if not b or b[0] != 0 or any(x >= y for x, y in itertools.pairwise(b)):
        raise ValueError(f"timestep bounds must start at 0 and ascend strictly, got {list(b)}")
    return b
