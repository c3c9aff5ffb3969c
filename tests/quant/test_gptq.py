"""GPTQ rounding with fixed per-channel scales and bias correction (opsnn_quant/quant/gptq.py),
against a hand-worked case and the paper's unblocked algorithm written out here."""

import pytest
import torch

from opsnn_quant.errors import CalibrationError
from opsnn_quant.quant.functional import quantize_weight_per_channel
from opsnn_quant.quant.gptq import InputMoments, SplitMoments, corrected_bias, gptq_round


def test_a_hand_worked_two_column_case():
    # H = [[2, 1], [1, 2]] damped by 0.01 * mean diag (2): [[2.02, 1], [1, 2.02]]
    # H^-1 = [[2.02, -1], [-1, 2.02]] / (2.02^2 - 1) = [[0.655759, -0.324633], ...]
    # upper Cholesky of H^-1: u00 = sqrt(0.655759) = 0.809789, u01 = -0.324633 / u00 = -0.400886
    # column 0: rint(0.24 / 0.1) = 2, err = (0.24 - 0.2) / u00 = 0.049396
    # column 1: 0.04 - err * u01 = 0.059802 -> rint(0.598) = 1 (round to nearest gives 0)
    w = torch.tensor([[0.24, 0.04]])
    h = torch.tensor([[2.0, 1.0], [1.0, 2.0]])
    assert gptq_round(w, torch.tensor([0.1]), h).tolist() == [[2, 1]]
    assert torch.round(w / 0.1).tolist() == [[2.0, 0.0]]
    # the output error e^T H e: 0.0096 rounded to nearest, 0.0056 with GPTQ
    for q, want in (([2, 0], 0.0096), ([2, 1], 0.0056)):
        e = w[0] - torch.tensor(q, dtype=torch.float32) * 0.1
        assert float(e @ h @ e) == pytest.approx(want, rel=1e-4)


def _reference(w, scale, h, damp, order):
    """Algorithm 1 of the GPTQ paper without its Cholesky and blocking: the inverse Hessian of
    the columns left is updated explicitly after each column (OBS's row removal)."""
    w = w.double().clone()[:, order]
    h = h.double()[order][:, order]
    h = h + damp * torch.diagonal(h).mean() * torch.eye(h.shape[0], dtype=torch.float64)
    hinv = torch.linalg.inv(h)
    q = torch.zeros_like(w)
    s = scale.double()
    for j in range(w.shape[1]):
        q[:, j] = torch.round(w[:, j] / s).clamp(-128, 127)
        err = (w[:, j] - q[:, j] * s) / hinv[j, j]
        w[:, j + 1 :] -= err.unsqueeze(1) * hinv[j, j + 1 :].unsqueeze(0)
        hinv = hinv - torch.outer(hinv[:, j], hinv[j, :]) / hinv[j, j]
    return q[:, torch.argsort(order)].to(torch.int8)


def _correlated(rows=512, k=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g) * 0.3 + torch.eye(k)
    return torch.randn(rows, k, generator=g) @ mix * torch.linspace(0.2, 3.0, k)


@pytest.mark.parametrize("act_order", [False, True])
def test_matches_the_unblocked_algorithm_and_does_not_depend_on_the_block(act_order):
    x = _correlated()
    w = torch.randn(16, 24, generator=torch.Generator().manual_seed(1))
    _, scale = quantize_weight_per_channel(w)
    h = 2 * x.double().T @ x.double() / x.shape[0]
    order = (
        torch.argsort(torch.diagonal(h), descending=True, stable=True)
        if act_order
        else torch.arange(24)
    )
    got = gptq_round(w, scale, h, act_order=act_order)
    want = _reference(w, scale, h, 0.01, order)
    assert (got != want).sum() <= 2  # float64 sums in another order: a tie may fall otherwise
    assert torch.equal(gptq_round(w, scale, h, block=5, act_order=act_order), got)


@pytest.mark.parametrize(("n", "k", "block"), [(16, 24, 128), (33, 70, 16), (64, 300, 128)])
def test_the_cpus_numpy_column_loop_gives_the_torch_loops_bits(monkeypatch, n, k, block):
    # On a CPU the column loop runs in NumPy (speed); a device keeps the torch loop. Both do
    # the same float64 operations in the same order: the same integers, bit for bit.
    from opsnn_quant.quant import gptq

    x = _correlated(rows=4 * k, k=k, seed=n)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(k)) * 0.1
    w[:, 3] *= 20  # one large column: large errors to spread
    _, scale = quantize_weight_per_channel(w)
    h = 2 * x.double().T @ x.double() / x.shape[0]
    cpu = gptq_round(w, scale, h, block=block)
    monkeypatch.setattr(gptq, "_columns_numpy", gptq._columns_torch)
    assert torch.equal(gptq_round(w, scale, h, block=block), cpu)
    assert (cpu != quantize_weight_per_channel(w)[0]).any()  # GPTQ moved some integers


