"""Observers: streaming statistics and their int8 parameters against known formulas."""

import math

import numpy as np
import pytest
import torch

from opsnn_quant.errors import CalibrationError
from opsnn_quant.quant.observers import (
    HistogramObserver,
    KLObserver,
    MinMaxObserver,
    MSEObserver,
    PercentileObserver,
    make_observer,
    qparams_from_range,
)


def test_qparams_symmetric_and_asymmetric():
    assert qparams_from_range(-2.0, 1.27, True) == (2.0 / 127, 0.0)
    scale, offset = qparams_from_range(0.0, 2.55, False)  # all-positive: 0 maps to -128
    assert scale == pytest.approx(0.01)
    assert offset == -128.0
    scale, offset = qparams_from_range(-1.0, 1.55, False)
    assert scale == pytest.approx(0.01)
    assert offset == -28.0  # -128 - (-1.0 / 0.01)


def test_minmax_streams_over_batches_and_resets():
    obs = MinMaxObserver()
    obs.collect(torch.tensor([-1.0, 0.5]))
    obs.collect(torch.tensor([3.0]))
    assert (obs.min, obs.max) == (-1.0, 3.0)
    assert obs.compute(True).scale == pytest.approx(3.0 / 127)
    obs.reset()
    with pytest.raises(CalibrationError, match="no data"):
        obs.compute()


def test_nan_is_rejected():
    with pytest.raises(CalibrationError, match="NaN or Inf"):
        MinMaxObserver().collect(torch.tensor([1.0, float("inf")]))


def test_histogram_grows_by_doubling_and_keeps_every_count():
    obs = PercentileObserver()
    obs.collect(torch.full((100,), 0.5))
    obs.collect(torch.full((50,), -3.0))  # forces the range 0.5 -> 1 -> 2 -> 4
    assert obs.radius == 4.0
    assert obs.hist.sum() == 150
    centers = obs.centers()
    assert abs(centers[np.argmax(obs.hist)] - 0.5) <= obs.bin_width
    assert obs.abs_hist().sum() == 150


def test_percentile_clips_a_rare_outlier():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(100_000, generator=g) * 2 - 1  # uniform [-1, 1]
    x[0] = 50.0
    obs = PercentileObserver(99.9)
    obs.collect(x)
    scale, _ = obs.compute(True)
    assert 0.99 / 127 < scale < 1.1 / 127  # the outlier is ignored
    assert MinMaxObserver().compute.__self__ is not None


@pytest.mark.parametrize("n", [1000, 200_003])  # whole, and over max_samples (strided subset)
def test_collect_abs_is_collect_of_the_absolute_values(n):
    g = torch.Generator().manual_seed(1)
    calls = [torch.randn(n, generator=g) * s for s in (1.0, 7.0, 0.5)]
    whole, direct = PercentileObserver(99.9), PercentileObserver(99.9)
    for x in calls:
        whole.collect(x.abs())
        direct.collect_abs(x, float(x.abs().max()))
    assert np.array_equal(whole.hist, direct.hist) and whole.radius == direct.radius
    assert whole.count == direct.count and whole.max == direct.max
    assert whole.compute(True) == direct.compute(True)


def _quant_mse(x: torch.Tensor, name: str) -> tuple[float, float]:
    obs = make_observer(name)
    obs.collect(x)
    scale, offset = obs.compute(True)
    q = torch.clamp(torch.round(x / scale + offset), -128, 127)
    return scale * 127, float(((q - offset) * scale - x).pow(2).mean())


def test_clipping_observers_beat_minmax_on_laplace(monkeypatch):
    # the algorithms themselves, on every sample (no strided subsampling)
    monkeypatch.setattr(HistogramObserver, "max_samples", 10**7)
    torch.manual_seed(0)
    x = torch.distributions.Laplace(0.0, 1.0).sample((200_000,))
    clip_minmax, err_minmax = _quant_mse(x, "minmax")
    clip_mse, err_mse = _quant_mse(x, "mse")
    _, err_kl = _quant_mse(x, "kl")
    assert err_mse < 0.85 * err_minmax
    assert err_kl < 0.95 * err_minmax
    # ACIQ (Banner et al.): the MSE-optimal 8-bit clip of Laplace(b=1) is about 9.89
    assert 9.0 < clip_mse < 10.5 < clip_minmax


def test_mse_symmetric_range_is_a_ratio_of_absmax():
    obs = MSEObserver()
    obs.collect(torch.linspace(-1, 1, 1001))
    scale, offset = obs.compute(True)
    assert offset == 0.0
    assert 0.3 / 127 <= scale <= 1.0 / 127 + 1e-9


