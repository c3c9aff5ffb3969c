"""One candidate's accumulated output error (probe pass 2), against hand-computed sums."""

import math

import torch

from opsnn_quant.probe.energy import SchemeEnergy


def test_energies_per_channel_and_the_sqnr_by_hand():
    e = SchemeEnergy()
    ref = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # rows x 2 output channels (Linear: last dim)
    out = torch.tensor([[1.0, 2.5], [2.0, 4.0]])
    e.add(ref, out, -1)
    # signal 1 + 4 + 9 + 16 = 30, noise 0.25 + 1 = 1.25, channel noise [1, 0.25] over 2 rows
    assert (e.signal, e.noise, e.channel_count) == (30.0, 1.25, 2)
    assert e.channel_power().tolist() == [0.5, 0.125]
    r = e.result(None, "float16")
    assert math.isclose(r.sqnr_db, 10 * math.log10(30 / 1.25), rel_tol=1e-12)
    # cross 1 + 5 + 6 + 16 = 28, approx 1 + 6.25 + 4 + 16 = 27.25
    assert math.isclose(r.cosine, 28 / math.sqrt(30 * 27.25), rel_tol=1e-12)


def test_a_non_finite_candidate_output_is_infeasible_not_a_number():
    e = SchemeEnergy()
    e.add(torch.tensor([[70000.0, 1.0]]), torch.tensor([[math.inf, 1.0]]), -1)
    r = e.result(None, "float16")
    assert r.sqnr_db is None and "1 inf/nan outputs" in r.infeasible
    assert r.fits_output_dtype == "bfloat16"  # 70000 fits bf16's range


def test_block_sums_equal_whole_tensor_sums_for_both_layouts():
    # Linear rows spanning several blocks (CHUNK elements each), a small Conv2d map (channels
    # at dim 1: one block) and a batch of maps in blocks of whole samples (4 of 64x32x32 per
    # CHUNK: 9 samples make blocks of 4, 4 and 1), against the float64 sums over the whole
    # tensors.
    from opsnn_quant.core.numerics import CHUNK

    torch.manual_seed(0)
    cases = (
        (torch.randn(3 * CHUNK // 64 + 5, 64), -1),
        (torch.randn(2, 3, 5, 7), 1),
        (torch.randn(9, 64, 32, 32), 1),
    )
    for ref, dim in cases:
        out = ref + 0.1 * torch.randn_like(ref)
        e = SchemeEnergy()
        e.add(ref, out, dim)
        r64, o64 = ref.double(), out.double()
        assert math.isclose(e.signal, float(r64.pow(2).sum()), rel_tol=1e-12)
        assert math.isclose(e.noise, float((o64 - r64).pow(2).sum()), rel_tol=1e-12)
        assert math.isclose(e.cross, float((r64 * o64).sum()), rel_tol=1e-12)
        assert math.isclose(e.approx, float(o64.pow(2).sum()), rel_tol=1e-12)
        other = [k for k in range(ref.dim()) if k != dim % ref.dim()]
        per_channel = (o64 - r64).pow(2).sum(dim=other)
        assert torch.allclose(e.channel_noise, per_channel, rtol=1e-12, atol=0)
        assert e.channel_count == ref.numel() // ref.shape[dim]


def test_add_leaves_float64_inputs_untouched():
    ref = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    out = torch.tensor([[1.0, 2.5], [2.0, 4.0]], dtype=torch.float64)
    before = out.clone()
    e = SchemeEnergy()
    e.add(ref, out, -1)
    assert torch.equal(out, before) and e.noise == 1.25
