"""The exact int8 GEMM dispatcher (opsnn_quant/ascend/gemm_path.py, issue 29): exactness decides
which paths may run, a measured race which one does, per size class of product."""

from __future__ import annotations

import pytest
import torch

from opsnn_quant.ascend import gemm_path
from opsnn_quant.ascend.gemm_path import GemmChoice, choose, gemm_is_exact, size_class, time_gemm
from opsnn_quant.errors import ConfigError


def _exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)


def _saturating(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """vpmaddubsw's int16 pair sums with saturation (AVX2/AVX-512 without VNNI)."""
    prod = (a.to(torch.int64) + 128).unsqueeze(-1) * b.to(torch.int64).unsqueeze(0)
    pairs = (prod[:, 0::2] + prod[:, 1::2]).clamp(-(2**15), 2**15 - 1)
    return (pairs.sum(dim=1) - 128 * b.to(torch.int64).sum(dim=0)).to(torch.int32)


def _missing(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("no kernel")


def test_exactness_is_proven_on_the_extremes():
    assert gemm_is_exact(_exact)
    assert not gemm_is_exact(_saturating)  # wrong only where pairs of extremes meet
    assert not gemm_is_exact(lambda a, b: _exact(a, b) + 1)
    assert not gemm_is_exact(_missing)


def _timer(seconds: dict[str, dict[str, float]]):
    """A fake race clock: seconds per (size class, backend), found by the shapes' identity."""
    names = {id(f): n for n, f in CANDIDATES.items()}
    classes = {shapes: cls for cls, shapes in gemm_path.RACE_SHAPES.items()}
    return lambda gemm, shapes: seconds[classes[tuple(shapes)]][names[id(gemm)]]


CANDIDATES = {"native": _exact, "fp32-chunk": lambda a, b: _exact(a, b)}


def test_the_faster_exact_path_wins_in_each_size_class():
    seconds = {
        "small": {"native": 2.0, "fp32-chunk": 1.0},
        "large": {"native": 1.0, "fp32-chunk": 5.0},
    }
    choice = choose(CANDIDATES, {"native": True, "fp32-chunk": True}, timer=_timer(seconds))
    assert choice.paths == {"small": "fp32-chunk", "large": "native"}
    assert choice.how == "race" and choice.seconds == seconds
    assert choice.path_for(16) == "fp32-chunk" and choice.path_for(4096) == "native"
    assert choice.path_for(None) == "native"  # unknown rows: a large product


def test_an_inexact_path_never_runs_however_fast():
    seconds = {cls: {"native": 0.001, "fp32-chunk": 9.0} for cls in gemm_path.RACE_SHAPES}
    choice = choose(CANDIDATES, {"native": False, "fp32-chunk": True}, timer=_timer(seconds))
    assert set(choice.paths.values()) == {"fp32-chunk"} and choice.exact == ("fp32-chunk",)
    assert choice.how == "the only exact path" and not choice.seconds  # nothing to race


def test_a_forced_path_runs_everywhere_unless_it_is_inexact():
    exact = {"native": True, "fp32-chunk": True}
    never = lambda gemm, shapes: pytest.fail("a forced path is not raced")  # noqa: E731
    forced = choose(CANDIDATES, exact, forced="fp32-chunk", timer=never)
    assert forced == GemmChoice(
        {"small": "fp32-chunk", "large": "fp32-chunk"}, "forced by OPSNN_QUANT_INT8_GEMM",
        exact=("native", "fp32-chunk"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="not exact on this CPU"):
        choose(CANDIDATES, {"native": False, "fp32-chunk": True}, forced="native")
    with pytest.raises(ConfigError, match="must be one of auto, native, fp32-chunk"):
        choose(CANDIDATES, exact, forced="fastest")


def test_size_classes():
    assert [size_class(r) for r in (1, 127, 128, None)] == ["small", "small", "large", "large"]


def test_time_gemm_is_the_best_of_its_repetitions():
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # 3 s, 1 s, 2 s: best 1 s
    calls = []
    total = time_gemm(
        lambda a, b: calls.append(a.shape), [(4, 8, 2)], reps=3, clock=lambda: next(ticks)
    )
    assert total == 1.0 and calls == [(4, 8)] * 4  # one warm-up, three timed


def test_cpu_flags_name_the_int8_features():
    flags = gemm_path.cpu_flags()
    assert set(flags) == {"avx512_vnni", "avx_vnni", "amx_int8", "avx512f", "avx2"}
    assert all(isinstance(v, bool) for v in flags.values())
