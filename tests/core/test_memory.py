import sys

import pytest

from opsnn_quant.core import memory


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


def test_frozen_heap_hides_older_objects_and_still_collects_new_cycles():
    import gc
    import weakref

    class Node:
        pass

    old = [Node() for _ in range(100)]
    assert gc.get_freeze_count() == 0
    with memory.frozen_heap():
        assert gc.get_freeze_count() >= len(old)  # alive at the start: out of the collector's walk
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made inside the block
        ref = weakref.ref(a)
        del a, b
        memory.release_memory()
        assert ref() is None  # ... is collected as usual
        with memory.frozen_heap():  # nested: the outer freeze stays
            pass
        assert gc.get_freeze_count() >= len(old)
    assert gc.get_freeze_count() == 0  # restored


def test_probe_runs_with_the_heap_frozen(monkeypatch):
    import gc

    import torch

    from opsnn_quant.probe.api import ProbeConfig, probe

    counts = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model.register_forward_hook(lambda m, a, o: counts.append(gc.get_freeze_count()))
    probe(model, lambda m: m(torch.randn(2, 4)), ProbeConfig(attribution=False, fp16=False))
    assert counts and all(c > 0 for c in counts)
    assert gc.get_freeze_count() == 0
