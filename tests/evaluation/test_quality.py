"""Quality figures of candidate vs baseline on synthetic images and texts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.asr import asr_quality
from opsnn_quant.evaluation.clip_score import ClipScorer
from opsnn_quant.evaluation.fid import ClipImageFeatures, frechet_distance
from opsnn_quant.evaluation.t2i import t2i_quality
from tests.evaluation.conftest import random_images
from tests.evaluation.test_fid import PooledFeatures


def synthetic_images():
    base = random_images(4, seed=31)
    cand = base.copy()
    cand[1] = np.clip(base[1].astype(int) + 12, 0, 255).astype(np.uint8)  # PSNR ~ 26.6 dB
    cand[3] = np.clip(base[3].astype(int) + 3, 0, 255).astype(np.uint8)
    return base, cand


def test_t2i_quality(tiny_clip):
    model, processor = tiny_clip
    base, cand = synthetic_images()
    ref = random_images(5, seed=32)
    prompts = ["a", "b", "c", "d"]
    feats = ClipImageFeatures(model, "tiny-clip", mean=(0.5,) * 3, std=(0.5,) * 3)
    q = t2i_quality(base, cand, prompts, seeds=[0, 0, 0, 0], clip=ClipScorer(model, processor, "tiny"),
                    fid_features=feats, reference_images=ref)  # fmt: skip
    m = {k: v for k, v in q.measured.items() if v is not None}
    assert len(m) == len(q.measured)
    # Worst PSNR first: pair 1 (+12 offset, clipped), then 3, then the identical pairs 0 and 2.
    assert [p.index for p in q.image_pairs] == [1, 3, 0, 2]
    assert q.image_pairs[2].psnr_db == math.inf
    assert m["psnr_min_db"] == q.image_pairs[0].psnr_db
    assert m["psnr_median_db"] == math.inf  # two of four pairs identical
    assert m["clip_score_delta"] == pytest.approx(
        m["clip_score_candidate"] - m["clip_score_baseline"]
    )
    assert m["fid_delta"] == pytest.approx(
        m["fid_candidate_vs_reference"] - m["fid_baseline_vs_reference"]
    )
    assert m["fid_vs_baseline"] > 0
    # FD labels: never called FID.
    assert (
        q.labels["fid_vs_baseline"].startswith("FD ")
        and "tiny-clip (FD, not FID)" in q.labels["fid_vs_baseline"]
    )
    assert not any(r.metric.startswith("FID") for r in q.quality)
    assert any("not comparable with published FID" in n for n in q.notes)
    assert q.image_pairs[0].clip_baseline is not None and q.image_pairs[0].seed == 0


def test_t2i_quality_fid_value_matches_direct_computation():
    base, cand = synthetic_images()
    q = t2i_quality(base, cand, list("abcd"), fid_features=PooledFeatures())
    f = PooledFeatures()
    to = lambda a: f(torch.from_numpy(a).permute(0, 3, 1, 2)).double()  # noqa: E731
    assert q.measured["fid_vs_baseline"] == pytest.approx(frechet_distance(to(base), to(cand)))
    assert "PooledFeatures (FD, not FID)" in q.labels["fid_vs_baseline"]
    with pytest.raises(InputError, match="prompts"):
        t2i_quality(base, cand, ["a"])


def test_asr_quality_points():
    refs = ["the cat sat on the mat", "hello world"]
    base = ["the cat sat on the mat", "hello word"]
    cand = ["the bat sat on mat", "hello word"]
    q = asr_quality(refs, base, cand)
    m = q.measured
    # 8 reference words; baseline 1 error, candidate 3 errors: 12.5% -> 37.5%, +25 points.
    assert m["wer_baseline"] == pytest.approx(12.5) and m["wer_candidate"] == pytest.approx(37.5)
    assert m["wer_delta_points"] == pytest.approx(25.0)
    # Agreement: 2 edits over the baseline's 8 words.
    assert m["agreement_wer_points"] == pytest.approx(25.0)
    assert q.transcripts[0].index == 0 and q.transcripts[0].candidate_errors == 2


def test_a_chinese_report_shows_character_rates_only():
    from opsnn_quant.evaluation.asr import asr_quality
    from opsnn_quant.evaluation.text_norm import normalizer_for

    refs, base, cand = (
        ["今天天气很好。", "你好"],
        ["今天天气很好", "你好"],
        ["今天天汽很好吗", "你好"],
    )
    out = asr_quality(refs, base, cand, normalize=normalizer_for("zh"), confidence=0.95)
    assert [q.metric for q in out.quality] == ["CER", "agreement CER (candidate vs baseline)"]
    # 8 reference characters: the candidate's 2 errors; the baseline's none
    assert out.measured["cer_delta_points"] == pytest.approx(100 * 2 / 8)
    assert out.measured["agreement_cer_points"] == pytest.approx(100 * 2 / 8)
    assert {"cer_delta_points", "agreement_cer_points"} <= set(out.intervals)
    assert any("spaces dropped" in n for n in out.notes)
    assert "the candidate makes more errors on 1 utterances (2 characters in all)" in out.notes[-1]