def _mse_range_one_ratio_at_a_time(obs: MSEObserver, symmetric: bool) -> tuple[float, float]:
    """The MSE search written out ratio by ratio (qparams_from_range, then the modelled error of
    the histogram: clipped values' squared distance plus scale^2 / 12), the first best kept."""
    v, c = obs.centers(), obs.hist
    v, c = v[c > 0], c[c > 0]
    lo0, hi0 = min(obs.min, 0.0), max(obs.max, 0.0)
    best, best_err = (lo0, hi0), math.inf
    for r in obs.ratios:
        lo, hi = lo0 * r, hi0 * r
        if symmetric:
            lo, hi = -max(-lo, hi), max(-lo, hi)
        scale, offset = qparams_from_range(lo, hi, symmetric)
        clip = np.clip(v, (-128 - offset) * scale, (127 - offset) * scale)
        err = float(np.sum(c * ((v - clip) ** 2 + scale**2 / 12.0)))
        if err < best_err:
            best, best_err = (lo, hi), err
    return best


def test_mse_search_of_all_ratios_at_once_equals_the_search_ratio_by_ratio():
    gen = torch.Generator().manual_seed(3)
    batches = [
        torch.randn(5000, generator=gen),
        ((torch.rand(20_000, generator=gen) - 0.5) * 3.1).tan(),  # Cauchy-like tails
        torch.rand(3000, generator=gen) * 7 + 0.5,  # all positive
        torch.randn(4000, generator=gen) * 0.01 - 2.0,  # all negative, narrow
        torch.cat([torch.randn(100_000, generator=gen), torch.tensor([900.0])]),  # one outlier
        torch.zeros(64),
    ]
    for x in batches:
        obs = MSEObserver()
        for part in x.chunk(3):
            obs.collect(part)
        for symmetric in (True, False):
            assert obs._range(symmetric) == _mse_range_one_ratio_at_a_time(obs, symmetric)


def test_kl_asymmetric_stays_inside_observed_range():
    obs = KLObserver()
    obs.collect(torch.rand(10_000) * 3)  # [0, 3)
    scale, offset = obs.compute(False)
    assert scale <= 3.0 / 255 + 1e-9
    assert offset == -128.0  # the range starts at 0


def test_large_batches_are_subsampled_but_counted_in_elements():
    obs = PercentileObserver()
    x = torch.linspace(-1, 1, 200_001)
    obs.collect(x)
    # every 4th element (ceil(200001 / 65536) = 4), 50001 of them, each counted 4 times: whole
    # counts, so that histograms of shares of the data add up exactly
    assert obs.hist.sum() == 4 * 50_001
    assert (obs.min, obs.max) == (-1.0, 1.0)  # exact, not from the subsample


def test_bins_are_exact_powers_of_two_hand_computed():
    from opsnn_quant.quant.observers import bin_counts

    # radius 1, 4 bins of width 0.5: bin floor(x / 0.5) + 2
    x = torch.tensor([-1.0, -0.5, -1e-30, 0.0, 0.49, 0.5, 0.999])
    assert bin_counts(x, 1.0, 4).tolist() == [1.0, 2.0, 2.0, 2.0]
    # the same values on the doubled grid are the pairs merged (radius 2: width 1)
    assert bin_counts(x, 2.0, 4).tolist() == [0.0, 3.0, 4.0, 0.0]


def test_the_first_radius_is_the_power_of_two_above_the_absmax():
    obs = PercentileObserver()
    obs.collect(torch.tensor([-3.0, 2.0]))
    assert obs.radius == 4.0
    obs.collect(torch.tensor([4.0]))  # |x| must stay below the radius: doubled
    assert obs.radius == 8.0


@pytest.mark.parametrize("kind", ["minmax", "percentile", "mse", "kl"])
def test_observers_of_shares_merge_into_the_observer_of_all_the_data(kind):
    g = torch.Generator().manual_seed(1)
    # batches of growing range (the histograms double between them), one over max_samples
    batches = [torch.randn(n, generator=g) * s for n, s in ((500, 0.1), (70_000, 3.0), (900, 40.0))]
    whole = make_observer(kind)
    for b in batches:
        whole.collect(b)
    for cut in (1, 2):
        first, second = make_observer(kind), make_observer(kind)
        for b in batches[:cut]:
            first.collect(b)
        for b in batches[cut:]:
            second.collect(b)
        # either way round: a histogram merges onto the larger grid
        for a, b in ((first, second), (second, first)):
            merged = make_observer(kind)
            merged.merge(a)
            merged.merge(b)
            assert (merged.count, merged.min, merged.max) == (whole.count, whole.min, whole.max)
            if kind != "minmax":
                assert merged.radius == whole.radius  # type: ignore[attr-defined]
                assert np.array_equal(merged.hist, whole.hist)  # type: ignore[attr-defined]
            for symmetric in (True, False):
                assert merged.compute(symmetric) == whole.compute(symmetric)
