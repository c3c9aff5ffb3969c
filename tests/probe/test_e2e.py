"""The end-to-end phase's local errors: measured on the replayed calls (no pass 2 over the loop),
on the calls pass 1 kept of modules outside every root, and on modules no gradient reaches."""

import math

import pytest
import torch
from torch import nn

from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.probe.local import LocalProbe
from tests.tiny_models import LINEAR_CANDIDATES


class _Branches(nn.Module):
    """``b`` runs on the input but the output does not use it: no gradient reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 8)
        self.b = nn.Linear(16, 8)
        self.unused: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.unused = self.b(x)
        return self.a(x)


def _data() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(8, 16, generator=gen) for _ in range(3)]


def _probe_counting(model: nn.Module, cfg: ProbeConfig, roots: dict | None = None):
    """The report and how many times the forward loop called the model."""
    calls = []
    data = _data()

    def loop(m: nn.Module) -> None:
        calls.append(1)
        for x in data:
            m(x)

    adapter = GenericAdapter(model, {"": "denoiser"}, loop, roots=roots)
    return probe(adapter, adapter.forward_loop(), cfg), len(calls)


def _sqnr(report, name: str) -> dict[str, float]:
    return {s: e.sqnr_db for s, e in report.module(name).w8a8.items()}


def test_local_errors_come_from_the_replay_without_a_second_pass():
    # Every call is recorded (3 <= max_root_calls) and every call holds fewer rows than
    # error_rows, so the replay measures the same rows pass 2 would: the same local errors
    # as the forward-loop pass, with the loop run once (pass 1) instead of twice.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    cfg = ProbeConfig(fp16=False)
    replayed, loops = _probe_counting(model, cfg)
    reference, loops_ref = _probe_counting(model, ProbeConfig(fp16=False, local_errors="forward_loop"))  # fmt: skip
    assert (loops, loops_ref) == (1, 2)
    for name in ("0", "2"):
        got, want = _sqnr(replayed, name), _sqnr(reference, name)
        assert set(got) == LINEAR_CANDIDATES
        assert got == pytest.approx(want, rel=1e-9)
        e2e, e2e_ref = replayed.module(name).e2e, reference.module(name).e2e
        assert e2e is not None and e2e_ref is not None
        assert e2e.scheme == e2e_ref.scheme  # the local best, known after the replay
        assert e2e.contribution == pytest.approx(e2e_ref.contribution, rel=1e-9)
        assert next(iter(e2e.schemes)) == e2e.scheme
        assert e2e.schemes == pytest.approx(e2e_ref.schemes, rel=1e-9)
    assert replayed.costs["pass2_seconds"] == 0.0


def test_a_module_outside_every_root_is_measured_on_the_calls_pass_one_kept():
    # The root is the last Linear: the first one is outside it, so pass 1 kept its calls and
    # its local errors come from them (the float output by the module itself): no pass 2.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    roots = {"denoiser": "2"}
    kept, loops = _probe_counting(model, ProbeConfig(fp16=False), roots)
    reference, _ = _probe_counting(model, ProbeConfig(fp16=False, local_errors="forward_loop"), roots)  # fmt: skip
    assert loops == 1
    assert _sqnr(kept, "0") == pytest.approx(_sqnr(reference, "0"), rel=1e-9)
    assert kept.module("0").e2e is None  # outside the root: no end-to-end estimate, as before
    assert kept.module("2").e2e is not None


def test_a_module_no_gradient_reaches_keeps_its_local_errors_and_contributes_nothing():
    torch.manual_seed(0)
    model = _Branches()
    report, loops = _probe_counting(model, ProbeConfig(fp16=False))
    reference, _ = _probe_counting(model, ProbeConfig(fp16=False, local_errors="forward_loop"))
    assert loops == 1
    assert _sqnr(report, "b") == pytest.approx(_sqnr(reference, "b"), rel=1e-9)
    e2e = report.module("b").e2e
    assert e2e is not None and e2e.contribution == 0.0
    assert set(e2e.schemes.values()) == {0.0}
    assert report.module("a").e2e is not None and report.module("a").e2e.contribution > 0


@pytest.mark.parametrize(("error_rows", "stride"), [(6, 4), (3, 8)])
def test_the_replay_measures_an_evenly_strided_subset_of_about_error_rows_rows(
    monkeypatch, error_rows, stride
):
    # error_rows 6 over 3 replayed calls: 2 rows per call; calls of 8 rows -> every 4th row
    # (error_rows 3: every 8th). The three small calls run as one batch of 24 rows
    # (probe/projections.py), which measures the three calls' share: the same rows.
    kept: dict[str, LocalProbe] = {}
    monkeypatch.setattr(LocalProbe, "release", lambda self: kept.setdefault(self.name, self))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    _probe_counting(model, ProbeConfig(fp16=False, error_rows=error_rows))
    with torch.no_grad():
        outputs = [model[0](x) for x in _data()]
    signal = sum(float(y[::stride].double().pow(2).sum()) for y in outputs)
    energy = kept["0"].energies["w8a8"]
    assert energy.channel_count == 3 * (8 // stride)
    assert math.isclose(energy.signal, signal, rel_tol=1e-12)


@pytest.mark.parametrize(
    "overrides",
    [
        {"estimator": "diagonal"},  # needs pass 2's per-channel noise powers first
        {"e2e_schemes": "best"},  # needs the local best first
        {"exhaustive": True},
        {"local_errors": "forward_loop"},
        {"attribution": False},
    ],
)
def test_configurations_that_need_pass_two_first_run_it_over_the_loop(overrides):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    cfg = ProbeConfig(fp16=False, **overrides)
    report, loops = _probe_counting(model, cfg)
    assert not cfg.replays_local_errors and loops == 2
    assert report.costs["pass2_seconds"] > 0
    assert set(report.module("0").w8a8) == LINEAR_CANDIDATES


class _ChangedAfterUse(nn.Module):
    """``b``'s input is changed in place after ``b`` ran, and no gradient reaches ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 8)
        self.b = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.clone()
        self.b(h)
        h.add_(1.0)
        return self.a(h)


