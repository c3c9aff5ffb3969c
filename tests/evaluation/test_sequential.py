"""The paired interval of a WER delta and the sequential verdict of a speech slice (issue 43 §2,
issue 44 §4: a candidate passes only when its interval does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel

from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.evaluation.sequential import (
    MIN_PASS,
    Errors,
    delta_interval,
    levels,
    looks,
    utterance_errors,
)
from opsnn_quant.evaluation.slice_scorer import SliceScorer
from opsnn_quant.evaluation.suite import parse_suite


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


def test_levels_share_alpha_over_the_looks_and_beta_over_the_early_ones():
    # 4 looks at 95 %: each at 1 - 0.05/4; futility one-sided 1 - 0.2/3, i.e. two-sided 1 - 0.4/3
    assert levels(4) == pytest.approx((0.9875, 1 - 0.4 / 3))
    assert levels(3, confidence=0.9) == pytest.approx((1 - 0.1 / 3, 0.8))
    assert levels(1) == pytest.approx((0.95, 1.0))  # one look: no futility stop


def test_looks():
    # a first look after half a group, then every 16
    assert looks(64) == [8, 16, 32, 48, 64]
    assert looks(40) == [8, 16, 32, 40]
    assert looks(16) == [8, 16] and looks(8) == [8] and looks(5) == [5]


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
    base = FakeASR()
    scorer = SliceScorer(base, asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    assert base.asked == list(range(8))  # the float outputs of the first look only
    bad = FakeASR({i: 2 for i in range(48)})  # 2 of 5 words lost everywhere: +40 points
    score = scorer.score(bad)
    assert not score.passed and score.status == "FAIL" and bad.asked == list(range(8))
    assert score.measured["wer_delta_points"] == pytest.approx(40.0)
    # 4 looks (8, 16, 32, 48): each at 1 - 0.05/4 = 98.75 %
    assert score.describe() == (
        "wer_delta_points +40 [+40, +40] (<= 0.5, 98.8%); decided after 8 of 48 utterances"
    )
    assert base.asked == list(range(8))  # no float output beyond what the candidate needed


def test_an_identical_candidate_passes_at_the_second_look(asr_suite):
    # Its interval is [+0, +0] from the first look on; no look of fewer than MIN_PASS passes
    scorer = SliceScorer(FakeASR(), asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    same = FakeASR()
    score = scorer.score(same)
    assert MIN_PASS == 16
    assert score.passed and score.status == "PASS" and same.asked == list(range(16))
    assert score.early == "decided after 16 of 48 utterances"


def test_harm_the_first_look_did_not_draw_is_not_passed(asr_suite):
    # Utterances 10, 20, 30 and 40 lose 2 of their 5 words (+3.3 points on the slice); the first
    # 8 are transcribed as the float model does, so their interval is [+0, +0]: a pass of any
    # bound, were 8 utterances enough. At 16, one harmed of 16: undecided (the 93.3 % lower
    # bound is 0: a draw of 16 misses it with chance (15/16)^16 = 36 %); at 32, three of 32:
    # a draw misses all three with chance (29/32)^32 = 4.3 %, under the 6.7 % futility tail,
    # so the lower bound is one copy of 2 words in 160 = +1.25 > 0.5: it fails.
    scorer = SliceScorer(FakeASR(), asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    first = scorer._look(FakeASR(), TRUTH[:8], last=False)  # what the first look alone says
    assert first is None  # not a pass on 8
    cand = FakeASR({10: 2, 20: 2, 30: 2, 40: 2})
    score = scorer.score(cand)
    assert not score.passed and score.status == "FAIL" and cand.asked == list(range(32))
    assert score.early == (
        "cannot pass after 32 of 48 utterances: the 93.3% lower bound of wer_delta_points is "
        "+1.25 > 0.5 (futility)"
    )


def test_an_undecided_candidate_stops_for_futility(asr_suite):
    # Utterances 0-2 of the first 8 lose 2 of their 5 words: +15 points. The 98.75 % interval
    # reaches 0 (a draw of 8 misses all three with chance (5/8)^8 = 2.3 %, more than the
    # 0.625 % tail): undecided. The futility level (4 looks, 3 early: one-sided 1 - 0.2/3,
    # lower tail 6.7 %) puts the lower bound at one copy of 2 words in 40 = +5 > 0.5.
    scorer = SliceScorer(FakeASR(), asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    cand = FakeASR({0: 2, 1: 2, 2: 2})
    score = scorer.score(cand)
    assert cand.asked == list(range(8)) and not score.passed and score.status == "FAIL"
    assert score.criteria[0].ci_low == 0.0  # undecided on the decision level
    assert score.early == (
        "cannot pass after 8 of 48 utterances: the 93.3% lower bound of wer_delta_points is "
        "+5 > 0.5 (futility)"
    )


def test_a_candidate_near_the_bound_is_inconclusive_on_the_whole_slice(asr_suite):
    # One word lost in one utterance of 48 (240 words): +0.42 points, under the 0.5 bound, but
    # a resample may draw that utterance 3 times (+1.25): the interval straddles the bound at
    # every look, so the whole slice is transcribed and the candidate does not pass.
    base = FakeASR()
    scorer = SliceScorer(base, asr_suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    near = FakeASR({3: 1})
    score = scorer.score(near)
    assert near.asked == list(range(48)) and score.early is None
    assert base.asked == list(range(48))  # the float outputs followed the candidate
    assert not score.passed and score.status == "INCONCLUSIVE"
    assert score.measured["wer_delta_points"] == pytest.approx(100 / 240)
    row = score.criteria[0]
    assert row.ci_low is not None and row.ci_low <= 0.5 < row.ci_high  # type: ignore[operator]
    assert row.samples_to_decide is not None and row.samples_to_decide > 48


class Settings(BaseModel):
    batch_size: int = 4
    max_new_tokens: int = 40


class SettledASR(FakeASR):
    """A FakeASR with an adapter's settings; records those each generate call ran with."""

    def __init__(self, wrong: dict[int, int] | None = None) -> None:
        super().__init__(wrong)
        self.settings = Settings()
        self.seen: set[tuple[int, int]] = set()

    def generate(self, ids: list[int]) -> list[str]:
        self.seen.add((self.settings.batch_size, self.settings.max_new_tokens))
        return super().generate(ids)


def test_the_float_model_generates_with_the_suites_settings_and_keeps_its_own(tmp_path):
    # The measured search scores on the run's own float model (no copy), which calibrate goes
    # on with: it must generate with the suite's settings and get its own back after each look.
    (tmp_path / "prompts.txt").write_text("\n".join(str(i) for i in range(48)) + "\n")
    suite = parse_suite({
        "name": "s", "task": "asr", "data": {"folder": str(tmp_path), "samples": 48},
        "generation": {"batch_size": 8, "max_new_tokens": 128},
        "metrics": {"thresholds": {"wer_delta_max_points": 0.5}},
    })  # fmt: skip
    base = SettledASR()
    scorer = SliceScorer(base, suite, Thresholds(wer_delta_max_points=0.5), _records(48))
    assert base.asked == list(range(8)) and base.settings == Settings()
    candidate = SettledASR({3: 1})
    scorer.score(candidate)  # to the end: the later float outputs from the same model
    assert base.asked == list(range(48)) and base.seen == {(8, 128)}
    assert base.settings == Settings() and candidate.settings == Settings()
    assert candidate.seen == {(8, 128)}
    scorer.score(SettledASR({3: 1}))  # the float outputs are kept: not generated again
    assert base.asked == list(range(48))
