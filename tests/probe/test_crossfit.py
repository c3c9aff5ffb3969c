"""GPTQ candidates measured out of sample: input moments in two halves of the rows, each row
through the candidate fitted on the other half (opsnn_quant/probe/crossfit.py)."""

import torch
from torch import nn

from opsnn_quant.probe.crossfit import SplitMoments, crossfit_rows, row_halves
from opsnn_quant.probe.local import LocalProbe
from opsnn_quant.quant.functional import quantize_weight_per_channel
from opsnn_quant.quant.gptq import InputMoments, gptq_round


def _rows(n: int = 512, k: int = 24, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) @ (torch.randn(k, k, generator=g) * 0.3 + torch.eye(k))


def test_a_rows_half_is_a_function_of_its_values():
    x = _rows()
    halves = row_halves(x)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))
    assert torch.equal(row_halves(x[perm]), halves[perm])  # re-batched rows keep their half
    assert 0.4 < float(halves.float().mean()) < 0.6
    # values that came from fp16 (low mantissa bits zero) split too
    assert 0.4 < float(row_halves(x.half().float()).float().mean()) < 0.6


def test_split_moments_partition_the_rows_and_merge_to_all_of_them():
    x = _rows()
    split, whole = SplitMoments(24), InputMoments(24)
    split.collect(x[:200])
    split.collect(x[200:])
    whole.collect(x)
    a, b = split.halves
    assert a.rows + b.rows == 512 and a.rows == int((~row_halves(x)).sum())
    merged = split.merged()
    torch.testing.assert_close(merged.hessian(), whole.hessian(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged.mean(), whole.mean())
    assert split.fitted_for(0) is b and split.fitted_for(1) is a


def test_crossfit_runs_each_row_through_its_halfs_candidate():
    x = _rows(64).reshape(8, 8, 24)
    y = crossfit_rows(x, lambda half, rows: torch.full((rows.shape[0], 3), float(half)))
    assert y.shape == (8, 8, 3)
    assert torch.equal(y[..., 0].reshape(-1).bool(), row_halves(x.reshape(-1, 24)))


def test_a_conv_pixel_comes_from_the_candidate_of_its_im2col_rows_half():
    from torch.nn import functional as F

    from opsnn_quant.probe.crossfit import crossfit_pixels

    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(3))
    rows = F.unfold(x, 3, padding=1).transpose(1, 2).reshape(-1, 27)  # 2 x 36 output pixels
    y = crossfit_pixels(rows, lambda half: torch.full((2, 5, 6, 6), float(half)))
    assert y.shape == (2, 5, 6, 6)
    halves = row_halves(rows).view(2, 6, 6)
    assert 0 < int(halves.sum()) < 72  # both halves present
    for channel in range(5):
        assert torch.equal(y[:, channel].bool(), halves)


def test_the_probes_gptq_candidate_for_a_row_is_fitted_without_it():
    torch.manual_seed(0)
    fc = nn.Linear(24, 16)
    lp = LocalProbe("fc", fc, only=("w8a8_dynamic", "w8a8_dynamic_gptq"))
    x = _rows(seed=3)
    lp.collect(x)
    lp.decide()
    second = row_halves(x)
    # the candidate measuring half-0 rows: GPTQ of the weight on the Hessian of half 1 alone
    other = InputMoments(24)
    other.collect(x[second])
    _, scale = quantize_weight_per_channel(fc.weight.detach())
    want = gptq_round(fc.weight.detach(), scale, other.hessian())
    assert torch.equal(lp.shadow("w8a8_dynamic_gptq", 0).weight, want)
    with torch.no_grad():
        y = lp.candidate_output("w8a8_dynamic_gptq", (x,))
        assert torch.equal(y[~second], lp.shadow("w8a8_dynamic_gptq", 0)(x[~second]))
        assert torch.equal(y[second], lp.shadow("w8a8_dynamic_gptq", 1)(x[second]))
    # each scheme and half its own candidate (the plain one is not a GPTQ one's sibling)
    plain = lp.shadow("w8a8_dynamic")
    assert plain is not lp.shadow("w8a8_dynamic_gptq", 0)
    assert not torch.equal(plain.weight, lp.shadow("w8a8_dynamic_gptq", 0).weight)
    assert not torch.equal(lp.shadow("w8a8_dynamic_gptq", 1).weight, want)


def test_static_and_dynamic_gptq_candidates_of_one_half_share_their_integers():
    torch.manual_seed(0)
    lp = LocalProbe("fc", nn.Linear(24, 16), only=("w8a8_gptq", "w8a8_dynamic_gptq"))
    lp.collect(_rows(seed=4))
    lp.decide()
    static, dynamic = lp.shadow("w8a8_gptq", 0), lp.shadow("w8a8_dynamic_gptq", 0)
    # one GPTQ run (same weight, scales and Hessian): the same int8 storage
    assert static.weight.data_ptr() == dynamic.weight.data_ptr()
    assert lp.shadow("w8a8_dynamic_gptq", 1).weight.data_ptr() != dynamic.weight.data_ptr()