def test_an_unreached_module_whose_input_changed_in_place_is_refused():
    from opsnn_quant.errors import CalibrationError

    torch.manual_seed(0)
    with pytest.raises(CalibrationError, match="'b' was modified in place"):
        _probe_counting(_ChangedAfterUse(), ProbeConfig(fp16=False))


class _ConvThenLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).flatten(2).transpose(1, 2))


def test_a_module_type_the_target_runs_no_scheme_on_is_counted_but_not_measured():
    gen = torch.Generator().manual_seed(0)
    data = [torch.randn(2, 4, 4, 4, generator=gen) for _ in range(3)]

    def run(cfg: ProbeConfig):
        model = _ConvThenLinear()
        adapter = GenericAdapter(model, {"": "denoiser"}, lambda m: [m(x) for x in data])
        return probe(adapter, adapter.forward_loop(), cfg)

    everything = run(ProbeConfig())
    # ascend910b-eager's: no int8 conv (Target.schemes("Conv2d") is empty)
    linear_only = run(ProbeConfig(type_schemes={"Linear": tuple(sorted(LINEAR_CANDIDATES))}))
    conv, conv_all = linear_only.module("conv"), everything.module("conv")
    assert set(conv_all.w8a8) == {"w8a8", "w8a8_mse", "w8a8_dynamic", "w8a8_gptq"}
    assert conv_all.e2e is not None
    assert conv.w8a8 == {} and conv.e2e is None
    assert (conv.calls, conv.macs) == (conv_all.calls, conv_all.macs) == (3, 2 * 16 * 8 * 4 * 9)
    assert conv.fp16 == conv_all.fp16  # overflow matters in float too
    # the Linear's own measurements do not depend on the conv being measured
    fc, fc_all = linear_only.module("fc"), everything.module("fc")
    assert fc.w8a8 == fc_all.w8a8
    assert fc.e2e is not None and fc_all.e2e is not None
    assert fc.e2e.contribution == fc_all.e2e.contribution and fc.e2e.schemes == fc_all.e2e.schemes


def test_probe_config_narrows_the_schemes_per_module_type():
    cfg = ProbeConfig(schemes=("w8a8", "w4a16"), type_schemes={"Linear": ("w8a8", "w8a8_mse")})
    assert cfg.schemes_of("Linear") == ("w8a8",)
    assert cfg.schemes_of("Conv2d") == ()
    assert ProbeConfig(schemes=("w8a8",)).schemes_of("Conv2d") == ("w8a8",)
    assert ProbeConfig().schemes_of("Linear") is None


def test_candidates_parked_in_files_past_the_budget_give_the_same_report(monkeypatch):
    # The attribution keeps the candidates of the modules it measured last, up to a budget;
    # the others' integer weights wait in files (LocalProbe.park) and come back bit for bit
    # when their module is measured again (the next replayed call). A budget of one byte
    # parks every module once another is measured: the same figures as all held in memory.
    import opsnn_quant.probe.e2e as e2e_mod

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8)
    )
    cfg = ProbeConfig(fp16=False, schemes=("w8a8", "w8a8_dynamic", "w8a8_gptq"))
    kept, _ = _probe_counting(model, cfg)
    parks: list[str] = []
    park = LocalProbe.park

    def counting(self: LocalProbe, store) -> None:
        parks.append(self.name)
        park(self, store)

    monkeypatch.setattr(LocalProbe, "park", counting)
    monkeypatch.setattr(e2e_mod, "candidates_memory", lambda weight_bytes: 1)
    parked, _ = _probe_counting(model, cfg)
    assert len(set(parks)) >= 2  # every module but the one measured last
    keys = {"modules", "findings", "modalities"}
    assert parked.model_dump(include=keys) == kept.model_dump(include=keys)


def test_a_parked_module_reads_its_candidates_back_shared_and_bit_for_bit():
    from opsnn_quant.quant.gptq import MomentStore

    torch.manual_seed(0)
    layer = nn.Linear(16, 8)
    lp = LocalProbe("fc", layer)
    x = torch.randn(32, 16)
    lp.collect(x)
    lp.decide()
    before = {s: lp.candidate_output(s, (x,)) for s in ("w8a8", "w8a8_mse", "w8a8_dynamic")}
    held = lp.candidate_bytes()
    assert held == 8 * 16  # one int8 (8, 16) weight: the three candidates share it
    store = MomentStore()
    lp.park(store)
    assert lp.candidate_bytes() == 0 and store.bytes == held  # written once, per variant
    assert all(q.weight.numel() == 0 for q in lp._shadows.values())
    after = {s: lp.candidate_output(s, (x,)) for s in before}
    assert all(torch.equal(before[s], after[s]) for s in before)
    weights = {id(q.weight) for q in lp._shadows.values()}
    assert len(weights) == 1 and lp.candidate_bytes() == held  # shared again
    lp.park(store)  # parked again: nothing written twice
    assert store.bytes == held
