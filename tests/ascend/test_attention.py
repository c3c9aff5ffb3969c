"""npu_prompt_flash_attention / npu_fused_infer_attention_score(_v2): hand-computed int8 cases, a
numpy golden of the A2 kernel's half pipeline, op-plugin's goldens, SDPA for the float path, and
the refusals of the op docs and tilings."""

import math
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opsnn_quant.ascend import (
    ascend_quant_fp16,
    fp16_round_away,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
    npu_prompt_flash_attention,
    npu_trans_quant_param,
)
from opsnn_quant.ascend import attention as attention_mod
from opsnn_quant.ascend.attention import (
    deq_scale_value,
    float_attention_bnsd,
    int8_attention_bnsd,
    int8_kv_block,
)
from opsnn_quant.errors import ShapeError

F16 = np.float16
F32 = np.float32
ONE = torch.ones(1)


def _u64(packed: torch.Tensor) -> torch.Tensor:
    return packed.view(torch.uint64)


# --- rounding helpers ---------------------------------------------------------------------------


def f16_away_np(x):
    """Golden: fp32 -> fp16 round to nearest, ties away from zero (AscendC CAST_ROUND), from
    numpy's RNE conversion and the neighbour on the other side of x."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore"):
        y = x.astype(F16)
    toward = np.where(x.astype(np.float64) > y.astype(np.float64), F16(np.inf), F16(-np.inf))
    other = np.nextafter(y, toward.astype(F16))
    d0 = np.abs(x.astype(np.float64) - y.astype(np.float64))
    d1 = np.abs(x.astype(np.float64) - other.astype(np.float64))
    away = np.where(np.abs(other.astype(np.float64)) > np.abs(y.astype(np.float64)), other, y)
    return np.where((d0 == d1) & (d0 > 0) & np.isfinite(y), away, y)


def test_fp16_round_away_breaks_ties_away_from_zero():
    ulp = 2.0**-10
    cases = {
        1 + ulp / 2: 1 + ulp,  # tie: nearest-even would give 1.0
        -(1 + ulp / 2): -(1 + ulp),
        1 + 3 * ulp / 2: 1 + 2 * ulp,  # tie, the even neighbour is also away
        1 + ulp / 2 - 2.0**-20: 1.0,  # not a tie
        2.0**-25: 2.0**-24,  # subnormal tie (nearest-even: 0)
        2.5 * 2.0**-24: 3 * 2.0**-24,  # subnormal tie (nearest-even: 2 * 2**-24)
        65519.0: 65504.0,
        65520.0: math.inf,  # tie at the top rounds away: overflow
    }
    x = torch.tensor(list(cases), dtype=torch.float32)
    got = fp16_round_away(x)
    assert got.dtype == torch.float16
    assert got.float().tolist() == list(cases.values())
    special = fp16_round_away(torch.tensor([math.inf, -math.inf, math.nan, -0.0]))
    assert special[:2].tolist() == [math.inf, -math.inf] and math.isnan(special[2].item())
    assert math.copysign(1.0, special[3].item()) == -1.0


def test_fp16_round_away_matches_the_golden_on_random_fp32():
    g = np.random.default_rng(0)
    x = (g.standard_normal(20000) * np.exp2(g.integers(-30, 16, 20000))).astype(F32)
    got = fp16_round_away(torch.from_numpy(x)).numpy()
    want = f16_away_np(x)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_ascend_quant_fp16_multiplies_in_half_then_rounds_to_even():
    x = torch.tensor([2.5, 3.5, -2.5, 0.3, 200.0, -300.0], dtype=torch.float16)
    one = torch.tensor(1.0, dtype=torch.float16)
    assert ascend_quant_fp16(x, one).tolist() == [2, 4, -2, 0, 127, -128]
    # 2.498046875 * (1 + 2**-10) = 2.50048... : rint in fp32 gives 3, the half product is 2.5 -> 2
    x = torch.tensor([2.498046875], dtype=torch.float16)
    s = torch.tensor(1 + 2.0**-10, dtype=torch.float16)
    assert ascend_quant_fp16(x, s).tolist() == [2]
    assert round(2.498046875 * (1 + 2.0**-10)) == 3
    # offset added in half before the rounding: 1.5 + 0.5 = 2, 2.0 + 0.5 = 2.5 -> 2
    half = torch.tensor(0.5, dtype=torch.float16)
    x = torch.tensor([1.5, 2.0], dtype=torch.float16)
    assert ascend_quant_fp16(x, one, half).tolist() == [2, 2]


def test_both_deq_scale_forms_give_the_fp19_truncated_scale():
    s = 0.1234567
    bits = struct.unpack("<I", struct.pack("<f", s))[0] & 0xFFFFE000
    want = struct.unpack("<f", struct.pack("<I", bits))[0]
    as_float = deq_scale_value(torch.tensor([s]))
    as_u64 = deq_scale_value(_u64(npu_trans_quant_param(torch.tensor([s]))))
    assert as_float.item() == as_u64.item() == want != np.float32(s)


# --- the int8 path: hand-computed, op-plugin's golden, numpy golden ------------------------------


def hand_case():
    """D=32, S1=3, S2=4. Q K^T = [[1,1,0,0],[0,0,1,0],[1,1,1,0]]; with scale 64 the exps are 1 or
    below 2**-25 (P = 0 in fp16), so every step is exact: P_q = 127 or 0, deq_scale2 = 2**-7."""
    q = torch.zeros(1, 1, 3, 32, dtype=torch.int8)
    q[0, 0, 0, 0] = q[0, 0, 1, 1] = q[0, 0, 2, 0] = q[0, 0, 2, 1] = 1
    k = torch.zeros(1, 1, 4, 32, dtype=torch.int8)
    k[0, 0, 0, 0] = k[0, 0, 1, 0] = k[0, 0, 2, 1] = 1
    v = torch.zeros(1, 1, 4, 32, dtype=torch.int8)
    for j in range(4):
        v[0, 0, j, :3] = torch.tensor([j + 1, -(j + 1), 2 * (j + 1)])
    return q, k, v


HAND_ROWS = [381 / 256, 381 / 128, 254 / 128]  # 127*(1+2)/128/2, 127*3/128/1, 127*6/128/3


@pytest.mark.parametrize("deq_form", ["float32", "uint64"])
def test_int8_hand_computed_case_is_exact(deq_form):
    q, k, v = hand_case()
    deq2 = torch.tensor([2.0**-7])
    deq1 = ONE
    if deq_form == "uint64":
        deq1, deq2 = _u64(npu_trans_quant_param(deq1)), _u64(npu_trans_quant_param(deq2))
    out = npu_prompt_flash_attention(
        q, k, v, deq_scale1=deq1, quant_scale1=torch.tensor([127.0]), deq_scale2=deq2,
        num_heads=1, scale_value=64.0, input_layout="BNSD",
    )  # fmt: skip
    assert out.dtype == torch.float16 and out.shape == (1, 1, 3, 32)
    want = torch.zeros(3, 32)
    for i, r in enumerate(HAND_ROWS):
        want[i, :3] = torch.tensor([r, -r, 2 * r])
    assert torch.equal(out[0, 0].float(), want)
    # The same case in blocks of 2 keys: row 1 sees [0, 0] first (P_q 127, 127), then 64 raises the
    # max and exp(-64) rounds to 0 in half: the first block is rescaled away, exactly.
    out2, _ = int8_attention_bnsd(q, k, v, deq1, torch.tensor([127.0]), deq2, 64.0, kv_block=2)
    assert torch.equal(out2[0, 0].float(), want)


def test_int8_output_quantizes_in_half_per_tensor_and_per_channel():
    q, k, v = hand_case()
    kw = dict(
        deq_scale1=ONE, quant_scale1=torch.tensor([127.0]), deq_scale2=torch.tensor([2.0**-7])
    )
    out = npu_prompt_flash_attention(
        q, k, v, quant_scale2=torch.tensor([2.0]), quant_offset2=torch.tensor([1.0]),
        num_heads=1, scale_value=64.0, input_layout="BNSD", **kw,
    )  # fmt: skip
    assert out.dtype == torch.int8
    # 2 * 381/256 + 1 = 3.9765625 -> 4; 2 * 381/128 + 1 = 6.953125 -> 7; 254/64 + 1 = 4.96875 -> 5
    assert out[0, 0, :, :3].tolist() == [[4, -2, 7], [7, -5, 13], [5, -3, 9]]
    per_ch = torch.ones(1, 1, 1, 32)
    per_ch[..., 1] = 0.5
    out = npu_prompt_flash_attention(
        q, k, v, quant_scale2=per_ch, num_heads=1, scale_value=64.0, input_layout="BNSD", **kw
    )
    # column 1 is -r * 0.5: -0.744 -> -1, -1.488 -> -1, -0.992 -> -1; column 2 is 2r
    assert out[0, 0, :, :3].tolist() == [[1, -1, 3], [3, -1, 6], [2, -1, 4]]


def test_op_plugin_fullquant_golden_all_ones():
    # op-plugin test/test_custom_ops/test_npu_fused_infer_attention_score.py l.231-254: int8 ones,
    # scales 1, scale = 1/0.0078125, Q_S = 2, KV_S = 2048 (two 1024-key blocks): output ones.
    q = torch.ones(1, 32, 2, 128, dtype=torch.int8)
    k = torch.ones(1, 32, 2048, 128, dtype=torch.int8)
    out, lse = npu_fused_infer_attention_score(
        q, k, k.clone(), dequant_scale1=ONE, dequant_scale2=ONE, quant_scale1=ONE,
        quant_scale2=ONE, num_heads=32, input_layout="BNSD", scale=1 / 0.0078125,
        pre_tokens=65535, next_tokens=65535,
    )  # fmt: skip
    assert out.dtype == torch.int8 and out.shape == (1, 32, 2, 128)
    assert bool((out == 1).all()) and lse.shape == (0,)
    out16 = npu_prompt_flash_attention(
        q, k, k.clone(), deq_scale1=ONE, deq_scale2=ONE, quant_scale1=ONE, num_heads=32,
        input_layout="BNSD", scale_value=128.0, pre_tokens=65535, next_tokens=65535,
    )  # fmt: skip
    assert out16.dtype == torch.float16 and bool((out16 == 1).all())


def kernel_golden_np(q, k, v, deq1, qs1, deq2, scale, mask, block):
    """Golden of the X910 int8 pipeline in numpy half arithmetic (module docstring of
    opsnn_quant/ascend/attention.py; op_kernel/prompt_flash_attention_s1s2_bns1_x910.h
    Res1VecCompute/Bmm1ResDoVecBmm2Compute, SoftmaxFlashV2 update impl, AscendQuant).
    exp and the fp32 row sums use torch, the assumed stand-ins of the vector unit's."""
    scale_h = F16(F32(scale))
    qs1_h = F16(F32(qs1))
    acc = q.astype(np.int64) @ np.swapaxes(k, -1, -2).astype(np.int64)
    out = m = l_sum = None
    for k0 in range(0, k.shape[-2], block):
        s = (acc[..., k0 : k0 + block].astype(F32) * F32(deq1)).astype(F16)
        s = (s * scale_h).astype(F16)
        if mask is not None:
            s = np.where(mask[..., k0 : k0 + block], F16(-65504), s)
        x = torch.from_numpy(s.astype(F32))
        m_new = (
            x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        )
        e = torch.exp(x - m_new)
        p = f16_away_np(e.numpy())
        pq = np.clip(np.rint((p * qs1_h).astype(F16).astype(F32)), -128, 127).astype(np.int64)
        oc = ((pq @ v[..., k0 : k0 + block, :].astype(np.int64)).astype(F32) * F32(deq2)).astype(
            F16
        )
        if out is None:
            out, l_sum = oc, e.sum(-1, keepdim=True)
        else:
            alpha = torch.exp(m - m_new)
            l_sum = alpha * l_sum + e.sum(-1, keepdim=True)
            out = ((out * f16_away_np(alpha.numpy())).astype(F16) + oc).astype(F16)
        m = m_new
    return (out / f16_away_np(l_sum.numpy())).astype(F16)


