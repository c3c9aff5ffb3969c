"""SmoothQuant: migration formula, reservoir determinism and the alpha search."""

import torch

from opsnn_quant.quant.smoothquant import ChannelStats, layer_error, search_alpha, smoothing_factors


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


def test_reservoir_matches_a_sequential_reservoir_with_duplicate_slots():
    cap, seed = 8, 5
    x = torch.arange(3000, dtype=torch.float32).reshape(1000, 3)
    st = ChannelStats(3, reservoir=cap, seed=seed)
    st.collect(x)
    # the same draws, applied one row at a time (many rows draw the same slot here)
    g = torch.Generator().manual_seed(seed)
    rows = x[:cap].clone()
    rest = x[cap:]
    idx = cap + torch.arange(1, rest.shape[0] + 1)
    slots = (torch.rand(rest.shape[0], generator=g) * idx).long()
    for row, slot in zip(rest, slots.tolist(), strict=True):
        if slot < cap:
            rows[slot] = row
    assert torch.equal(st.rows, rows)
