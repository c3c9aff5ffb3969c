"""SmoothQuant: migration formula, reservoir determinism and the alpha search."""

import pytest
import torch

from opsnn_quant.core.stream import at_batch, priorities
from opsnn_quant.quant.smoothquant import (
    ChannelStats,
    layer_error,
    search_alpha,
    search_alphas,
    smoothing_factors,
)


def test_smoothing_factor_formula():
    s = smoothing_factors(torch.tensor([16.0, 1.0, 0.0]), torch.tensor([4.0, 1.0, 2.0]), 0.5)
    assert s.tolist() == [2.0, 1.0, 1.0]  # sqrt(16)/sqrt(4); 1/1; zero channel -> 1
    s = smoothing_factors(torch.tensor([8.0]), torch.tensor([2.0]), 1.0)
    assert s.tolist() == [8.0]


def test_reservoir_is_deterministic_and_bounded():
    def run():
        st = ChannelStats(4, reservoir=16, seed=3)
        for i in range(10):
            st.collect(torch.arange(40, dtype=torch.float32).reshape(10, 4) + 100 * i)
        return st

    a, b = run(), run()
    assert a.rows is not None and a.rows.shape == (16, 4)
    assert torch.equal(a.rows, b.rows)
    assert a.seen == 100
    assert a.absmax.tolist() == [936.0, 937.0, 938.0, 939.0]


def test_search_prefers_smoothing_for_an_outlier_channel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, generator=g)
    x[:, 5] *= 50.0
    w = torch.randn(16, 32, generator=g)
    st = ChannelStats(32)
    st.collect(x)
    alpha, s, err = search_alpha(st, w, dynamic=False, alphas=(0.3, 0.5, 0.7))
    assert alpha is not None and s is not None
    assert err < 0.5 * layer_error(x, w, None, dynamic=False)
    # the smoothed product is the float product unchanged
    assert torch.allclose((x / s) @ (w * s).T, x @ w.T, rtol=1e-4, atol=1e-3)


def test_reservoir_keeps_the_rows_of_smallest_priority_in_their_order():
    cap, seed = 8, 5
    x = torch.arange(3000, dtype=torch.float32).reshape(1000, 3)
    st = ChannelStats(3, reservoir=cap, seed=seed)
    st.collect(x)  # outside a loop: batch 0, the first call
    # bottom-k: each row's draw from the generator seeded by (seed, batch 0, call 1)
    drawn = priorities(seed, (0, 1), 1000)
    keep = sorted(torch.argsort(drawn)[:cap].tolist())
    assert torch.equal(st.rows, x[keep])
    assert st.seen == 1000


def test_reservoir_of_shares_merges_into_the_reservoir_of_all_the_data():
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(40 + 9 * i, 6, generator=gen) for i in range(5)]

    def over(indices: range) -> ChannelStats:
        st = ChannelStats(6, reservoir=16, seed=3)
        for i in indices:
            with at_batch(i):
                st.collect(batches[i])
                st.collect(batches[i] * 2)  # two calls a batch (call ordinals 1 and 2)
        return st

    whole = over(range(5))
    first, second, third = over(range(2)), over(range(2, 3)), over(range(3, 5))
    first.merge(second)
    first.merge(third)
    assert torch.equal(first.rows, whole.rows)
    assert torch.equal(first.absmax, whole.absmax)
    assert first.seen == whole.seen == 2 * sum(b.shape[0] for b in batches)