@pytest.mark.parametrize(
    ("block", "qs1", "chunk"),
    [(1024, 127.0, None), (24, 127.0, None), (24, 127.0, 24 * 5), (24, 5000.0, 24 * 5),
     (1024, -3.0, 70 * 40)],
)  # fmt: skip
def test_int8_path_is_bit_exact_to_the_kernel_golden(block, qs1, chunk, monkeypatch):
    # chunk: the reference's rows per step forced small (several row and head chunks); a
    # quant_scale1 past the P shortcut's bound, or negative, takes the general rounding.
    if chunk is not None:
        monkeypatch.setattr(attention_mod, "ROW_CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(11)
    q = torch.randint(-128, 128, (2, 2, 17, 64), generator=g, dtype=torch.int8)
    k = torch.randint(-128, 128, (2, 2, 70, 64), generator=g, dtype=torch.int8)
    v = torch.randint(-128, 128, (2, 2, 70, 64), generator=g, dtype=torch.int8)
    mask = torch.rand(1, 1, 17, 70, generator=g) < 0.2
    deq1, deq2 = 3.1e-4, 1.7e-3
    d1 = npu_trans_quant_param(torch.tensor([deq1]))
    d2 = npu_trans_quant_param(torch.tensor([deq2]))
    # A softmax scale that is no power of two: the half Muls rounds twice (fp16(0.1), product).
    got, _ = int8_attention_bnsd(
        q, k, v, _u64(d1), torch.tensor([qs1]), _u64(d2), 0.1, masked=mask, kv_block=block
    )
    want = kernel_golden_np(
        q.numpy(), k.numpy(), v.numpy(), deq_scale_value(_u64(d1)).item(), qs1,
        deq_scale_value(_u64(d2)).item(), 0.1, mask.numpy(), block,
    )  # fmt: skip
    assert np.array_equal(got.numpy().view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize(("s1", "tile"), [(2, 2048), (17, 1024)])
def test_row_sum_is_rounded_half_away_and_blocks_accumulate_in_half(s1, tile):
    # 2049 equal scores: P = 1, P_q = 127 for every key. Q_S <= 16 without a mask tiles S2 by
    # 2048 (127 * 2048 / 128 = 2032, then 127 / 128); Q_S = 17 by 1024 (1016, 1016, 127 / 128).
    # Either way the half sum is 2033 (2032.99 rounds to the spacing 1 there). The fp32 row sum
    # 2049 is a tie between the halves 2048 and 2050: CAST_ROUND takes 2050, not nearest-even 2048.
    assert int8_kv_block(s1, 2049, has_mask=False) == tile
    assert int8_kv_block(2, 2049, has_mask=True) == 1024
    q = torch.ones(1, 1, s1, 32, dtype=torch.int8)
    k = torch.ones(1, 1, 2049, 32, dtype=torch.int8)
    out = npu_prompt_flash_attention(
        q, k, k.clone(), deq_scale1=ONE, quant_scale1=torch.tensor([127.0]),
        deq_scale2=torch.tensor([2.0**-7]), input_layout="BNSD",
    )  # fmt: skip
    want = F16(F16(2033) / F16(2050))
    assert bool((out == torch.tensor(float(want), dtype=torch.float16)).all())
    assert want != F16(F16(2033) / F16(2048))


def test_int8_path_tracks_float_attention_of_the_dequantized_inputs():
    g = torch.Generator().manual_seed(5)
    qf, kf, vf = (torch.randn(1, 2, 40, 64, generator=g) for _ in range(3))
    sq, sk, sv = (t.abs().max() / 127 for t in (qf, kf, vf))
    q, k, v = (torch.round(t / s).to(torch.int8) for t, s in ((qf, sq), (kf, sk), (vf, sv)))
    out = npu_prompt_flash_attention(
        q, k, v, deq_scale1=(sq * sk).reshape(1), quant_scale1=torch.tensor([127.0]),
        deq_scale2=(sv / 127).reshape(1), num_heads=2, scale_value=0.125, input_layout="BNSD",
    )  # fmt: skip
    ref = F.scaled_dot_product_attention(q * sq, k * sk, v * sv, scale=0.125)
    err = (out.float() - ref).abs().max().item()
    # P in steps of 1/127 (its rounding error averages out over 40 keys), fp16 scores: close to
    # 1 % of V's range, never exact.
    assert 0 < err < 0.01 * vf.abs().max().item()


def test_gqa_int8_reads_the_shared_kv_head():
    q, k, v = hand_case()
    q2 = torch.cat([q, q], dim=1)
    kw = dict(
        deq_scale1=ONE, quant_scale1=torch.tensor([127.0]), deq_scale2=torch.tensor([2.0**-7])
    )
    out = npu_prompt_flash_attention(
        q2, k, v, num_heads=2, num_key_value_heads=1, scale_value=64.0, input_layout="BNSD", **kw
    )
    single = npu_prompt_flash_attention(
        q, k, v, num_heads=1, scale_value=64.0, input_layout="BNSD", **kw
    )
    assert torch.equal(out[:, 0], single[:, 0]) and torch.equal(out[:, 1], single[:, 0])


# --- the float path -----------------------------------------------------------------------------


def rand_qkv(shape_q, shape_kv, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g).to(dtype)
    k = torch.randn(shape_kv, generator=g).to(dtype)
    v = torch.randn(shape_kv, generator=g).to(dtype)
    return q, k, v


def test_float_core_equals_sdpa_to_fp32_rounding():
    q, k, v = rand_qkv((2, 4, 33, 64), (2, 4, 47, 64))
    out, lse = float_attention_bnsd(q, k, v, 0.125)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.125))
    torch.testing.assert_close(
        lse.squeeze(-1), torch.logsumexp(q @ k.transpose(-1, -2) * 0.125, -1)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float_op_equals_sdpa_within_one_ulp_with_gqa_and_mask(dtype):
    q, k, v = rand_qkv((2, 4, 24, 64), (2, 2, 40, 64), seed=1, dtype=dtype)
    mask = torch.rand(2, 1, 24, 40, generator=torch.Generator().manual_seed(2)) < 0.3
    out = npu_prompt_flash_attention(
        q, k, v, atten_mask=mask, num_heads=4, num_key_value_heads=2, scale_value=0.125,
        input_layout="BNSD", next_tokens=2147483647,
    )  # fmt: skip
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=~mask, scale=0.125, enable_gqa=True
    ).to(dtype)
    assert out.dtype == dtype
    ulp = torch.finfo(dtype).eps * ref.float().abs().clamp_min(1.0)
    assert bool(((out.float() - ref.float()).abs() <= ulp).all())


