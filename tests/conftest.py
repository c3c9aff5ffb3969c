"""Test-session setup: reproducible math before torch loads MKL (see opsnn_quant.cli)."""

import collections
import os

import pytest

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# Idle OpenMP threads spin by default; on a shared 2-core machine that slows every other process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def fp32_int8_gemm(monkeypatch):
    """The reference's int8 matmuls on fp32 GEMMs (the path of a CPU whose ``torch._int_mm``
    is missing or inexact), whatever this machine's CPU."""
    import opsnn_quant.ascend.matmul as matmul
    from opsnn_quant.ascend.gemm_path import ENV

    # every caller asks native_int8_matmul, which asks this; a path forced for the whole run
    # (OPSNN_QUANT_INT8_GEMM=native, as .ci/run sets for a second pass) yields to the test's
    monkeypatch.setattr(matmul, "int8_gemm_is_exact", lambda: False)
    monkeypatch.setenv(ENV, "fp32-chunk")


@pytest.fixture
def native_int8_gemm(monkeypatch):
    """The reference's int8 matmuls forced onto this CPU's native int8 GEMM (``torch._int_mm``),
    whatever the race would choose; skipped where that kernel is not exact (forcing it is then
    refused: tests/ascend/test_matmul.py checks that)."""
    import opsnn_quant.ascend.matmul as matmul
    from opsnn_quant.ascend.gemm_path import ENV

    if not matmul.int8_gemm_is_exact():
        pytest.skip("this CPU's torch._int_mm is not exact")
    monkeypatch.setenv(ENV, "native")


def pytest_configure(config):
    # pytest-xdist's loadscope hands modules out by their number of tests, most first, unless
    # told to keep the collection's order: keep it, the order below (its default put the
    # one-test modules, the depth guard among them, last: the suite ended on one worker).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The modules holding a ``slow`` test first, then the others by their number of tests,
    most first (pytest-xdist's own order); each module's tests kept together and in order.
    ``-n 2 --dist loadscope`` hands modules out in this order, so the long ones start early
    and the suite does not end on one worker still running a 3-minute module while the other
    idles."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow = {module(item) for item in items if item.get_closest_marker("slow")}
    count = collections.Counter(module(item) for item in items)
    items.sort(key=lambda item: (module(item) not in slow, -count[module(item)]))  # stable