@pytest.mark.parametrize("block", [70, 16])
def test_rows_rounded_in_chunks_give_the_whole_weights_integers(monkeypatch, block):
    # GPTQ's rows are independent (one Hessian; a row's errors spread over its own columns):
    # a weight too big for one float64 chunk (Whisper's vocabulary projection) is rounded
    # rows at a time. One block (no matmul, elementwise only): the same bits; several blocks:
    # the blocks' matmul sums each row in the same K order, whatever the number of rows.
    from opsnn_quant.quant import gptq

    n, k = 101, 70
    x = _correlated(rows=4 * k, k=k, seed=3)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(4)) * 0.1
    w[:, 3] *= 20
    _, scale = quantize_weight_per_channel(w)
    h = 2 * x.double().T @ x.double() / x.shape[0]
    whole = gptq_round(w, scale, h, block=block)
    monkeypatch.setattr(gptq, "ROW_CHUNK_BYTES", 8 * k * 7)  # 7 rows a chunk: 15 chunks
    chunked = gptq_round(w, scale, h, block=block)
    if block >= k:
        assert torch.equal(chunked, whole)
    else:
        assert (chunked != whole).sum() <= 2  # a float64 tie may fall otherwise, no more
    assert (whole != quantize_weight_per_channel(w)[0]).any()  # GPTQ moved some integers
    # the bias correction in the same row chunks: each row's shift (W_q s - W) E[x] alone
    mean = x.double().mean(dim=0)
    bias = corrected_bias(None, w, whole, scale, mean)
    want = -((whole.double() * scale.double().unsqueeze(1) - w.double()) @ mean).float()
    assert torch.allclose(bias, want, rtol=1e-6, atol=1e-9)


def test_its_output_error_is_below_round_to_nearest():
    x = _correlated(seed=3)
    w = torch.randn(32, 24, generator=torch.Generator().manual_seed(4))
    q_rtn, scale = quantize_weight_per_channel(w)
    moments = InputMoments(24)
    moments.collect(x)
    q = gptq_round(w, scale, moments.hessian())

    def err(qq):
        return float(((x @ (qq.float() * scale[:, None]).T - x @ w.T) ** 2).sum())

    assert err(q) < 0.7 * err(q_rtn)
    assert int(q.abs().max()) <= 128 and q.dtype == torch.int8


def test_a_column_never_seen_rounds_alone():
    x = _correlated()
    x[:, 5] = 0.0
    w = torch.randn(8, 24, generator=torch.Generator().manual_seed(2))
    q_rtn, scale = quantize_weight_per_channel(w)
    moments = InputMoments(24)
    moments.collect(x)
    q = gptq_round(w, scale, moments.hessian())
    assert torch.equal(q[:, 5], q_rtn[:, 5]) and not torch.equal(q, q_rtn)


def test_bad_shapes_are_refused():
    with pytest.raises(CalibrationError, match="do not fit"):
        gptq_round(torch.zeros(2, 3), torch.ones(2), torch.eye(4))


def test_moments_of_smoothed_inputs_and_the_corrected_bias():
    x = _correlated(rows=64, k=6)
    s = torch.linspace(0.5, 2.0, 6)
    m = InputMoments(6)
    m.collect(x[:40])
    m.collect(x[40:])
    xs = (x / s).double()
    torch.testing.assert_close(m.hessian(s), 2 * xs.T @ xs / 64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.mean(s), xs.mean(dim=0))
    # (W_q s - W) E[x] = [1.0 - 1.0, 1.9 - 2.0] . [3, 5] = -0.5: the bias 0.2 becomes 0.7
    b = corrected_bias(torch.tensor([0.2]), torch.tensor([[1.0, 2.0]]),
                       torch.tensor([[10, 19]], dtype=torch.int8), torch.tensor([0.1]),
                       torch.tensor([3.0, 5.0], dtype=torch.float64))  # fmt: skip
    assert b.dtype == torch.float32 and b.tolist() == pytest.approx([0.7])


# ---- through quantize(): the option of a QuantSpec --------------------------------------------


