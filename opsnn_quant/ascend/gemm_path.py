"""Which exact int8 GEMM the CPU reference runs, chosen by a short measured race.

Every path gives the same int32 sums (the reference is exact whichever runs); they differ only
in speed, and by far: oneDNN's int8 GEMM (``torch._int_mm``) is 4-10x faster than an fp32 GEMM
where the CPU has VNNI or AMX, and 40-65x *slower* where it has neither (AVX2 only: issue 29
measured 622 ms against 9.6 ms for a 1500x384x1536 product). So exactness decides which paths
may run and speed decides which does: at first use per process, each exact path runs a few
shapes of each size class (well under a second in all), the fastest wins, the choice is logged
once and kept (:func:`environment` reports it with the CPU's flags).

``OPSNN_QUANT_INT8_GEMM`` = ``auto`` (default, the race), or one path's name to force it
(benchmarks compare them side by side; forcing an inexact path is refused).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from opsnn_quant.errors import ConfigError

log = logging.getLogger(__name__)

ENV = "OPSNN_QUANT_INT8_GEMM"
# Size classes by the product's rows (M): a decoder's per-token steps vs whole sequences and
# feature maps; each class races on its own shapes (M, K, N) and may pick another path.
SMALL_ROWS = 128
RACE_SHAPES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "small": ((16, 512, 512), (64, 384, 1536)),
    "large": ((256, 512, 512), (512, 384, 1024)),
}
CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "avx512f", "avx2")

Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def size_class(rows: int | None) -> str:
    """The size class of a product of ``rows`` rows (None: a large one)."""
    return "small" if rows is not None and rows < SMALL_ROWS else "large"


@torch.no_grad()
def gemm_is_exact(gemm: Gemm) -> bool:
    """Whether ``gemm`` (int8 (M, K) x int8 (K, N) -> int32) returns the exact sums: on operands
    at the int8 extremes (where a kernel that sums u8*s8 pairs in int16 saturates) and random
    ones, in shapes that take small-M and blocked paths. A kernel that raises is not exact."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for m, k, n in ((1, 2048, 16), (33, 520, 48), (300, 128, 260)):
        for lo, hi in ((127, 127), (-128, -128), (-128, 127), (127, -128)):
            a = torch.full((m, k), lo, dtype=torch.int8)
            a[:, 1::2] = hi  # alternate pairs: both extremes meet inside one pair sum
            cases.append((a, torch.full((k, n), hi, dtype=torch.int8)))
        rand = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
        cases.append((rand, torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8).t()))
    try:
        for a, b in cases:
            want = (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)
            if not torch.equal(gemm(a, b), want):
                return False
    except RuntimeError as e:  # e.g. no int8 GEMM kernel in this build
        log.info("int8 GEMM unavailable: %s", e)
        return False
    return True


@torch.no_grad()
def time_gemm(
    gemm: Gemm,
    shapes: Sequence[tuple[int, int, int]],
    *,
    reps: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds ``gemm`` takes over ``shapes`` (best of ``reps`` after one warm-up each)."""
    g = torch.Generator().manual_seed(1)
    total = 0.0
    for m, k, n in shapes:
        a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8).t()  # a weight view
        gemm(a, b)
        best = float("inf")
        for _ in range(reps):
            t0 = clock()
            gemm(a, b)
            best = min(best, clock() - t0)
        total += best
    return total


@dataclass(frozen=True)
class GemmChoice:
    """The path each size class runs, and how it was chosen.

    Attributes:
        paths: size class -> path name.
        how: ``race`` or ``forced by OPSNN_QUANT_INT8_GEMM``.
        seconds: size class -> path -> race time (empty when forced).
        exact: the paths that proved exact.
    """

    paths: dict[str, str]
    how: str
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    exact: tuple[str, ...] = ()

    def path_for(self, rows: int | None) -> str:
        """The path a product of ``rows`` rows runs."""
        return self.paths[size_class(rows)]


def choose(
    candidates: Mapping[str, Gemm],
    exact: Mapping[str, bool],
    *,
    forced: str = "auto",
    timer: Callable[[Gemm, Sequence[tuple[int, int, int]]], float] = time_gemm,
) -> GemmChoice:
    """Pick the path of each size class among the exact ``candidates``.

    Args:
        candidates: path name -> GEMM, in order of preference on a tie.
        exact: path name -> whether it proved exact (:func:`gemm_is_exact`).
        forced: ``auto`` (race) or the name of the path every class runs.
        timer: seconds a GEMM takes over shapes (:func:`time_gemm`).

    Raises:
        ConfigError: ``forced`` names no candidate or an inexact one; no candidate is exact.
    """
    ok = tuple(name for name in candidates if exact.get(name))
    if forced != "auto":
        if forced not in candidates:
            known = ", ".join(["auto", *candidates])
            raise ConfigError(f"{ENV} must be one of {known}, got {forced!r}")
        if forced not in ok:
            raise ConfigError(f"{ENV}={forced}: that int8 GEMM is not exact on this CPU")
        return GemmChoice(dict.fromkeys(RACE_SHAPES, forced), f"forced by {ENV}", exact=ok)
    if not ok:
        raise ConfigError("no exact int8 GEMM path on this machine")
    if len(ok) == 1:
        return GemmChoice(dict.fromkeys(RACE_SHAPES, ok[0]), "the only exact path", exact=ok)
    seconds: dict[str, dict[str, float]] = {}
    paths = {}
    for cls, shapes in RACE_SHAPES.items():
        seconds[cls] = {name: timer(candidates[name], shapes) for name in ok}
        paths[cls] = min(ok, key=lambda name: seconds[cls][name])  # first on a tie
    return GemmChoice(paths, "race", seconds, ok)


def forced_path() -> str:
    """``OPSNN_QUANT_INT8_GEMM`` (``auto`` when unset)."""
    return os.environ.get(ENV, "auto").strip() or "auto"


def cpu_flags() -> dict[str, bool]:
    """The CPU features that decide int8 GEMM speed (``/proc/cpuinfo``; all False elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    words: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            words.update(line.partition(":")[2].split())
            break
    return {flag: flag in words for flag in CPU_FLAGS}


def describe(choice: GemmChoice) -> dict[str, object]:
    """A JSON-ready description of ``choice`` with the CPU's flags and torch's capability."""
    return {
        "int8_gemm": dict(choice.paths),
        "int8_gemm_chosen_by": choice.how,
        "int8_gemm_race_ms": {
            cls: {name: round(s * 1e3, 3) for name, s in times.items()}
            for cls, times in choice.seconds.items()
        },
        "int8_gemm_exact": list(choice.exact),
        "cpu_flags": cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
