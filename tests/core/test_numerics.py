import math

import pytest
import torch

from opsnn_quant.core.numerics import cosine, energies, noise_energy, signal_energy, sqnr_db


def test_energies_hand_computed_any_chunking():
    ref = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    out = torch.tensor([[1.0, 1.0], [4.0, -1.0]])
    # signal 1+4+9+1=15, noise 0+1+1+0=2, cross 1+2+12+1=16, approx 1+1+16+1=19
    for chunk in (1, 3, 4, 1 << 18):
        assert tuple(energies(ref, out, chunk=chunk)) == (15.0, 2.0, 16.0, 19.0)


def test_energies_non_contiguous_and_half_inputs():
    ref = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous view
    out = ref.half()
    e = energies(ref, out, chunk=5)
    assert e.noise == 0.0 and e.signal == float(sum(i * i for i in range(12)))


def test_energies_shape_mismatch():
    with pytest.raises(ValueError, match="shape mismatch"):
        energies(torch.zeros(3), torch.zeros(4))


def test_sqnr_and_cosine_known_values():
    ref = torch.tensor([3.0, 4.0])
    assert sqnr_db(ref, torch.tensor([3.0, 4.5])) == pytest.approx(10 * math.log10(25 / 0.25))
    assert sqnr_db(ref, ref) == math.inf
    assert sqnr_db(torch.zeros(2), ref) == -math.inf
    assert sqnr_db(ref, torch.tensor([math.inf, 0.0])) == -math.inf
    assert cosine(ref, torch.tensor([4.0, -3.0])) == pytest.approx(0.0)
    assert cosine(ref, 2 * ref) == pytest.approx(1.0)
    assert cosine(torch.zeros(2), torch.zeros(2)) == 1.0


def test_noise_and_signal_alone_are_the_energies_sums_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 70000, generator=g)  # five chunks of 50000 elements
    out = ref + 1e-3 * torch.randn(3, 70000, generator=g)
    e = energies(ref, out, chunk=50000)
    assert noise_energy(ref, out, chunk=50000) == e.noise
    assert signal_energy(ref, chunk=50000) == e.signal
    exact = float(((out.double() - ref.double()) ** 2).sum())
    assert abs(noise_energy(ref, out) - exact) <= 1e-12 * exact


def test_exact_sum_does_not_depend_on_the_order_of_its_terms():
    from opsnn_quant.core.numerics import ExactSum

    terms = [1e16, 1.0, -1e16, 3.0, 0.1, 0.2]
    assert sum(terms) != sum(reversed(terms))  # float addition: the order shows
    a, b, whole = ExactSum(), ExactSum(), ExactSum()
    for t in terms:
        whole.add(t)
    for t in reversed(terms[:3]):
        a.add(t)
    for t in terms[3:]:
        b.add(t)
    b.merge(a)  # shares, merged the other way round
    # the exact sum 4 + 0.1 + 0.2 (the floats' exact values), rounded once
    from fractions import Fraction

    exact = float(Fraction(4) + Fraction(0.1) + Fraction(0.2))
    assert float(whole) == float(b) == exact
    special = ExactSum()
    special.add(1.0)
    special.add(float("inf"))
    assert float(special) == float("inf")
    import pickle

    assert float(pickle.loads(pickle.dumps(whole))) == exact


def test_a_share_never_rounds_to_a_claim_it_does_not_make():
    from opsnn_quant.core.numerics import fmt_share

    assert [fmt_share(x) for x in (1.0, 0.996, 0.994, 0.5, 0.004, 0.0)] == [
        "100%",
        ">99%",
        "99%",
        "50%",
        "<1%",
        "0%",
    ]
    assert fmt_share(0.996, 4) == ">99%" and fmt_share(0.5, 4) == " 50%"