def test_op_plugin_pfa_golden_fp16():
    # op-plugin test/test_custom_ops/test_prompt_flash_attention.py l.13-36 (shrunk): fp16 scores,
    # softmax in fp32 to fp16, fp16 P @ V; assertRtolEqual's fp16 precision 1e-3.
    q, k, v = rand_qkv((1, 2, 64, 128), (1, 2, 64, 128), seed=3, dtype=torch.float16)
    scores = (q.float() @ k.float().transpose(2, 3)).half().float() * (1.0 / math.sqrt(128))
    golden = (torch.softmax(scores, -1).half().float() @ v.float()).half()
    out = npu_prompt_flash_attention(
        q, k, v, num_heads=2, input_layout="BNSD", scale_value=1.0 / math.sqrt(128),
        pre_tokens=65535, next_tokens=65535,
    )  # fmt: skip
    torch.testing.assert_close(out, golden, rtol=1e-3, atol=1e-3)


def test_layouts_are_permutations_of_one_result():
    q, k, v = rand_qkv((2, 3, 5, 32), (2, 3, 7, 32), seed=4, dtype=torch.float16)
    bnsd = npu_prompt_flash_attention(q, k, v, num_heads=3, input_layout="BNSD")
    bsnd = npu_prompt_flash_attention(
        q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
        v.transpose(1, 2).contiguous(), num_heads=3, input_layout="BSND",
    )  # fmt: skip
    bsh = npu_prompt_flash_attention(
        q.transpose(1, 2).reshape(2, 5, 96), k.transpose(1, 2).reshape(2, 7, 96),
        v.transpose(1, 2).reshape(2, 7, 96), num_heads=3, input_layout="BSH",
    )  # fmt: skip
    mixed = npu_prompt_flash_attention(q, k, v, num_heads=3, input_layout="BNSD_BSND")
    assert torch.equal(bsnd, bnsd.transpose(1, 2)) and torch.equal(mixed, bsnd)
    assert torch.equal(bsh, bsnd.reshape(2, 5, 96))


