"""A run's probe as its decision reads it: pass 1 at least, the estimators only when asked.

A decision that may read pass 1 alone (a naive baseline; a measured search that stops at a
baseline) starts the probe with pass 1 (:func:`~opsnn_quant.probe.api.start_probe`) and asks for
the estimators (:meth:`Probed.estimated`) only when it needs them; either way the probe is
*settled* once (:meth:`Probed.settle`): its report, with the inputs' fingerprints, is handed to
the run (``keep``: ``probe.json``) and is what every later phase reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.api import ProbeResult, StagedProbe, check_offloaded_estimators
from opsnn_quant.recording import RecordedRoots
from opsnn_quant.types import Progress


def _untimed(phase: str) -> AbstractContextManager[None]:
    return nullcontext()


@dataclass
class Probed:
    """The probe phase's outcome: pass 1 at least, the estimators when the decision asks.

    Attributes:
        result: the settled result (None until :meth:`settle`).
        staged: pass 1 of a probe whose estimators have not run (None: not staged).
        inputs: the fingerprints of the model and data, for the report.
        keep: what the run does with the settled result (writes ``probe.json``).
        say: progress callback.
        timed: times a phase of the run (``probe estimators``).
        offload_remedy: the model is offloaded: an estimator that does not run offloaded is
            refused, the message ending with this remedy (None: not offloaded).
        rerun: the whole probe (the modalities already decided given), for a result of pass 1
            alone (a reused report) when the decision needs the estimators after all (None:
            not needed).
    """

    result: ProbeResult | None
    staged: StagedProbe | None = None
    inputs: dict[str, str] = field(default_factory=dict)
    keep: Callable[[ProbeResult], None] = lambda result: None
    say: Progress = lambda message: None
    timed: Callable[[str], AbstractContextManager[None]] = _untimed
    offload_remedy: str | None = None
    rerun: Callable[[Collection[str]], ProbeResult] | None = None

    def first(self) -> ProbeResult:
        """Pass 1's result (the settled one once settled): enough for the naive baselines."""
        if self.result is not None:
            return self.result
        assert self.staged is not None
        return self.staged.first("not settled")

    def recorded(self) -> RecordedRoots | None:
        """The root calls pass 1 kept, with their float outputs (replayed now: call it before
        quantize swaps any module); None where the probe is not staged (a reused report)."""
        if self.staged is not None and self.result is None:
            return self.staged.recorded()
        return None

    def estimated(self, decided: Collection[str] = ()) -> ProbeResult:
        """The whole probe: the estimators run now on pass 1's run (if staged), for every
        modality but those ``decided`` (names; see :meth:`StagedProbe.finish`).

        Raises:
            ConfigError: the model is offloaded and an estimator does not run offloaded.
        """
        if self.result is not None and self.result.report.not_estimated is None:
            return self.result
        if self.staged is None and self.rerun is not None:  # a reused report of pass 1 alone
            with self.timed("probe estimators"):
                return self.settled(self.rerun(decided))
        assert self.staged is not None, "a settled probe without estimates cannot run them"
        if self.offload_remedy is not None:
            try:
                check_offloaded_estimators(self.staged.config)
            except ConfigError as e:
                raise ConfigError(
                    f"{e}; no naive baseline met budget.metric, so the search needs them: "
                    f"{self.offload_remedy}"
                ) from None
        with self.timed("probe estimators"):
            return self.settled(self.staged.finish(decided))

    def settle(self, reason: str) -> ProbeResult:
        """The result the run goes on with: the whole probe if it ran, else pass 1's, its
        report saying why no estimator ran (``reason``)."""
        if self.result is not None:
            return self.result
        assert self.staged is not None
        if self.staged.finished:
            return self.settled(self.staged.finish())
        self.say(f"probe estimators skipped: {reason}")
        result = self.settled(self.staged.first(reason))
        self.staged.release()  # inputs and calls kept for the estimators: not needed
        return result

    def settled(self, probed: ProbeResult) -> ProbeResult:
        """``probed`` with the inputs' fingerprints, handed to ``keep``."""
        report = probed.report.model_copy(update={"inputs": self.inputs})
        self.result = dataclasses.replace(probed, report=report)
        self.keep(self.result)
        return self.result
