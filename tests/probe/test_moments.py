"""GPTQ's input moments collected group by group and spilled to files when they do not all fit
(:mod:`opsnn_quant.probe.moments`): the same report and the same quantized bits as one pass."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.api import ProbeConfig, ProbeResult, run_probe
from opsnn_quant.probe.moments import MOMENTS_MEMORY_ENV, moments_memory, plan_groups
from opsnn_quant.probe.passes import watches_for
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.gptq import InputMoments, MomentStore, SplitMoments
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


class Three(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 48)
        self.fc3 = nn.Linear(48, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _loop(calls: list[int]):
    def loop(model: nn.Module) -> None:
        calls.append(1)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            model(torch.randn(2, 24, 32, generator=g))

    return loop


def _probe(monkeypatch: pytest.MonkeyPatch, cap: int | None, calls: list[int]) -> ProbeResult:
    if cap is None:
        monkeypatch.delenv(MOMENTS_MEMORY_ENV, raising=False)
    else:
        monkeypatch.setenv(MOMENTS_MEMORY_ENV, str(cap))
    cfg = ProbeConfig(fp16=False, attribution=False)
    return run_probe(Three(), _loop(calls), cfg, modalities={"": "denoiser"})


# streamed, the moments hold 8 bytes per K^2 in memory: fc1 (K = 32) 8 KiB, fc2 (K = 64) 32 KiB,
# fc3 (K = 48) 18 KiB; in memory 24 bytes per K^2: 24 + 96 + 54 KiB
@pytest.mark.parametrize(
    ("cap", "passes"),
    [
        (8 * 64 * 64, 2),  # fc1 and fc2 cannot share a group, fc3 alone: two more passes
        (8 * (32 * 32 + 64 * 64 + 48 * 48), 0),  # too much in memory, all streamed in pass 1
    ],
)
def test_moments_streamed_in_groups_give_the_one_pass_report_and_bits(monkeypatch, cap, passes):
    calls_one: list[int] = []
    one = _probe(monkeypatch, None, calls_one)
    calls_grouped: list[int] = []
    grouped = _probe(monkeypatch, cap, calls_grouped)
    assert len(calls_grouped) == len(calls_one) + passes  # one more pass per later group
    assert grouped.report.costs["moments_passes"] == passes
    assert "moments_passes" not in one.report.costs
    keys = ("modules", "findings", "modalities")
    assert grouped.report.model_dump(include=set(keys)) == one.report.model_dump(include=set(keys))
    for name in ("fc1", "fc2", "fc3"):
        a, b = one.statistics[name].moments, grouped.statistics[name].moments
        assert a is not None and b is not None
        assert not a.spilled and b.spilled and b._sum is None
        assert torch.equal(a.hessian(), b.hessian())
        assert torch.equal(a.mean(), b.mean())
        assert a.rows == b.rows
    spec = QuantSpec(Precision.W8A8, weight_rounding="gptq", bias_correction=True)
    outs = []
    for result in (one, grouped):
        model = quantize(Three(), {"fc*": spec}, None, statistics=result.statistics)
        outs.append(model.state_dict())
    assert outs[0].keys() == outs[1].keys()
    for key, value in outs[0].items():
        assert torch.equal(value, outs[1][key]), key


def test_streamed_moments_keep_only_the_open_batchs_fp32_sum_and_the_in_memory_bits():
    from opsnn_quant.core.stream import at_batch

    torch.manual_seed(0)
    kept, streamed = SplitMoments(16), SplitMoments(16)
    store = MomentStore()
    streamed.stream_to(store)
    for batch in range(3):  # three batches of two calls: each batch's fp32 sum added in float64
        with at_batch(batch):
            for _ in range(2):
                x = torch.randn(40, 16) * 1e3
                kept.collect(x)
                streamed.collect(x)
                for half in streamed.halves:
                    assert half._sum is None and half._open is not None  # 4 bytes per K^2
                    assert half._open.dtype == torch.float32
    # one file per half, rewritten at each closed batch
    assert not streamed.spilled and store.bytes == 2 * 16 * 16 * 8
    streamed.spill(store)
    assert streamed.spilled and store.bytes == 2 * 16 * 16 * 8
    for half in (0, 1):
        a, b = kept.halves[half], streamed.halves[half]
        assert torch.equal(a.xtx, b.xtx) and a.rows == b.rows
    assert torch.equal(kept.merged().hessian(), streamed.merged().hessian())
    with pytest.raises(Exception, match="spilled"):
        streamed.collect(torch.randn(4, 16))
    late = InputMoments(16)
    late.collect(torch.randn(4, 16))
    with pytest.raises(Exception, match="first rows"):
        late.stream_to(store)


def test_the_groups_follow_the_model_and_the_cap():
    model = Three()
    named = dict(model.named_modules())
    from opsnn_quant.models.generic import GenericAdapter

    adapter = GenericAdapter(model, {"": "denoiser"}, lambda m: None)
    w = watches_for(adapter, ProbeConfig(fp16=False, attribution=False), named, {}, {})
    big = copy.copy(w.local)
    assert plan_groups(big, 10**9) == ([["fc1", "fc2", "fc3"]], False)  # in memory
    assert all(lp.collect_moments for lp in big.values())
    # streamed (8 bytes per K^2), one module alone at least
    assert plan_groups(w.local, 1) == ([["fc1"], ["fc2"], ["fc3"]], True)
    assert [lp.collect_moments for lp in w.local.values()] == [True, False, False]


def test_the_cap_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(MOMENTS_MEMORY_ENV, "1000")
    assert moments_memory() == 1000
    monkeypatch.setenv(MOMENTS_MEMORY_ENV, "lots")
    with pytest.raises(ConfigError, match=MOMENTS_MEMORY_ENV):
        moments_memory()


def test_spilled_moments_read_back_the_same_bits_and_take_no_more_rows():
    torch.manual_seed(0)
    kept, spilled = SplitMoments(16), SplitMoments(16)
    for _ in range(4):
        x = torch.randn(40, 16)
        kept.collect(x)
        spilled.collect(x)
    store = MomentStore()
    spilled.spill(store)
    assert spilled.spilled and store.bytes == 2 * 16 * 16 * 8
    assert torch.equal(kept.merged().hessian(), spilled.merged().hessian())
    for half in (0, 1):
        assert torch.equal(kept.fitted_for(half).hessian(), spilled.fitted_for(half).hessian())
    with pytest.raises(Exception, match="spilled"):
        spilled.collect(torch.randn(4, 16))
    plain = InputMoments(16)
    assert plain._sum is None  # nothing K x K before the first rows
    plain.collect(torch.randn(4, 16))
    assert plain._sum is None and plain.xtx is not None and plain._sum is not None


def test_pass_two_that_drops_each_modules_candidates_early_measures_the_same(monkeypatch):
    monkeypatch.setenv(MOMENTS_MEMORY_ENV, "1")  # spilled moments too
    reports = []
    for estimator in ("structured", "diagonal"):  # no attribution: pass 2 either way
        cfg = ProbeConfig(fp16=False, attribution=False, estimator=estimator)
        # the diagonal estimator reads no candidate after pass 2: each module's are dropped
        # at its last call
        reports.append(run_probe(Three(), _loop([]), cfg, modalities={"": "denoiser"}).report)
    assert [m.w8a8 for m in reports[0].modules] == [m.w8a8 for m in reports[1].modules]
    assert all(m.w8a8 for m in reports[1].modules if m.type == "Linear")


def test_the_automatic_cap_follows_the_weights_within_bounds_and_bounds_the_passes(monkeypatch):
    monkeypatch.delenv(MOMENTS_MEMORY_ENV, raising=False)
    mib = 2**20
    # a small UNet: 494 MiB of moments for 13 MiB of weights -> a fifth of the moments (at most
    # four more passes), above the 64 MiB floor
    assert moments_memory(494 * mib, 13 * mib) == -(-494 * mib // 5)
    # tiny moments, tiny weights: the floor (one group: no extra pass)
    assert moments_memory(5 * mib, 2 * mib) == 64 * mib
    # 400 MiB of weights: half of them
    assert moments_memory(100 * mib, 400 * mib) == 200 * mib
    # a model's real widths: the 512 MiB ceiling, however many passes that takes
    assert moments_memory(10 * 1024 * mib, 24 * 1024 * mib) == 512 * mib
    assert moments_memory() == 512 * mib
    monkeypatch.setenv(MOMENTS_MEMORY_ENV, "1000")  # the environment decides
    assert moments_memory(494 * mib, 13 * mib) == 1000
