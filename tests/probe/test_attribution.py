"""End-to-end attribution: the structured and diagonal estimators against the exhaustive reference."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from opsnn_quant.errors import CalibrationError
from opsnn_quant.probe.api import ProbeConfig, probe
from opsnn_quant.probe.attribution import estimate
from tests.tiny_models import TinyAttention, forward_loop_for


def spearman(a, b):
    ra = np.argsort(np.argsort(a))
    rb = np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.parametrize("estimator", ["structured", "diagonal"])
def test_estimator_ranks_like_the_exhaustive_reference(estimator):
    model = TinyAttention(seed=1)
    with torch.no_grad():
        model.ff2.weight.mul_(8.0)  # make some modules clearly matter more than others
        model.to_v.weight.mul_(4.0)
    report = probe(
        model,
        forward_loop_for(model, batches=6),
        ProbeConfig(exhaustive=True, max_root_calls=6, estimator=estimator),
        modalities={"": "denoiser"},
    )
    mods = [m for m in report.modules if m.e2e is not None]
    assert len(mods) == 6
    est = [m.e2e.contribution for m in mods]
    exh = [m.e2e.exhaustive for m in mods]
    assert spearman(est, exh) >= 0.8
    assert sorted(m.e2e.rank for m in mods) == list(range(1, 7))
    predicted = report.modalities["denoiser"].predicted_sqnr_db_all_w8a8
    assert predicted is not None and math.isfinite(predicted)


def test_estimator_is_unbiased_for_a_linear_chain():
    torch.manual_seed(0)
    chain = nn.Sequential(nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False))
    x = torch.randn(256, 32)
    freq = {"0": 1000.0, "1": 1700.0}

    # Structured noise that is a function of the module's output (as quantization noise is), so
    # it is the same whether the estimator replays the batch whole or one sample at a time.
    def quantized_output(name, scheme, args, y, calls=1):
        return y + 0.01 * torch.sin(freq[name] * y)

    result = estimate(
        chain,
        [((x,), {})],
        {"0": chain[0], "1": chain[1]},
        quantized_output,
        {"0": ("n",), "1": ("n",)},
        exhaustive=True,
    )
    for name in ("0", "1"):
        exact = result.exhaustive[name]
        assert abs(result.contributions[name] - exact) < 0.3 * exact


def test_diagonal_estimator_matches_the_white_noise_formula():
    # Module "0"'s output feeds y = B h. For noise white within each channel c of h with power
    # sigma_c^2, E||B e||^2 = rows * sum_c sigma_c^2 ||B[:, c]||^2 (hand formula); the diagonal
    # estimator draws one v per call, so over 2048 rows it lands within a few percent.
    torch.manual_seed(0)
    chain = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 3, bias=False))
    x = torch.randn(2048, 4)
    sigma2 = torch.tensor([1e-4, 4e-4, 0.0, 2e-3], dtype=torch.float64)
    result = estimate(
        chain,
        [((x,), {})],
        {"0": chain[0]},
        lambda *a: pytest.fail("the diagonal estimator runs no candidate"),
        {"0": ("a", "b")},
        noise_power=lambda name, scheme: sigma2 if scheme == "a" else 4 * sigma2,
    )
    with torch.no_grad():
        energy = float(chain(x).double().pow(2).sum())
        col = chain[1].weight.double().pow(2).sum(dim=0)
    want = 2048 * float(sigma2 @ col) / energy
    assert result.contributions["0"] == pytest.approx(want, rel=0.1)
    assert result.per_scheme["0"]["b"] == pytest.approx(4 * result.contributions["0"], rel=1e-9)


def test_estimator_scores_every_scheme_on_the_same_gradient():
    # Scheme "blind" puts its noise on channels the next layer ignores (zero weight columns),
    # "seen" the same noise energy on channels it reads, "seen3" three times "seen"'s noise.
    # Equal local SQNR for blind and seen; end to end blind costs exactly nothing, and seen3
    # exactly 9x seen (projections on one gradient scale linearly).
    torch.manual_seed(0)
    chain = nn.Sequential(nn.Linear(32, 32, bias=False), nn.Linear(32, 8, bias=False))
    with torch.no_grad():
        chain[1].weight[:, :16] = 0.0
    x = torch.randn(64, 32)
    first = torch.cat([torch.ones(16), torch.zeros(16)])
    mask = {"blind": first, "seen": 1 - first, "seen3": 3 * (1 - first)}

    def quantized_output(name, scheme, args, y, calls=1):
        return y + 0.01 * torch.sin(1000.0 * y) * mask[scheme]

    result = estimate(
        chain, [((x,), {})], {"0": chain[0]}, quantized_output, {"0": ("seen", "blind", "seen3")}
    )
    got = result.per_scheme["0"]
    assert got["blind"] == 0.0
    assert got["seen"] > 0.0
    assert got["seen3"] == pytest.approx(9.0 * got["seen"], rel=1e-5)
    assert result.contributions["0"] == got["seen"]  # the first scheme is the reference


def test_estimate_in_chunks_matches_whole_calls_for_linear_noise():
    # With a linear root and noise linear in the output, each sample's projection is the same
    # whether the batch is replayed whole or per sample, given the same direction per sample;
    # directions are drawn per replay, so compare expectations: both within 30 % of exhaustive.
    torch.manual_seed(0)
    chain = nn.Sequential(nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False))
    x = torch.randn(128, 16)

    def quantized_output(name, scheme, args, y, calls=1):
        return y + 0.01 * torch.sin(1000.0 * y)

    for max_batch in (None, 1, 32):
        r = estimate(
            chain,
            [((x,), {})],
            {"0": chain[0]},
            quantized_output,
            {"0": ("s",)},
            exhaustive=True,
            max_batch=max_batch,
        )
        assert abs(r.contributions["0"] - r.exhaustive["0"]) < 0.3 * r.exhaustive["0"]


def test_estimator_refuses_an_input_changed_in_place_before_its_gradient():
    # The noise is computed at gradient time from the saved input: an in-place change in between
    # would silently score the wrong input, so it is an error naming the module.
    class InPlaceResidual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x * 1.0
            h = self.fc(x)
            x.add_(h)
            return x

    model = InPlaceResidual()

    def quantized_output(name, scheme, args, y, calls=1):
        return y

    with pytest.raises(CalibrationError, match="'fc' was modified in place"):
        estimate(
            model, [((torch.randn(4, 8),), {})], {"fc": model.fc}, quantized_output, {"fc": ("s",)}
        )


def test_a_modality_with_two_roots_attributes_both_by_output_energy():
    # Two identical towers of one modality (SDXL's two text encoders in miniature), the second
    # fed twice the input: with power-of-two scaling every int8 integer is the same, so each
    # module's contribution relative to its own tower is the same; over both towers' outputs
    # together the second tower carries 4/5 of the energy, so its modules count 4x the first's.
    import copy

    from opsnn_quant.models.generic import GenericAdapter
    from opsnn_quant.types import Modality

    class Towers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a = nn.Sequential(
                nn.Linear(16, 32, bias=False), nn.ReLU(), nn.Linear(32, 8, bias=False)
            )
            self.b = copy.deepcopy(self.a)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.a(x), self.b(2 * x)], dim=-1)

    model = Towers()
    data = [torch.randn(4, 16) for _ in range(3)]
    adapter = GenericAdapter(
        model,
        {"a": "text_encoder", "b": "text_encoder"},
        lambda m: [m(x) for x in data],
        roots={"text_encoder": ["a", "b"]},
    )
    assert adapter.roots() == {"a": Modality.TEXT_ENCODER, "b": Modality.TEXT_ENCODER}
    report = probe(adapter, adapter.forward_loop(), ProbeConfig(max_root_calls=3, fp16=False))
    for layer in ("0", "2"):
        ca, cb = report.module(f"a.{layer}").e2e, report.module(f"b.{layer}").e2e
        assert ca is not None and cb is not None
        assert cb.contribution == pytest.approx(4 * ca.contribution, rel=1e-5)
    ranks = sorted(report.module(n).e2e.rank for n in ("a.0", "a.2", "b.0", "b.2"))
    assert ranks == [1, 2, 3, 4]  # one ranking over the modality


def test_estimator_samples_replays_that_many_samples_of_each_call():
    from opsnn_quant.models.generic import GenericAdapter

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    data = [torch.randn(8, 16) for _ in range(3)]
    adapter = GenericAdapter(model, {"": "denoiser"}, lambda m: [m(x) for x in data])
    sizes: list[int] = []
    model.register_forward_pre_hook(lambda m, a: sizes.append(a[0].shape[0]))
    cfg = ProbeConfig(max_root_calls=3, fp16=False, estimator_samples={"denoiser": 2})
    report = probe(adapter, adapter.forward_loop(), cfg)
    # pass 1 runs the loop (3 calls of 8); the estimator replays each recorded call on 2 samples,
    # once, with gradients (its forward gives the output energy, and its candidates the local
    # errors: no pass 2 over the loop)
    assert sizes == [8] * 3 + [2] * 3
    assert report.module("0").e2e is not None and report.module("0").e2e.contribution > 0


@pytest.mark.parametrize("max_batch", [None, 3])
def test_the_output_energy_is_the_float_outputs_from_the_estimators_forward(max_batch):
    # No separate no-grad replay: the energy the contributions are divided by is the float
    # output's, summed over the calls (and over the chunks of a call split for memory).
    torch.manual_seed(0)
    chain = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
    calls = [((torch.randn(7, 8),), {}), ((torch.randn(5, 8),), {})]
    with torch.no_grad():
        want = sum(float(chain(*c[0]).double().pow(2).sum()) for c in calls)
    result = estimate(
        chain,
        calls,
        {"0": chain[0]},
        lambda name, scheme, args, y, calls=1: y * 1.01,
        {"0": ("s",)},
        max_batch=max_batch,
    )
    # fp32 outputs of the chunks against the whole batch's: equal to fp32 rounding
    assert result.output_energy == pytest.approx(want, rel=1e-6)
    assert result.seconds_forward == 0.0  # no exhaustive reference: no float replay


def test_costs_give_forward_equivalents_only_where_a_float_replay_was_timed():
    model = TinyAttention(seed=1)
    loop = forward_loop_for(model, batches=2)
    plain = probe(
        model, loop, ProbeConfig(max_root_calls=2, fp16=False), modalities={"": "denoiser"}
    )
    assert (
        plain.costs["denoiser_forward_seconds"] == 0.0
    )  # no replay: the energy is the estimator's
    assert "denoiser_estimator_forward_equivalents" not in plain.costs  # not est / 0
    cfg = ProbeConfig(max_root_calls=2, fp16=False, exhaustive=True)
    c = probe(model, loop, cfg, modalities={"": "denoiser"}).costs
    assert c["denoiser_forward_seconds"] > 0
    want = c["denoiser_estimator_seconds"] / c["denoiser_forward_seconds"]
    assert c["denoiser_estimator_forward_equivalents"] == pytest.approx(want, rel=1e-3)  # rounded