def _reference_alpha(stats, weight, dynamic, alphas):
    """The alpha search as it was computed before it moved to the device: every product and
    sum in float64 from the fp32 fake-quantized operands, the reference recomputed per alpha.
    (The formula of quant/smoothquant.py at commit dffd56c, kept here as the expectation.)"""
    import math

    from opsnn_quant.quant.smoothquant import (
        _sig,
        fake_quant_activation,
        fake_quant_weight,
        smoothing_factors,
    )

    def err(x, w, s):
        ref = x.double() @ w.double().T
        xs, ws = (x, w) if s is None else (x / s, w * s)
        out = fake_quant_activation(xs, dynamic).double() @ fake_quant_weight(ws).double().T
        return _sig(float((out - ref).pow(2).sum()) / max(float(ref.pow(2).sum()), 1e-300))

    x, w = stats.rows, weight.detach().float()
    best = (None, err(x, w, None))
    for alpha in alphas:
        e = err(x, w, smoothing_factors(stats.absmax, w.abs().amax(dim=0), alpha))
        if e < best[1] and math.isfinite(e):
            best = (float(alpha), e)
    return best[0]


@pytest.mark.slow
def test_the_device_search_chooses_the_same_alphas_on_the_zoo_models():
    # Every Linear of the two zoo recipes' models, on their own calibration data: the fp32
    # search with one reference per layer picks exactly the alpha the float64 search picked.
    from torch import nn

    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.quant.spec import DEFAULT_ALPHA_GRID

    cases = [
        (
            "diffusers-sd",
            "zoo:shapes-t2i",
            {"steps": 2, "batch_size": 2},
            "zoo:shapes/calibration",
            2,
        ),
        (
            "whisper",
            "zoo:whisper-tiny.en",
            {"batch_size": 1, "max_new_tokens": 8},
            "zoo:speech/eval",
            1,
        ),
    ]
    compared = 0
    for family, source, settings, data, n in cases:
        adapter = load_adapter(family, source, **settings)
        linears = {k: m for k, m in adapter.model.named_modules() if isinstance(m, nn.Linear)}
        stats = {k: ChannelStats(m.in_features) for k, m in linears.items()}
        hooks = [
            m.register_forward_hook(lambda mod, a, o, st=stats[k]: st.collect(a[0]))
            for k, m in linears.items()
        ]
        try:
            adapter.forward_loop(load_records(data, n))(adapter.model)
        finally:
            for h in hooks:
                h.remove()
        for k, m in linears.items():
            if stats[k].seen == 0:
                continue
            # both modes searched together (what pass 1 runs): each the same as its own search
            both = search_alphas(stats[k], m.weight, (False, True), DEFAULT_ALPHA_GRID)
            for dynamic, joint in zip((False, True), both, strict=True):
                got, _, err = search_alpha(stats[k], m.weight, dynamic, DEFAULT_ALPHA_GRID)
                want = _reference_alpha(stats[k], m.weight, dynamic, DEFAULT_ALPHA_GRID)
                assert got == want, (source, k, dynamic)
                assert (joint[0], joint[2]) == (got, err), (source, k, dynamic)
                compared += 1
    assert compared > 200


def test_a_small_layer_s_stacked_search_chooses_as_one_search_per_candidate(monkeypatch):
    # A small layer's alphas are searched as one batch; with the batch ruled out (a block size
    # of 1 element) every candidate runs alone through layer_errors. Same choices and errors,
    # static and dynamic, on a layer with an outlier channel (so smoothing is chosen).
    import opsnn_quant.quant.smoothquant as sq
    from opsnn_quant.quant.spec import DEFAULT_ALPHA_GRID

    g = torch.Generator().manual_seed(3)
    x = torch.randn(96, 32, generator=g)
    x[:, 5] *= 40.0
    w = torch.randn(24, 32, generator=g)
    st = ChannelStats(32, reservoir=96)
    st.collect(x)
    stacked = search_alphas(st, w, (False, True), DEFAULT_ALPHA_GRID)
    monkeypatch.setattr(sq, "WEIGHT_BLOCK_ELEMENTS", 1)
    alone = search_alphas(st, w, (False, True), DEFAULT_ALPHA_GRID)
    for (a1, s1, e1), (a2, s2, e2) in zip(stacked, alone, strict=True):
        assert a1 is not None and a1 == a2 and e1 == e2 and torch.equal(s1, s2)