def test_sparse_mode_0_with_a_mask_applies_pfa_default_next_tokens_0():
    q, k, v = (t.half().reshape(1, 6, 32) for t in rand_qkv((1, 1, 6, 32), (1, 1, 6, 32), seed=6))
    keep_all = torch.zeros(6, 6, dtype=torch.bool)
    causal = npu_prompt_flash_attention(q, k, v, atten_mask=keep_all)  # BSH, next_tokens=0
    full = npu_prompt_flash_attention(q, k, v, atten_mask=keep_all, next_tokens=2147483647)
    no_mask = npu_prompt_flash_attention(q, k, v)
    h = (q.float(), k.float(), v.float())
    ref = F.scaled_dot_product_attention(*h, is_causal=True, scale=1.0).half()
    torch.testing.assert_close(causal, ref, rtol=2**-10, atol=2**-14)
    assert torch.equal(full, no_mask) and not torch.equal(causal, no_mask)
    # sparse_mode 1 (allMask) ignores pre/next_tokens; a uint8 mask's nonzero entries mask.
    all_mask = npu_prompt_flash_attention(
        q, k, v, atten_mask=keep_all.to(torch.uint8), sparse_mode=1
    )
    assert torch.equal(all_mask, no_mask)
    ones = torch.triu(torch.ones(6, 6, dtype=torch.uint8), diagonal=1)
    assert torch.equal(npu_prompt_flash_attention(q, k, v, atten_mask=ones, sparse_mode=1), causal)


