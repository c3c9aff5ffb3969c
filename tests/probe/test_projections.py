"""The structured estimator's projections (probe/projections.py): small calls batched give the
projections each call gives alone, computed here by hand from the estimator's formula
(per-sample sums of (y_q - y) * g, squared, summed; fp32 products as the estimator takes
them, so agreement to 1e-4)."""

import pytest
import torch
from torch import nn

from opsnn_quant.core.timesteps import at_step, current_step
from opsnn_quant.probe.pending import PENDING_ROWS
from opsnn_quant.probe.projections import KeptCalls, Projector


class Recorder:
    """A row-wise candidate (noise a function of each row of the output) that records its runs."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int, int, int | None]] = []  # scheme, rows, calls, clock

    def __call__(self, name, scheme, args, y, calls=1):
        self.runs.append((scheme, args[0].shape[0], calls, current_step()))
        gain = {"a": 0.01, "b": 0.03}.get(scheme, 0.02)
        return y + gain * torch.sin(1000.0 * y)


def by_hand(calls, scheme_gain):
    """sum over calls and samples of (sum over the sample of (y_q - y) * g)^2."""
    total = 0.0
    for y, g, samples in calls:
        prod = (scheme_gain * torch.sin(1000.0 * y)).double() * g.double()
        s = prod.reshape(samples, -1).sum(dim=1) if samples else prod.sum().reshape(1)
        total += float(s.pow(2).sum())
    return total


def add_call(proj, module, shape, batch, samples="batch"):
    """One random call of ``module`` on an input of ``shape`` handed to ``proj``; returns what
    :func:`by_hand` takes for it (``samples``: the per-sample split, the batch by default)."""
    x = torch.randn(*shape)
    y = module(x).detach()
    g = torch.randn_like(y)
    proj.add((x,), y, g, batch)
    return y, g, batch if samples == "batch" else samples


def linear_projector(seed, schemes=("a",), **kwargs):
    """A seeded 4 -> 4 Linear, a recording candidate, its accumulator and a Projector."""
    torch.manual_seed(seed)
    lin = nn.Linear(4, 4)
    fn, acc = Recorder(), dict.fromkeys(schemes, 0.0)
    return lin, fn, acc, Projector("lin", lin, schemes, fn, acc, **kwargs)


def test_small_linear_calls_run_once_and_project_as_each_alone():
    torch.manual_seed(0)
    lin = nn.Linear(8, 6)
    fn, acc = Recorder(), {"a": 0.0, "b": 0.0}
    proj = Projector("lin", lin, ("a", "b"), fn, acc)
    calls = []
    for batch, tokens in ((2, 5), (3, 4), (2, 7)):
        calls.append(add_call(proj, lin, (batch, tokens, 8), batch))
    assert fn.runs == []  # 10 + 12 + 14 rows: all kept
    proj.flush()
    assert fn.runs == [("a", 36, 3, None), ("b", 36, 3, None)]  # one run per scheme
    assert acc["a"] == pytest.approx(by_hand(calls, 0.01), rel=1e-4)
    assert acc["b"] == pytest.approx(by_hand(calls, 0.03), rel=1e-4)


def test_an_output_not_leading_with_the_batch_is_one_sum():
    lin, _, acc, proj = linear_projector(1)
    # (tokens, batch, channels): the root's batch is 3
    call = add_call(proj, lin, (5, 3, 4), 3, samples=None)
    proj.flush()
    assert acc["a"] == pytest.approx(by_hand([call], 0.01), rel=1e-4)


def test_per_step_calls_join_only_their_group_and_run_at_its_first_step():
    # "per" reads the clock: steps 0-4 and 5+ are two groups; "a" does not
    key = lambda name, scheme, step: (step >= 5) if scheme == "per" else None  # noqa: E731
    lin, fn, acc, proj = linear_projector(2, ("a", "per"), step_key=key)
    calls = []
    for step in (0, 6, 3, 9):
        with at_step(step):
            calls.append(add_call(proj, lin, (2, 3, 4), 2))
    proj.flush()
    assert fn.runs == [("a", 24, 4, 0), ("per", 12, 2, 0), ("per", 12, 2, 6)]
    assert acc["per"] == pytest.approx(by_hand(calls, 0.02), rel=1e-4)


def test_a_big_call_runs_at_once_and_a_full_batch_before_the_flush():
    lin, fn, _, proj = linear_projector(3)
    x = torch.randn(1, PENDING_ROWS, 4)
    proj.add((x,), lin(x).detach(), torch.randn(1, PENDING_ROWS, 4), 1)
    assert fn.runs == [("a", 1, 1, None)]  # the whole call, not its rows
    for _ in range(2):
        x = torch.randn(1, PENDING_ROWS // 2, 4)
        proj.add((x,), lin(x).detach(), torch.randn(1, PENDING_ROWS // 2, 4), 1)
    assert fn.runs[-1] == ("a", PENDING_ROWS, 2, None)  # full: run without waiting for flush


def test_conv_calls_join_by_feature_map_shape():
    torch.manual_seed(4)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    fn, acc = Recorder(), {"a": 0.0}
    proj = Projector("conv", conv, ("a",), fn, acc)
    calls = []
    for size in (4, 6, 4):
        calls.append(add_call(proj, conv, (2, 3, size, size), 2))
    proj.flush()
    assert sorted(r[1:3] for r in fn.runs) == [(2, 1), (4, 2)]  # 4x4 maps together, 6x6 alone
    assert acc["a"] == pytest.approx(by_hand(calls, 0.01), rel=1e-4)


def test_kept_calls_are_copies():
    # the model may reuse an activation buffer before the batch runs
    lin, _, acc, proj = linear_projector(5)
    x = torch.randn(2, 3, 4)
    y = lin(x).detach()
    g = torch.randn_like(y)
    want = by_hand([(y.clone(), g.clone(), 2)], 0.01)
    proj.add((x,), y, g, 2)
    y.zero_()
    g.zero_()
    proj.flush()
    assert acc["a"] == pytest.approx(want, rel=1e-4)


def test_kept_calls_of_all_modules_stay_under_their_budget():
    # Two modules share a budget of 8 kept calls' bytes (a call is kept when it is at most an
    # eighth of it): the ninth call kept makes both run what they kept; the tenth waits for
    # the flush. The projections are those of each call alone.
    torch.manual_seed(6)
    lins = [nn.Linear(4, 4), nn.Linear(4, 4)]
    one_call = (2 * 3 * 4) * 3 * 4  # x, y and g of a (2, 3, 4) call, fp32
    kept = KeptCalls(limit=8 * one_call)
    fns = [Recorder(), Recorder()]
    accs = [{"a": 0.0}, {"a": 0.0}]
    projs = [Projector(str(i), lins[i], ("a",), fns[i], accs[i], kept=kept) for i in range(2)]
    calls: list[list] = [[], []]
    for n in range(10):
        i = n % 2
        calls[i].append(add_call(projs[i], lins[i], (2, 3, 4), 2))
    assert [r[1:3] for r in fns[0].runs] == [(30, 5)]  # its five calls, at the ninth
    assert [r[1:3] for r in fns[1].runs] == [(24, 4)]
    assert kept.bytes == one_call  # the tenth
    for i in range(2):
        projs[i].flush()
        assert accs[i]["a"] == pytest.approx(by_hand(calls[i], 0.01), rel=1e-4)
    assert [r[1:3] for r in fns[1].runs] == [(24, 4), (6, 1)] and kept.bytes == 0


def test_a_call_too_big_to_keep_is_projected_at_once():
    # a few rows but many channels (a decoder's logits): no per-call overhead to save
    lin = nn.Linear(4, 1000)
    fn, acc = Recorder(), {"a": 0.0}
    proj = Projector("head", lin, ("a",), fn, acc, kept=KeptCalls(limit=8 * 4 * 2 * 1000 * 3))
    x = torch.randn(1, 3, 4)
    proj.add((x,), lin(x).detach(), torch.randn(1, 3, 1000), 1)
    assert fn.runs == [("a", 1, 1, None)]
