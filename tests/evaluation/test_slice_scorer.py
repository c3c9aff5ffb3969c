"""SliceScorer: a suite's metrics on a slice of its data, judged against a budget's bounds."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.evaluate import suite_records
from opsnn_quant.evaluation.slice_scorer import SliceScorer
from opsnn_quant.evaluation.suite import parse_suite

PROMPTS = [f"prompt {i}" for i in range(8)]


class FakeT2I:
    """Images of 128 everywhere; the candidate adds ``offsets[prompt]`` to every pixel."""

    task = "t2i"
    model_id = "fake"
    device = torch.device("cpu")

    def __init__(self, offsets: dict[str, int] | None = None) -> None:
        self.offsets = offsets or {}
        self.seen: list[tuple[list[str], int]] = []

    def evaluation_inputs(self, records: list[dict[str, Any]]) -> list[str]:
        return [r["prompt"] for r in records]

    def generate(self, prompts: list[str], seed: int = 0) -> list[np.ndarray]:
        self.seen.append((list(prompts), seed))
        return [np.full((8, 8, 3), 128 + self.offsets.get(p, 0), np.uint8) for p in prompts]


@pytest.fixture
def suite(tmp_path: Path):
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    return parse_suite({
        "name": "s", "task": "t2i", "data": {"folder": str(tmp_path), "samples": 2},
        "metrics": {"fid_features": None, "thresholds": {"psnr_min": 99.0}},
    })  # fmt: skip


def _psnr(offset: int) -> float:
    # PSNR of a constant error e on uint8 images: 10 log10(255^2 / e^2)
    return 10 * math.log10(255**2 / offset**2)


def test_slice_starts_after_the_suites_own_samples(suite):
    assert [r["prompt"] for r in suite_records(suite)] == PROMPTS[:2]
    assert [r["prompt"] for r in suite_records(suite, 2, 3)] == PROMPTS[2:5]
    with pytest.raises(ConfigError, match="has 8 records, fewer than the 9 needed"):
        suite_records(suite, 2, 7)


def test_psnr_bound_is_judged_on_the_slice_with_the_users_bound(suite):
    # Slice = prompts 2, 3, 4, each with error 4: median PSNR 36.09 dB whatever the resample.
    # The user's bound (30 dB) is judged, not the suite's own 99 dB.
    base = FakeT2I()
    scorer = SliceScorer(base, suite, Thresholds(psnr_min=30.0), suite_records(suite, 2, 3))
    assert base.seen == [(PROMPTS[2:5], 0)]  # the float outputs: generated once
    cand = FakeT2I({"prompt 2": 4, "prompt 3": 4, "prompt 4": 4})
    score = scorer.score(cand)
    assert score.measured["psnr_median_db"] == pytest.approx(_psnr(4))
    # quality: the bound's figure, then the t2i closeness figure (the same median PSNR)
    assert score.passed and score.quality == pytest.approx((_psnr(4), _psnr(4)))
    assert score.describe() == (
        f"psnr_median_db {_psnr(4):.4g} [{_psnr(4):.4g}, {_psnr(4):.4g}] (>= 30, 95.0%)"
    )
    strict = SliceScorer(FakeT2I(), suite, Thresholds(psnr_min=40.0), suite_records(suite, 2, 3))
    assert strict.score(cand).status == "FAIL"


def test_a_slice_whose_interval_straddles_the_bound_does_not_pass(suite):
    # Errors 1, 4, 16: median PSNR that of 4 (36.09 dB, above the 30 dB bound), but a resample
    # of three prompts may draw the worst one twice (24.05 dB): INCONCLUSIVE, not a pass.
    scorer = SliceScorer(FakeT2I(), suite, Thresholds(psnr_min=30.0), suite_records(suite, 2, 3))
    score = scorer.score(FakeT2I({"prompt 2": 1, "prompt 3": 4, "prompt 4": 16}))
    assert score.measured["psnr_median_db"] == pytest.approx(_psnr(4))
    assert not score.passed and score.status == "INCONCLUSIVE"
    assert score.criteria[0].ci_low == pytest.approx(_psnr(16))


def test_bounds_that_cannot_judge_a_slice_are_refused(suite):
    with pytest.raises(ConfigError, match="sets no bound"):
        SliceScorer(FakeT2I(), suite, Thresholds(), suite_records(suite))
    with pytest.raises(ConfigError, match="latency_p99_ratio_max is a speed bound"):
        SliceScorer(FakeT2I(), suite, Thresholds(latency_p99_ratio_max=1.0), [])


def test_a_model_of_another_task_is_refused(suite):
    asr = FakeT2I()
    asr.task = "asr"
    with pytest.raises(ConfigError, match="is a t2i suite, but fake is a asr model"):
        SliceScorer(asr, suite, Thresholds(psnr_min=30.0), suite_records(suite))
