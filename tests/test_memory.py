import sys

import pytest

from opsnn_quant import memory


def test_trim_budget_trims_once_per_budget(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "malloc_trim", lambda: calls.append)
    budget = memory.TrimBudget(every=100)
    for _ in range(4):
        budget.add(30)  # 120 bytes: one trim after the 4th
    assert calls == [0] and budget.churn == 0
    budget.add(250)
    assert calls == [0, 0]


def test_trim_budget_withoutmalloc_trim(monkeypatch):
    monkeypatch.setattr(memory, "malloc_trim", lambda: None)
    budget = memory.TrimBudget(every=1)
    budget.add(10)  # nothing to call, no error
    assert budget.churn == 0
    assert memory.release_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_release_memory_runsmalloc_trim_on_glibc():
    if memory.malloc_trim() is None:
        pytest.skip("no malloc_trim in this libc")
    assert memory.release_memory() is True