def test_fia_decode_float_and_softmax_lse():
    q, k, v = rand_qkv((2, 1, 4 * 32), (2, 9, 2 * 32), seed=7, dtype=torch.float16)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[1, :3] = True
    out, lse = npu_fused_infer_attention_score(
        q, k, v, atten_mask=mask, num_heads=4, num_key_value_heads=2, scale=0.2,
        softmax_lse_flag=True,
    )  # fmt: skip
    qb = q.reshape(2, 1, 4, 32).transpose(1, 2).float()
    kb = k.reshape(2, 9, 2, 32).transpose(1, 2).float().repeat_interleave(2, 1)
    vb = v.reshape(2, 9, 2, 32).transpose(1, 2).float().repeat_interleave(2, 1)
    attend = ~mask.reshape(2, 1, 1, 9)
    ref = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=attend, scale=0.2)
    assert out.shape == (2, 1, 128) and lse.shape == (2, 4, 1, 1)
    torch.testing.assert_close(out, ref.transpose(1, 2).reshape(2, 1, 128).half())
    scores = (qb @ kb.transpose(-1, -2) * 0.2).masked_fill(~attend, -math.inf)
    torch.testing.assert_close(lse.squeeze(-1), torch.logsumexp(scores, -1))


def test_fia_v2_float_path_equals_fia():
    q, k, v = rand_qkv((1, 2, 8, 64), (1, 2, 8, 64), seed=8, dtype=torch.bfloat16)
    v2, _ = npu_fused_infer_attention_score_v2(
        q, k, v, num_query_heads=2, input_layout="BNSD", softmax_scale=0.125
    )
    v1, _ = npu_fused_infer_attention_score(q, k, v, num_heads=2, input_layout="BNSD", scale=0.125)
    assert torch.equal(v2, v1)


