"""The paired interval of a WER delta and the early verdict of a speech slice (issue 43 §2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from opsnn_quant.evaluation.sequential import (
    Errors,
    delta_interval,
    early_verdict,
    looks,
    utterance_errors,
)
from opsnn_quant.evaluation.slice_scorer import SliceScorer
from opsnn_quant.evaluation.suite import parse_suite
from opsnn_quant.thresholds import Thresholds


def test_utterance_errors_are_the_edits_after_normalisation():
    refs = ["the cat sat", "Hello, world!", "red green blue cyan"]
    hyps = ["the cat sat", "hello word", "red blue cyan pink"]
    e = utterance_errors(refs, hyps, "wer")
    # 0 edits; "world" -> "word": 1 substitution; "green" deleted, "pink" inserted: 2 edits
    assert e.errors == (0, 1, 2) and e.lengths == (3, 2, 4)


def test_delta_interval_by_hand():
    base = Errors((0, 0, 0, 0), (10, 10, 10, 10))
    same = delta_interval(base, base, 0.95)
    assert same == (0.0, 0.0, 0.0)  # no utterance differs: no resample can
    # one more error in every 10-word utterance: +10 points whatever the draw
    plus = delta_interval(base, Errors((1, 1, 1, 1), (10, 10, 10, 10)), 0.95)
    assert plus == pytest.approx((10.0, 10.0, 10.0))
    # 2 extra errors in one of 4 utterances of 10 words: +5 points; a draw has 0..4 copies of it
    one = delta_interval(base, Errors((2, 0, 0, 0), (10, 10, 10, 10)), 0.95)
    assert one[0] == pytest.approx(5.0) and one[1] == 0.0 and one[2] > 5.0
    assert one == delta_interval(base, Errors((2, 0, 0, 0), (10, 10, 10, 10)), 0.95)  # seeded


def test_early_verdict_needs_the_whole_interval_on_one_side():
    assert early_verdict(-1.0, 0.4, 0.5) is True
    assert early_verdict(0.6, 3.0, 0.5) is False
    assert early_verdict(-1.0, 0.6, 0.5) is None


def test_looks():
    assert looks(64) == [16, 32, 48, 64]
    assert looks(40) == [16, 32, 40]
    assert looks(16) == [16] and looks(8) == [8]


TRUTH = [f"w{chr(97 + i % 26)}{chr(97 + i // 26)} alpha beta gamma delta" for i in range(48)]


class FakeASR:
    """Transcribes utterance i as ``TRUTH[i]``; ``wrong`` utterances lose their last ``k``
    words. Records which utterances it was asked for."""

    task = "asr"
    model_id = "fake-asr"
    device = torch.device("cpu")

    def __init__(self, wrong: dict[int, int] | None = None) -> None:
        self.wrong = wrong or {}
        self.asked: list[int] = []

    def evaluation_inputs(self, records: list[dict[str, Any]]) -> list[int]:
        return [int(r["prompt"]) for r in records]

    def references(self, records: list[dict[str, Any]]) -> list[str]:
        return [TRUTH[int(r["prompt"])] for r in records]

    def generate(self, ids: list[int]) -> list[str]:
        self.asked += ids
        out = []
        for i in ids:
            words = TRUTH[i].split()
            out.append(" ".join(words[: len(words) - self.wrong.get(i, 0)]))
        return out


@pytest.fixture
def asr_suite(tmp_path: Path):
    (tmp_path / "prompts.txt").write_text("\n".join(str(i) for i in range(48)) + "\n")
    return parse_suite({
        "name": "s", "task": "asr", "data": {"folder": str(tmp_path), "samples": 48},
        "metrics": {"thresholds": {"wer_delta_max_points": 0.5}},
    })  # fmt: skip


def _records(n: int) -> list[dict[str, Any]]:
    return [{"prompt": str(i)} for i in range(n)]


def test_a_candidate_far_beyond_the_bound_fails_after_the_first_look(asr_suite):
    scorer = SliceScorer(FakeASR(), asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    bad = FakeASR({i: 2 for i in range(48)})  # 2 of 5 words lost everywhere: +40 points
    score = scorer.score(bad)
    assert not score.passed and bad.asked == list(range(16))  # 16 of 48 transcribed
    assert score.measured["wer_delta_points"] == pytest.approx(40.0)
    assert score.early is not None and score.early.startswith("decided after 16 of 48")
    assert "decided after 16 of 48 utterances: wer_delta +40 [+40, +40]" in score.describe()


def test_an_identical_candidate_passes_after_the_first_look(asr_suite):
    scorer = SliceScorer(FakeASR(), asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    same = FakeASR()
    score = scorer.score(same)
    assert score.passed and same.asked == list(range(16))


def test_a_candidate_near_the_bound_is_judged_on_the_whole_slice(asr_suite):
    # One word lost in one utterance of 48 (240 words): +0.42 points, under the 0.5 bound; in
    # the first 16 utterances (80 words) the interval reaches +1.25: no early verdict.
    scorer = SliceScorer(FakeASR(), asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    near = FakeASR({3: 1})
    score = scorer.score(near)
    assert near.asked == list(range(48)) and score.early is None
    assert score.passed and score.measured["wer_delta_points"] == pytest.approx(100 / 240)
