"""PSNR/SSIM per image pair on cases with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opsnn_quant.errors import ShapeError
from opsnn_quant.evaluation.image_similarity import pair_similarities, psnr, ssim, summarize
from opsnn_quant.evaluation.images import as_uint8_nchw, as_uint8_nhwc
from tests.evaluation.conftest import random_images


def test_identical_images():
    imgs = random_images(2, seed=21)
    rows = pair_similarities(imgs, imgs.copy())
    assert [r.psnr_db for r in rows] == [math.inf, math.inf]
    assert [r.ssim for r in rows] == pytest.approx([1.0, 1.0])
    assert rows[0].mae == 0.0 and rows[0].max_abs == 0


@pytest.mark.parametrize("offset", [1, 5, 20])
def test_constant_offset_psnr_by_formula(offset):
    # MSE = offset² everywhere, so PSNR = 10·log10(255² / offset²) = 20·log10(255 / offset).
    base = np.full((1, 16, 16, 3), 100, np.uint8)
    cand = base + np.uint8(offset)
    row = pair_similarities(base, cand)[0]
    assert row.psnr_db == pytest.approx(20 * math.log10(255 / offset), abs=1e-9)
    assert row.mae == offset and row.max_abs == offset


def test_ssim_of_constant_offset_by_formula():
    # Flat images: σ = 0 in every window, so SSIM reduces to the luminance term
    # (2·μa·μb + C1) / (μa² + μb² + C1) with C1 = (0.01·255)².
    a = np.full((16, 16, 3), 100, np.uint8)
    b = np.full((16, 16, 3), 120, np.uint8)
    c1 = (0.01 * 255) ** 2
    assert ssim(a, b) == pytest.approx((2 * 100 * 120 + c1) / (100**2 + 120**2 + c1), rel=1e-6)


def test_noise_lowers_ssim_and_summary():
    base = random_images(3, seed=22)
    rng = np.random.default_rng(0)
    noisy = np.clip(base.astype(int) + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    cand = np.stack([base[0], noisy[1], noisy[2]])
    rows = pair_similarities(base, cand)
    assert rows[0].psnr_db == math.inf and rows[1].ssim < 0.99
    s = summarize(rows)
    assert s.psnr_worst == min(rows[1].psnr_db, rows[2].psnr_db)
    assert s.psnr_median == pytest.approx(max(rows[1].psnr_db, rows[2].psnr_db))
    assert s.ssim_mean == pytest.approx(np.mean([r.ssim for r in rows]))
    assert s.ssim_worst == min(r.ssim for r in rows)


def test_psnr_matches_definition_on_random_pair():
    a, b = random_images(2, seed=23)
    mse = np.mean((a.astype(float) - b.astype(float)) ** 2)
    assert psnr(a, b) == pytest.approx(10 * math.log10(255**2 / mse), rel=1e-12)


def test_input_layouts_and_errors():
    imgs = random_images(2, seed=24)
    nchw = torch.from_numpy(imgs).permute(0, 3, 1, 2)
    assert np.array_equal(as_uint8_nhwc(nchw), imgs)
    assert np.array_equal(as_uint8_nhwc(imgs.astype(np.float32) / 255.0), imgs)
    from PIL import Image

    assert np.array_equal(as_uint8_nhwc([Image.fromarray(i) for i in imgs]), imgs)
    assert as_uint8_nchw(imgs).shape == (2, 3, 32, 32)
    with pytest.raises(ShapeError, match="differ"):
        pair_similarities(imgs, imgs[:1])
    with pytest.raises(ShapeError, match="3 channels"):
        as_uint8_nhwc(np.zeros((2, 8, 8, 4), np.uint8))
    with pytest.raises(ShapeError, match="3×3"):
        ssim(np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2, 3), np.uint8))
