"""Issue 44 §3: KID as the distribution criterion (unbiased MMD², cubic polynomial kernel) and
its paired bootstrap interval by prompt."""

from __future__ import annotations

import html
import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.intervals import Interval, draw_groups, group_bootstrap
from opsnn_quant.evaluation.kid import (
    PairedKernels,
    kid_delta,
    paired_kid,
    poly_kernel,
    unbiased_mmd2,
    unpaired_kid,
    weighted_mmd2,
)
from opsnn_quant.evaluation.render import md_text, render_html, render_markdown
from opsnn_quant.evaluation.report import AcceptanceReport, fmt
from opsnn_quant.evaluation.runner import build_report, verdict
from opsnn_quant.evaluation.t2i import t2i_quality
from tests.evaluation.conftest import random_images
from tests.evaluation.test_fid import PooledFeatures
from tests.evaluation.test_runner import t2i_suite

# Three one-dimensional features each, so k(a, b) = (ab + 1)^3 is integer arithmetic:
# X = (0, 1, 2), Y = (0, 0, 1).
#   k(x, x'): k(0, .) = 1, k(1, 2) = 27                        off-diagonal sum 2 (1 + 1 + 27) = 58
#   k(y, y'): every pair holds a 0                              off-diagonal sum 6
#   k(x_i, y_j): rows x = 0: 1 1 1; x = 1: 1 1 8; x = 2: 1 1 27  sum 42, diagonal 1 + 1 + 27 = 29
X = np.array([[0.0], [1.0], [2.0]])
Y = np.array([[0.0], [0.0], [1.0]])


def test_kernel_and_both_estimators_by_hand():
    assert poly_kernel(X, Y).tolist() == [[1, 1, 1], [1, 1, 8], [1, 1, 27]]
    # Two independent sets: 58/6 + 6/6 - 2 x 42/9 = 4/3.
    kxx, kyy, kxy = poly_kernel(X, X), poly_kernel(Y, Y), poly_kernel(X, Y)
    assert unbiased_mmd2(kxx, kyy, kxy) == pytest.approx(4 / 3, abs=1e-12)
    assert unpaired_kid(X, Y) == pytest.approx(4 / 3, abs=1e-12)
    # Paired by prompt (x_i with y_i): the cross pairs i = j are left out like the within ones,
    # (58 + 6 - 2 x (42 - 29)) / 6 = 38/6.
    assert paired_kid(X, Y, 3) == pytest.approx(19 / 3, abs=1e-12)


def test_a_resample_leaves_out_the_pairs_of_copies_by_hand():
    h = PairedKernels.of(X, Y, 3).h
    # h[u, v] = k(x_u, x_v) + k(y_u, y_v) - k(x_u, y_v) - k(x_v, y_u): h[1, 2] = 27 + 1 - 8 - 1
    assert h[1, 2] == h[2, 1] == 19
    # Draws (1, 2, 2): the pairs of draws from distinct prompts are (1, 2) and (2, 1), twice
    # each; the pairs of prompt 2 with its copy (h[2, 2] = 125 + 8 - 2 x 27 = 79) are left out.
    assert weighted_mmd2(h, np.array([[0, 1, 2]])).tolist() == [19.0]
    # keeping them (a V-statistic of the resample) would give (h11 + 4 h22 + 4 h12) / 9 = 399/9
    assert (h[1, 1], h[2, 2]) == (7, 79)
    # every count 1 is the full-set estimate; one prompt drawn 3 times holds no pair: NaN
    assert weighted_mmd2(h, np.ones((1, 3)))[0] == pytest.approx(19 / 3, abs=1e-12)
    assert math.isnan(weighted_mmd2(h, np.array([[3, 0, 0]]))[0])