def test_empty_key_gives_zeros_and_empty_query_an_empty_output():
    q, k, v = rand_qkv((1, 2, 4, 32), (1, 2, 0, 32), dtype=torch.float16)
    out = npu_prompt_flash_attention(q, k, v, num_heads=2, input_layout="BNSD")
    assert out.shape == (1, 2, 4, 32) and not bool(out.any())
    q0 = torch.zeros(1, 2, 0, 32, dtype=torch.float16)
    k1 = torch.ones(1, 2, 3, 32, dtype=torch.float16)
    assert npu_prompt_flash_attention(q0, k1, k1, num_heads=2, input_layout="BNSD").shape == (
        1, 2, 0, 32,
    )  # fmt: skip


# --- refusals -----------------------------------------------------------------------------------


def int8_qkv(d=32, s1=4, s2=4, n=1):
    return (
        torch.ones(1, n, s1, d, dtype=torch.int8),
        torch.ones(1, n, s2, d, dtype=torch.int8),
        torch.ones(1, n, s2, d, dtype=torch.int8),
    )


SCALES = dict(deq_scale1=ONE, quant_scale1=ONE, deq_scale2=ONE)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(d=48), "aligned to 32 bytes"),
        (dict(quant_scale1=None), "need deq_scale1, quant_scale1 and deq_scale2"),
        (dict(quant_offset2=ONE), "quant_offset2 needs quant_scale2"),
        (dict(deq_scale2=_u64(npu_trans_quant_param(ONE))), "share one form"),
        (dict(deq_scale1=torch.ones(2)), "per-tensor"),
        (dict(deq_scale1=torch.ones(1, dtype=torch.int64)), "deq_scale1 must be uint64, float32"),
        (dict(quant_scale1=torch.ones(1, dtype=torch.float16)), "quant_scale1 must be float32"),
        (dict(quant_scale2=torch.ones(5)), "1 or N\\*D=32"),
        (dict(pse_shift=torch.zeros(1)), "pse_shift is not supported by the reference"),
        (dict(input_layout="TND"), "not supported by the reference"),
        (dict(input_layout="SBH"), "input_layout must be one of"),
        (dict(sparse_mode=2), "sparse_mode=2 .* not supported by the reference"),
        (dict(sparse_mode=5), "sparse_mode must be 0 to 4"),
        (dict(sparse_mode=1), "sparse_mode=1 \\(allMask\\) needs atten_mask"),
        (dict(atten_mask=torch.zeros(4, 4)), "atten_mask must be bool, int8, uint8"),
        (dict(atten_mask=torch.zeros(3, 4, dtype=torch.bool)), "atten_mask shape"),
        (dict(num_heads=2), "num_heads=2"),
        (dict(s2=0), "cannot be empty"),
    ],
)
def test_pfa_refusals(change, match):
    dims = {key: change.pop(key) for key in ("d", "s2") if key in change}
    q, k, v = int8_qkv(**dims)
    kwargs = {**SCALES, "input_layout": "BNSD", **change}
    with pytest.raises(ShapeError, match=match):
        npu_prompt_flash_attention(q, k, v, **kwargs)


