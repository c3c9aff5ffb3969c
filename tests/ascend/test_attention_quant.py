"""FA3 per-head scales (msModelSlim) and K-mean smoothing (SageAttention): hand-computed values,
a transcription of msModelSlim's recall_window loop, the exact softmax invariance, and the int8
error that smoothing removes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opsnn_quant.ascend import (
    fa3_head_range,
    fa3_per_head_scale,
    fa3_quantize,
    npu_prompt_flash_attention,
    smooth_k,
)
from opsnn_quant.errors import ShapeError

EPS32 = float(np.finfo(np.float32).eps)


def test_per_head_scale_is_symmetric_min_max_over_127_with_eps_floor():
    lo = torch.tensor([-254.0, -1.0, 0.0, 3.0])
    hi = torch.tensor([127.0, 0.5, 0.0, 508.0])
    scale, offset = fa3_per_head_scale(lo, hi)
    assert scale.dtype == torch.float32 and scale.shape == (4, 1)
    assert offset.dtype == torch.int8 and offset.shape == (4, 1) and not bool(offset.any())
    # max(254, 127) / 127 = 2; 1/127 in fp32; all-zero head -> fp32 eps; min clipped at 0 -> 508/127
    assert scale.squeeze(1).tolist() == [2.0, float(np.float32(1) / np.float32(127)), EPS32, 4.0]


def test_per_head_scale_is_computed_in_the_calibration_dtype():
    # msModelSlim divides in min_val's dtype: 1/127 in bf16 is 0.00787353515625, then widened.
    scale, _ = fa3_per_head_scale(
        torch.tensor([-1.0], dtype=torch.bfloat16), torch.zeros(1).bfloat16()
    )
    assert scale.item() == 0.00787353515625 != float(np.float32(1) / np.float32(127))


def test_quantize_divides_by_the_head_scale_rounds_half_even_and_saturates():
    x = torch.tensor([1.0, 3.0, 5.0, -1.0, 300.0, -300.0]).reshape(1, 1, 1, 6)
    x = torch.cat([x, x], dim=1)  # two heads
    q = fa3_quantize(x, torch.tensor([[2.0], [1.0]]))
    assert q.dtype == torch.int8
    assert q[0, 0, 0].tolist() == [0, 2, 2, 0, 127, -128]  # 0.5, 1.5, 2.5, -0.5, 150, -150
    assert q[0, 1, 0].tolist() == [1, 3, 5, -1, 127, -128]


def recall_window_loop(rows: torch.Tensor, ratio: float):
    """Transcription of msModelSlim core/observer/recall_window.py recall_window (dim=-1)."""
    ordered, _ = torch.sort(rows, dim=-1)
    n = rows.shape[-1]
    t = int(ratio * n)
    lo, hi = [], []
    for head in ordered:
        best, window = float("inf"), (0.0, 0.0)
        for i in range(n - t + 1):
            start, end = head[i].item(), head[i + t - 1].item()
            if end - start < best:
                best, window = end - start, (start, end)
        lo.append(window[0])
        hi.append(window[1])
    return torch.tensor(lo, dtype=rows.dtype), torch.tensor(hi, dtype=rows.dtype)


def test_head_range_windows_by_hand_and_against_the_observer_loop():
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 100.0], [4.0, -50.0, 1.0, 2.0, 3.0]]).reshape(1, 2, 1, 5)
    lo, hi = fa3_head_range(x, ratio=0.8)  # 4 of 5 values: the narrower window drops the outlier
    assert lo.tolist() == [0.0, 1.0] and hi.tolist() == [3.0, 4.0]
    lo, hi = fa3_head_range(torch.tensor([0.0, 1.0, 2.0]).reshape(1, 1, 1, 3), ratio=0.67)
    assert (lo.item(), hi.item()) == (0.0, 1.0)  # two windows of width 1: the first wins
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 20, 8, generator=g).bfloat16()
    for ratio in (1.0, 0.9999, 0.9):
        got = fa3_head_range(x, ratio)
        want = recall_window_loop(x.view(3, -1), ratio)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_head_range_reproduces_the_observer_view_for_batches():
    # msModelSlim views (B, H, S, D) as (H, -1): per head only for B = 1.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2, 4, 8, generator=g)
    lo, hi = fa3_head_range(x)
    assert lo.tolist() == [x[0].min().item(), x[1].min().item()]  # rows are whole batches
    assert hi.tolist() == [x[0].max().item(), x[1].max().item()]
    lo1, _ = fa3_head_range(x[:1])
    assert lo1.tolist() == [x[0, 0].min().item(), x[0, 1].min().item()]


def test_fa3_refusals():
    with pytest.raises(ShapeError, match="ratio"):
        fa3_head_range(torch.zeros(1, 1, 1, 3), ratio=0.2)
    with pytest.raises(ShapeError, match=r"\(B, H, S, D\)"):
        fa3_head_range(torch.zeros(2, 3))
    with pytest.raises(ShapeError, match="scale"):
        fa3_quantize(torch.zeros(1, 2, 1, 4), torch.ones(3, 1))
    with pytest.raises(ShapeError, match="positive"):
        fa3_quantize(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1))
    with pytest.raises(ShapeError, match="min_val"):
        fa3_per_head_scale(torch.zeros(2), torch.zeros(3))


def test_smooth_k_subtracts_the_token_mean_in_the_keys_dtype():
    k = torch.tensor([[1.0, 10.0], [3.0, 14.0]]).reshape(1, 1, 2, 2)
    smoothed, km = smooth_k(k)
    assert km.tolist() == [[[[2.0, 12.0]]]] and smoothed.reshape(2, 2).tolist() == [
        [-1.0, -2.0],
        [1.0, 2.0],
    ]
    kb = k.bfloat16()
    s_b, km_b = smooth_k(kb, seq_dim=2)
    assert s_b.dtype == km_b.dtype == torch.bfloat16
    with pytest.raises(ShapeError, match="token axis"):
        smooth_k(k, seq_dim=4)


def test_smoothing_leaves_softmax_unchanged_in_exact_arithmetic():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 6, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 9, 16, generator=g, dtype=torch.float64) + 5.0
    smoothed, _ = smooth_k(k)
    p = torch.softmax(q @ k.transpose(-1, -2), -1)
    p_s = torch.softmax(q @ smoothed.transpose(-1, -2), -1)
    torch.testing.assert_close(p_s, p, rtol=1e-12, atol=1e-15)


def int8_pfa_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ref: torch.Tensor) -> float:
    """Max error of the A2 int8 PFA (per-tensor max-abs scales, P * 127) against ``ref``."""
    sq, sk, sv = (t.abs().max() / 127 for t in (q, k, v))
    qi, ki, vi = (torch.round(t / s).to(torch.int8) for t, s in ((q, sq), (k, sk), (v, sv)))
    out = npu_prompt_flash_attention(
        qi, ki, vi, deq_scale1=(sq * sk).reshape(1), quant_scale1=torch.tensor([127.0]),
        deq_scale2=(sv / 127).reshape(1), num_heads=q.shape[1], scale_value=0.25,
        input_layout="BNSD",
    )  # fmt: skip
    return (out.float() - ref).abs().max().item()


def test_smoothing_shrinks_the_int8_error_on_a_key_with_a_common_offset():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 32, 32, generator=g)
    k = torch.randn(1, 2, 64, 32, generator=g) + 20.0  # a large offset shared by every token
    v = torch.randn(1, 2, 64, 32, generator=g)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.25)
    smoothed, _ = smooth_k(k)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, smoothed, v, scale=0.25), ref)
    raw_err = int8_pfa_error(q, k, v, ref)
    smooth_err = int8_pfa_error(q, smoothed, v, ref)
    # The raw K's int8 step is ~7x coarser (range ~24 vs ~3.5); what is left after smoothing is
    # mostly P's 1/127 step.
    assert smooth_err < 0.5 * raw_err