@pytest.mark.filterwarnings("ignore:Metric `Kernel Inception Distance` will save")
def test_unpaired_kid_is_torchmetrics_kid_on_random_features():
    from torchmetrics.image.kid import KernelInceptionDistance, poly_mmd

    class Identity(nn.Module):
        num_features = 8

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(40, 8, dtype=torch.float64, generator=gen)
    y = torch.randn(40, 8, dtype=torch.float64, generator=gen) * 1.2 + 0.3
    assert unpaired_kid(x, y) == pytest.approx(float(poly_mmd(x, y)), rel=1e-12)
    # the metric class, one subset of the whole sets (its draw is then only a permutation)
    metric = KernelInceptionDistance(feature=Identity(), subsets=1, subset_size=40)
    metric.set_dtype(torch.float64)
    metric.update(x, real=True)
    metric.update(y, real=False)
    mean, _ = metric.compute()
    assert unpaired_kid(y, x) == pytest.approx(float(mean), rel=1e-12)


def test_paired_kid_against_torchmetrics_kernels_and_a_brute_force_loop():
    from torchmetrics.image.kid import poly_kernel as tm_kernel

    rng = np.random.default_rng(7)
    m = 6
    x, y = rng.normal(size=(m, 5)), rng.normal(size=(m, 5)) + 0.5
    kxx, kyy, kxy = (tm_kernel(torch.from_numpy(a), torch.from_numpy(b)).numpy()
                     for a, b in ((x, x), (y, y), (x, y)))  # fmt: skip
    off = ~np.eye(m, dtype=bool)
    expected = (kxx[off].sum() + kyy[off].sum() - 2 * kxy[off].sum()) / (m * (m - 1))
    assert paired_kid(x, y, m) == pytest.approx(expected, rel=1e-12)
    # Three seeds per prompt (seed-major rows): the mean over every pair of images of
    # distinct prompts, by an explicit loop.
    seeds = 3
    xs = rng.normal(size=(seeds * m, 5))

    def k(a: np.ndarray, b: np.ndarray) -> float:
        return float((a @ b / 5 + 1) ** 3)

    terms = []
    for u, v in itertools.permutations(range(m), 2):
        imgs_u, imgs_v = xs[u::m], xs[v::m]
        terms.append(
            np.mean([k(a, b) for a in imgs_u for b in imgs_v]) + k(y[u], y[v])
            - np.mean([k(a, y[v]) for a in imgs_u]) - np.mean([k(b, y[u]) for b in imgs_v])
        )  # fmt: skip
    assert paired_kid(xs, y, m) == pytest.approx(np.mean(terms), rel=1e-12)


def test_a_resample_is_the_masked_mean_of_the_gathered_kernels():
    # weighted_mmd2 (counts) against the literal definition: gather h at the drawn indices and
    # average over the pairs of draws that are not copies of one prompt.
    rng = np.random.default_rng(11)
    m = 7
    h = PairedKernels.of(rng.normal(size=(m, 4)), rng.normal(size=(m, 4)), m).h
    draws = draw_groups(m, 50)
    counts = np.stack([np.bincount(d, minlength=m) for d in draws])
    got = weighted_mmd2(h, counts)
    for r, d in enumerate(draws):
        gathered = h[np.ix_(d, d)]
        distinct = d[:, None] != d[None, :]
        assert got[r] == pytest.approx(gathered[distinct].mean(), rel=1e-12, abs=1e-12)


def test_a_set_against_an_identical_copy_is_exactly_zero_on_every_resample():
    rng = np.random.default_rng(3)
    m = 33  # an odd size: numpy's SYRK and GEMM round x @ x.T differently there
    x = rng.normal(size=(m, 37))
    h = PairedKernels.of(x, x.copy(), m).h
    assert not h.any()
    assert not weighted_mmd2(
        h, np.stack([np.bincount(d, minlength=m) for d in draw_groups(m)])
    ).any()
    other = rng.normal(size=(m, 37))
    # baseline = the reference's copy: KID exactly 0; candidate = baseline: delta exactly 0
    # with the interval [0, 0]
    d = kid_delta(x, other, x.copy(), m)
    assert d.baseline == 0.0 and d.candidate != 0.0
    same = kid_delta(other, other.copy(), x, m)
    assert same.delta == 0.0 and same.interval == Interval(low=0.0, high=0.0, level=0.95, n=m)


