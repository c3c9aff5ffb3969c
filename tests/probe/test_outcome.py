"""A run's probe as its decision reads it (probe/outcome.py): pass 1 first, the estimators only
when asked, settled once into what the run keeps."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.api import ProbeResult
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.outcome import Probed
from tests.policy._factory import linear, report


class _Staged:
    """Pass 1 of a probe whose estimators have not run (what start_probe returns)."""

    def __init__(self, config: ProbeConfig):
        self.config, self.finished, self.released, self.finishes = config, False, False, 0

    def first(self, reason: str) -> ProbeResult:
        return ProbeResult(report(linear("a", 1e-4)).model_copy(update={"not_estimated": reason}))

    def finish(self, decided: object = ()) -> ProbeResult:
        self.finishes += 1
        self.decided = decided
        return ProbeResult(report(linear("a", 1e-4)))

    def release(self) -> None:
        self.released = True


def test_settled_on_pass_one_once_with_the_inputs_and_the_reason():
    staged, kept, said = _Staged(ProbeConfig()), [], []
    probed = Probed(None, staged, {"model": "m"}, keep=kept.append, say=said.append)  # type: ignore[arg-type]
    assert probed.first().report.not_estimated == "not settled" and kept == []
    result = probed.settle("strategy all-fp16 reads pass 1 only")
    assert result.report.not_estimated == "strategy all-fp16 reads pass 1 only"
    assert result.report.inputs == {"model": "m"} and kept == [result] and staged.released
    assert said == ["probe estimators skipped: strategy all-fp16 reads pass 1 only"]
    assert probed.settle("again") is result and kept == [result]  # settled once


def test_the_estimators_run_when_asked_timed_and_kept():
    staged, kept, timed = _Staged(ProbeConfig()), [], []

    @contextmanager
    def timer(phase):
        timed.append(phase)
        yield

    probed = Probed(None, staged, {"model": "m"}, keep=kept.append, timed=timer)  # type: ignore[arg-type]
    result = probed.estimated()
    assert result.report.not_estimated is None and result.report.inputs == {"model": "m"}
    assert timed == ["probe estimators"] and kept == [result] and staged.finishes == 1
    assert probed.estimated() is result and staged.finishes == 1


def test_an_offloaded_model_refuses_an_estimator_that_does_not_run_offloaded():
    staged, kept = _Staged(ProbeConfig(exhaustive=True)), []
    probed = Probed(None, staged, keep=kept.append, offload_remedy="leave out --max-memory")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"the search needs them: leave out --max-memory$"):
        probed.estimated()
    assert kept == [] and staged.finishes == 0