def test_int8_output_with_offset_refused_when_rows_are_left_out():
    q, k, v = int8_qkv()
    mask = torch.zeros(4, 4, dtype=torch.bool)
    kw = dict(SCALES, quant_scale2=ONE, quant_offset2=ONE, atten_mask=mask, input_layout="BNSD")
    with pytest.raises(ShapeError, match="leave rows"):
        npu_prompt_flash_attention(q, k, v, next_tokens=-1, **kw)
    assert npu_prompt_flash_attention(q, k, v, next_tokens=0, **kw).dtype == torch.int8


def test_float_refusals():
    q, k, v = rand_qkv((1, 1, 4, 32), (1, 1, 4, 32), dtype=torch.float16)
    with pytest.raises(ShapeError, match="int8 query/key/value only"):
        npu_prompt_flash_attention(q, k, v, deq_scale1=ONE, input_layout="BNSD")
    with pytest.raises(ShapeError, match="share one dtype"):
        npu_prompt_flash_attention(q, k.to(torch.int8), v.to(torch.int8), input_layout="BNSD")
    with pytest.raises(ShapeError, match="contiguous"):
        npu_prompt_flash_attention(q.transpose(2, 3), k, v, input_layout="BNSD")
    with pytest.raises(ShapeError, match="same shape"):
        npu_prompt_flash_attention(q, k, v[:, :, :3], input_layout="BNSD")
    with pytest.raises(ShapeError, match="ratio of at most 64"):
        npu_prompt_flash_attention(
            torch.ones(1, 1, 65 * 32, dtype=torch.float16), torch.ones(1, 1, 32).half(),
            torch.ones(1, 1, 32).half(), num_heads=65, num_key_value_heads=1,
        )  # fmt: skip
    # D = 20 halves = 40 bytes is not 32-byte aligned: the op takes it for B <= 128 only.
    q20 = torch.ones(129, 1, 2, 20, dtype=torch.float16)
    with pytest.raises(ShapeError, match="at most 128"):
        npu_prompt_flash_attention(q20, q20, q20, input_layout="BNSD")
    assert npu_prompt_flash_attention(q20[:128], q20[:128], q20[:128], input_layout="BNSD").shape