def test_the_interval_is_seeded_and_draws_the_prompts_the_other_intervals_draw():
    rng = np.random.default_rng(2)
    m = 20
    fb, fr = rng.normal(size=(m, 6)), rng.normal(size=(m, 6))
    fc = fb + rng.normal(size=(m, 6)) * 0.5
    first = kid_delta(fb, fc, fr, m)
    again = kid_delta(fb.copy(), torch.from_numpy(fc), fr.copy(), m)
    assert first == again and first.interval is not None
    assert first.interval.low < first.delta < first.interval.high
    assert (first.interval.level, first.interval.n) == (0.95, m)
    assert kid_delta(fb, fc, fr, m, None).interval is None
    # the prompts' draws are group_bootstrap's (PSNR, SSIM, CLIP): one resample, every figure
    seen: list[np.ndarray] = []
    group_bootstrap(np.arange(m)[:, None], lambda d: seen.append(d) or d.sum(axis=1), 0.95)
    assert np.array_equal(seen[0], draw_groups(m))


def test_a_reference_that_is_not_one_image_per_prompt_is_an_independent_set():
    rng = np.random.default_rng(4)
    fb, fc, fr = rng.normal(size=(10, 4)), rng.normal(size=(10, 4)) + 0.3, rng.normal(size=(7, 4))
    d = kid_delta(fb, fc, fr, 10)
    assert not d.paired and d.references == 7
    assert d.baseline == pytest.approx(unpaired_kid(fb, fr), rel=1e-12)
    assert d.candidate == pytest.approx(unpaired_kid(fc, fr), rel=1e-12)
    assert d.interval is not None and d.interval.low < d.delta < d.interval.high
    assert kid_delta(fb, fc, fr, 10) == d
    with pytest.raises(InputError, match="at least 2"):
        kid_delta(fb[:1], fc[:1], fr, 1)
    with pytest.raises(InputError, match="differ"):
        kid_delta(fb, fc[:5], fr, 10)