class _Mixed(torch.nn.Module):
    """A float Linear mixing iid inputs (correlated features, as after a norm or an attention)
    into the Linear that is quantized."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mix, self.fc = torch.nn.Linear(32, 48), torch.nn.Linear(48, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.mix(x)))  # after a ReLU: a mean far from 0


def _rows(seed: int, n: int = 256) -> torch.Tensor:
    return torch.randn(n, 32, generator=torch.Generator().manual_seed(seed))


def _quantized(spec):
    from opsnn_quant.quant.api import quantize

    model = _Mixed()
    batches = [_rows(100 + i) for i in range(8)]  # 2048 calibration rows for K = 48
    return quantize(model, {"fc": spec}, lambda m: [m(x) for x in batches])


def _weight_error(model) -> float:
    """Held-out ``||X (W_q s - W)^T||^2 / ||X W^T||^2``: the weight's share of the error."""
    q, w = model.fc, _Mixed().fc.weight.detach()
    with torch.no_grad():
        x = torch.relu(model.mix(_rows(7, 1024)))
    deq = q.weight.float() * q.weight_quantizer.scale[:, None]
    return float(((x @ (deq - w).T) ** 2).sum() / ((x @ w.T) ** 2).sum())


@pytest.mark.parametrize("precision", ["w8a8", "w8a8_dynamic", "w8a16"])
def test_gptq_weights_keep_the_form_and_scales_and_lower_the_error(precision):
    from opsnn_quant.quant.spec import QuantSpec

    plain = _quantized(QuantSpec(precision))
    gptq = _quantized(QuantSpec(precision, weight_rounding="gptq"))
    q, p = gptq.fc, plain.fc
    # the same per-channel scales and int8 layout: only the integers differ
    assert torch.equal(q.weight_quantizer.scale, p.weight_quantizer.scale)
    assert q.weight.dtype == torch.int8 and q.weight.shape == p.weight.shape
    assert not torch.equal(q.weight, p.weight)
    assert _weight_error(gptq) < 0.7 * _weight_error(plain)  # on held-out inputs


def test_bias_correction_removes_the_mean_shift_in_quant_bias():
    from opsnn_quant.quant.spec import QuantSpec

    plain = _quantized(QuantSpec("w8a8"))
    corrected = _quantized(QuantSpec("w8a8", bias_correction=True))
    assert torch.equal(corrected.fc.weight, plain.fc.weight)
    # quant_bias * deq_scale is the float bias the kernel adds: it moved by -(W_q s - W) E[x]
    # over the calibration inputs, to within half an accumulator unit (deq_scale / 2)
    with torch.no_grad():
        x = torch.relu(_Mixed().mix(torch.cat([_rows(100 + i) for i in range(8)])))
    q, w = plain.fc, _Mixed().fc.weight.detach().double()
    deq = q.weight.double() * q.weight_quantizer.scale.double()[:, None]
    want = -(deq - w) @ x.double().mean(dim=0)
    moved = (corrected.fc.quant_bias - q.quant_bias).double() * q.deq_scale.double()
    assert float((moved - want).abs().max()) <= float(q.deq_scale.max())
    assert float(want.abs().max()) > 20 * float(q.deq_scale.max())  # a real shift, not noise

    def shift(model) -> float:  # held-out: the mean output error per channel
        with torch.no_grad():
            x = _rows(9, 2048)
            return float((model(x) - _Mixed()(x)).mean(dim=0).abs().mean())

    assert shift(corrected) < 0.5 * shift(plain)


def test_gptq_specs_are_checked_and_round_trip():
    from torch import nn

    from opsnn_quant.errors import ConfigError
    from opsnn_quant.quant.api import quantize
    from opsnn_quant.quant.spec import QuantSpec

    with pytest.raises(ConfigError, match="w4a16 keeps round to nearest"):
        QuantSpec("w4a16", weight_rounding="gptq")
    with pytest.raises(ConfigError, match="int32 quant_bias of static w8a8, not w8a8_dynamic"):
        QuantSpec("w8a8_dynamic", bias_correction=True)
    with pytest.raises(ConfigError, match="of a conv are for static activations"):
        quantize(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)),
                 {"0": QuantSpec("w8a8_dynamic", weight_rounding="gptq")},
                 lambda m: m(torch.randn(1, 3, 8, 8)))  # fmt: skip
    spec = QuantSpec("w8a8", weight_rounding="gptq", bias_correction=True)
    assert QuantSpec.from_dict(spec.to_dict()) == spec
    assert "weight_rounding" not in QuantSpec("w8a8").to_dict()  # old checkpoints keep bytes


def test_a_gptq_checkpoint_reloads_bit_for_bit(tmp_path):
    from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
    from opsnn_quant.quant.spec import QuantSpec

    model = _quantized(QuantSpec("w8a8", weight_rounding="gptq", bias_correction=True))
    save_quantized(model, tmp_path / "q")
    again = load_quantized(_Mixed(), tmp_path / "q")
    x = _rows(5)
    assert torch.equal(model(x), again(x))