def test_fia_refuses_all_int8_decode_and_unsupported_arguments():
    q, k, v = int8_qkv(s1=1)
    fia_scales = dict(dequant_scale1=ONE, quant_scale1=ONE, dequant_scale2=ONE)
    with pytest.raises(ShapeError, match="Q_S = 1"):
        npu_fused_infer_attention_score(q, k, v, input_layout="BNSD", **fia_scales)
    q, k, v = int8_qkv(s1=2)
    assert npu_fused_infer_attention_score(q, k, v, input_layout="BNSD", **fia_scales)[0].shape
    with pytest.raises(ShapeError, match="block_table is not supported"):
        npu_fused_infer_attention_score(q, k, v, block_table=torch.zeros(1, 1), **fia_scales)
    with pytest.raises(ShapeError, match="tensor lists"):
        npu_fused_infer_attention_score(q, [k], [v], input_layout="BNSD", **fia_scales)
    with pytest.raises(ShapeError, match="inner_precise must be 0-3"):
        npu_fused_infer_attention_score(q, k, v, input_layout="BNSD", inner_precise=4, **fia_scales)
    fully_masked = torch.zeros(2, 4, dtype=torch.bool)
    fully_masked[0] = True
    with pytest.raises(ShapeError, match="fully masked rows"):
        npu_fused_infer_attention_score(
            q, k, v, atten_mask=fully_masked, input_layout="BNSD", inner_precise=2, **fia_scales
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(dequant_scale_query=torch.ones(1, 2, 4)), "MLA full-quant"),
        (dict(query_quant_mode=7), "FP8/MX/HiFloat8"),
        (dict(out_dtype=torch.float8_e5m2), "Ascend 950"),
        (dict(quant_scale_out=ONE), "int8 output on A2/A3 needs int8"),
        (dict(dequant_scale_key=ONE), "KV antiquant"),
        (dict(sparse_mode=9), "treeMask"),
        (dict(learnable_sink=torch.zeros(2)), "learnable_sink is not supported"),
    ],
)
def test_fia_v2_refusals(kwargs, match):
    q, k, v = rand_qkv((1, 2, 4, 32), (1, 2, 4, 32), dtype=torch.float16)
    with pytest.raises(ShapeError, match=match):
        npu_fused_infer_attention_score_v2(
            q, k, v, num_query_heads=2, input_layout="BNSD", **kwargs
        )
    with pytest.raises(ShapeError, match="query must be float16, bfloat16"):
        npu_fused_infer_attention_score_v2(*int8_qkv(), input_layout="BNSD")


def test_fp16_round_away_is_exact_on_every_subnormal_tie_and_bit_pattern() -> None:
    """Ties away from zero at the fp16 subnormal grid (2**-24) and the normal one; an fp32 NaN
    with a low payload stays NaN; against float64 arithmetic of the definition."""
    from opsnn_quant.ascend.attention import fp16_round_away

    k = torch.arange(0, 1024, dtype=torch.float64)
    ties = ((k + 0.5) * 2.0**-24).to(torch.float32)  # exact halves between subnormals
    got = fp16_round_away(torch.cat([ties, -ties])).to(torch.float64)
    want = (k + 1) * 2.0**-24  # away from zero
    assert torch.equal(got, torch.cat([want, -want]))
    below = torch.nextafter(ties, torch.zeros(()))  # just below each tie: down
    assert torch.equal(fp16_round_away(below).to(torch.float64), k * 2.0**-24)
    normal_tie = torch.tensor([1.0 + 2.0**-11], dtype=torch.float32)  # half an fp16 ulp at 1
    assert fp16_round_away(normal_tie).item() == 1.0 + 2.0**-10
    nan = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)
    assert torch.isnan(fp16_round_away(nan)).all()
