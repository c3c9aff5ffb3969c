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