def test_a_convs_gptq_is_the_linear_gptq_of_its_im2col_rows():
    # A 3x3 conv (stride 2, padding 1) is the matmul of its weight (O, C*3*3) with the im2col
    # rows of its input: its GPTQ integers and corrected bias are gptq_round / corrected_bias
    # on the Hessian and mean of those rows, computed here with F.unfold independently.
    from torch import nn
    from torch.nn import functional as F

    from opsnn_quant.quant.api import quantize
    from opsnn_quant.quant.spec import QuantSpec

    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1)
    batches = [torch.relu(torch.randn(2, 4, 9, 9)) for _ in range(3)]
    per_batch = [
        F.unfold(x, 3, padding=1, stride=2).transpose(1, 2).reshape(-1, 36) for x in batches
    ]
    rows = torch.cat(per_batch).double()
    # summed as quantize() sums them (float32 X^T X per half of the rows, the probe's halves),
    # so that the integers compare exactly; the rows themselves come from F.unfold here
    moments = SplitMoments(36)
    for r in per_batch:
        moments.collect(r)
    hessian = moments.hessian()
    assert torch.allclose(hessian, 2 * rows.T @ rows / rows.shape[0], rtol=1e-5, atol=1e-6)
    spec = QuantSpec("w8a8", weight_rounding="gptq", bias_correction=True)
    plain = quantize(nn.Sequential(_copy(conv)), {"0": QuantSpec("w8a8")},
                     lambda m: [m(x) for x in batches])[0]  # fmt: skip
    q = quantize(nn.Sequential(_copy(conv)), {"0": spec}, lambda m: [m(x) for x in batches])[0]
    w2d = conv.weight.detach().reshape(6, 36)
    scale = q.weight_quantizer.scale
    assert torch.equal(scale, plain.weight_quantizer.scale)  # the same scales
    expected = gptq_round(w2d, scale, hessian)
    assert torch.equal(q.weight.reshape(6, 36), expected)
    assert not torch.equal(expected, plain.weight.reshape(6, 36))
    bias = corrected_bias(conv.bias.detach(), w2d, expected, scale, rows.mean(dim=0))
    plain_bias = corrected_bias(conv.bias.detach(), w2d, expected, scale, torch.zeros(36))
    # the int32 quant_bias folds the corrected float bias: it differs from the uncorrected one
    assert not torch.equal(bias, plain_bias)
    from opsnn_quant.quant.functional import fold_bias_int32

    assert torch.equal(q.quant_bias, fold_bias_int32(bias, q.deq_scale, 0.0, expected))
    assert not torch.equal(q.quant_bias, fold_bias_int32(plain_bias, q.deq_scale, 0.0, expected))


def _copy(module):
    import copy

    return copy.deepcopy(module)


@pytest.mark.parametrize("spread", [4.0, 1e3])
def test_moments_of_shares_merge_into_the_moments_of_all_the_rows(spread):
    g = torch.Generator().manual_seed(0)
    scales = (1.0, spread, 1.0 / spread)
    calls = [torch.randn(m, 12, generator=g) * s for m, s in zip((30, 7, 50), scales, strict=True)]
    from opsnn_quant.core.stream import at_batch

    def over(batches: range) -> SplitMoments:  # call i is data batch i
        moments = SplitMoments(12)
        for i in batches:
            with at_batch(i):
                moments.collect(calls[i])
                moments.collect(calls[i] * 0.5)  # two calls a batch: summed in fp32
        return moments

    whole, first = over(range(3)), over(range(1))
    first.merge(over(range(1, 3)))
    for a, b in zip(first.halves, whole.halves, strict=True):
        assert a.rows == b.rows
        assert torch.equal(a.total + a.total_error, b.total + b.total_error)
        if spread == 4.0:  # fp32 batch sums summed in float64: exact while an entry's terms
            assert torch.equal(a.xtx, b.xtx)  # span less than 2^29
        else:  # products spread 1e12 (2^40) apart: the float64 sum rounds, order-dependent
            assert torch.allclose(a.xtx, b.xtx, rtol=2**-52, atol=0)
    assert torch.equal(first.mean(), whole.mean())
    # the mean is the float64 mean of all rows (compensated: the scales' spread does not show)
    rows = torch.cat([c for x in calls for c in (x, x * 0.5)]).double()
    assert torch.allclose(whole.mean(), rows.mean(dim=0), rtol=1e-15, atol=0)