def _images_toward_the_reference(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Baseline images halfway to the reference images, the candidate far off."""
    ref = random_images(n, seed=40)
    base = ((ref.astype(int) + random_images(n, seed=41)) // 2).astype(np.uint8)
    cand = np.clip(base.astype(int) + 60, 0, 255).astype(np.uint8)
    return base, cand, ref


def test_t2i_quality_reports_kid_with_its_interval_and_the_report_judges_it():
    n = 16
    base, cand, ref = _images_toward_the_reference(n)
    q = t2i_quality(base, cand, [f"p{i}" for i in range(n)], fid_features=PooledFeatures(),
                    reference_images=ref, confidence=0.95)  # fmt: skip
    m = q.measured
    f = PooledFeatures()
    feats = [f(torch.from_numpy(a).permute(0, 3, 1, 2)).double() for a in (base, cand, ref)]
    assert m["kid_baseline_vs_reference"] == pytest.approx(paired_kid(feats[0], feats[2], n))
    assert m["kid_candidate_vs_reference"] == pytest.approx(paired_kid(feats[1], feats[2], n))
    assert m["kid_delta"] == pytest.approx(
        m["kid_candidate_vs_reference"] - m["kid_baseline_vs_reference"]
    )
    assert q.intervals is not None and q.intervals["kid_delta"].n == n
    assert q.labels["kid_delta"] == "KID vs reference, candidate - baseline [PooledFeatures]"
    kid_row = next(r for r in q.quality if r.metric.startswith("KID"))
    assert kid_row.note == f"n={n} prompts, paired by prompt"
    iv = q.intervals["kid_delta"]
    suite = t2i_suite(kid_delta_max=iv.high + 1.0, psnr_min=0.0)
    report = build_report(suite, q, created="")
    row = next(c for c in report.criteria if c.key == "kid_delta_max")
    assert (row.ci_low, row.ci_high, row.ci_level, row.n) == (iv.low, iv.high, 0.95, n)
    assert row.status == "PASS" and row.value == m["kid_delta"] and row.note == ""
    # report.json carries them; md and html show the row with its interval
    saved = AcceptanceReport.model_validate_json(report.to_json())
    assert saved.criteria == report.criteria
    md, page = render_markdown(report), render_html(report)
    interval = f"[{fmt(iv.low)}, {fmt(iv.high)}] (95%)"
    cells = [
        row.label,
        "cpu-reference",
        fmt(row.value),
        interval,
        str(n),
        f"<= {fmt(row.threshold)}",
    ]
    assert "| " + " | ".join(md_text(c) for c in cells) + " | PASS |" in md
    assert md_text("KID vs reference [PooledFeatures]") in md and "KID with each drawn prompt" in md
    assert "<td>" + "</td><td>".join(html.escape(c) for c in cells) + "</td>" in page


@pytest.mark.parametrize(
    ("bound", "shift", "status", "decide"),
    [
        (0.05, 0.0, "PASS", None),  # the whole interval [-0.01, 0.03] under the bound
        (0.005, 0.025, "FAIL", None),  # [0.015, 0.055]: wholly beyond it
        # straddled: middle 0.01, half-width 0.02, 0.01 from the bound: 512 x (0.02/0.01)^2
        (0.02, 0.0, "INCONCLUSIVE", 2048),
    ],
)
def test_kid_verdict_on_the_interval(bound, shift, status, decide):
    # (a bound below 0 is refused: the float model's own difference is 0, see test_registry)
    suite = t2i_suite(kid_delta_max=bound)
    interval = Interval(low=-0.01 + shift, high=0.03 + shift, level=0.95, n=512)
    measured = {"kid_delta": 0.01 + shift}
    (row,) = verdict(suite, measured, intervals={"kid_delta": interval}, samples=512)
    assert (row.key, row.measured_key, row.comparator) == ("kid_delta_max", "kid_delta", "<=")
    assert (row.status, row.samples_to_decide, row.n) == (status, decide, 512)
    if status == "INCONCLUSIVE":
        assert "about 2048 samples would decide it" in row.note


def test_kid_verdict_end_to_end_on_hand_built_images():
    n = 12
    base, cand, ref = _images_toward_the_reference(n)
    prompts = [f"p{i}" for i in range(n)]

    def judged(candidate: np.ndarray, bound: float) -> str:
        q = t2i_quality(base, candidate, prompts, fid_features=PooledFeatures(),
                        reference_images=ref, confidence=0.95)  # fmt: skip
        (row,) = verdict(t2i_suite(kid_delta_max=bound), q.measured, intervals=q.intervals)
        return row.status

    # the candidate = the baseline: delta and interval exactly 0, within a bound of 0
    assert judged(base, 0.0) == "PASS"
    # the candidate far off: its whole interval beyond a bound of 0
    assert judged(cand, 0.0) == "FAIL"


def test_the_shapes_suite_on_a_slice_judges_kid_and_reports_fd_with_its_n():
    # The built-in suite end to end (its dataset reference, the shapes CLIP features) on a
    # slice of 8 prompts at 4 steps (about 6 s): the full 512 serve the CLI and the benchmarks.
    from opsnn_quant.evaluation.evaluate import evaluate
    from opsnn_quant.evaluation.suite import load_suite
    from opsnn_quant.models import load_adapter
    from opsnn_quant.quant.api import quantize

    suite = load_suite("shapes-t2i")
    update = {"data": suite.data.model_copy(update={"samples": 8}),
              "generation": suite.generation.model_copy(update={"steps": 4, "batch_size": 8})}  # fmt: skip
    suite = suite.model_copy(update=update)
    baseline = load_adapter("diffusers-sd", "zoo:shapes-t2i")
    candidate = load_adapter("diffusers-sd", "zoo:shapes-t2i")
    quantize(candidate.model, {"unet.*": "w8a8_dynamic"}, None)  # per-token: no calibration
    report = evaluate(baseline, candidate, suite, latency="none", created="")
    rows = {c.key: c for c in report.criteria}
    kid = rows["kid_delta_max"]
    assert kid.measured_key == "kid_delta" and kid.label.endswith("[shapes-clip]")
    assert kid.ci_low is not None and kid.ci_high is not None
    assert kid.ci_low <= kid.value <= kid.ci_high and (kid.ci_level, kid.n) == (0.95, 8)
    assert kid.status in ("PASS", "INCONCLUSIVE", "FAIL") and "fid_delta_max" not in rows
    m = report.measured
    assert kid.value == m["kid_candidate_vs_reference"] - m["kid_baseline_vs_reference"]
    fd = next(q for q in report.quality if q.metric.startswith("FD vs reference"))
    assert fd.note == "n=8 vs 8 reference" and fd.delta == m["fid_delta"]
