"""The coverage/quality front: candidate policies from the estimate, walked with measurements.

The probe's first-order estimate ranks modules well but misjudges how much error a modality's
real metric tolerates. So a budget in the user's terms (a WER bound, a PSNR floor) is met by
measuring:

1. **The ladder** (:func:`coverage_ladder`): the distinct policies the search builds when every
   modality gets the same predicted floor, from none (every candidate int8, its best scheme) up
   to a floor no int8 module meets. Each rung is the one before minus the modules with the
   largest estimated error per MAC (the search's fallback order, whole fused layers, the
   ``min_int8_mac_share`` rule): coverage falls rung by rung, down to all fp16.
2. **Starting points**: the naive baselines the target runs and the estimate's own proposal
   are measured first (:func:`walk_front`); the best one that passes sets the coverage to beat.
3. **The walk**: a bisection over the rungs with at least that coverage, measured: a passing
   rung moves up (adds int8 back where the metric has room), a failing one down (reverts the
   next group of worst-per-MAC modules), until neighbouring rungs are decided or
   ``max_evaluations`` is spent.
4. **The choice**: among everything measured that passes, the most int8 MACs, then the best
   quality (the bounds' figures in order). A baseline that passes is a candidate like any rung,
   so the choice has at least its coverage, and at equal coverage at least its quality. A
   candidate with no int8 module is float: it passes without being measured.

The measurement itself (quantize, generate, score) is the caller's ``measure`` callback: this
module only orders and chooses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.baselines import NAIVE_SCHEMES, naive_policy
from opsnn_quant.policy.budget import Budget, ModalityLimit
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.summary import int8_mac_shares, measured_kinds
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Progress

log = logging.getLogger(__name__)

# Uniform predicted floors the ladder is built at (dB): fine enough that neighbouring rungs
# differ by a few modules on the zoo models; past 80 dB no int8 module is ever predicted.
LADDER_FLOORS_DB: tuple[float, ...] = tuple(x / 2 for x in range(0, 161))


@dataclass(frozen=True)
class Measurement:
    """What the caller's measurement says about one candidate policy.

    Attributes:
        passed: every bound holds.
        quality: the bounds' figures, each signed so that larger is better.
        detail: the figures in one phrase (notes and summary).
    """

    passed: bool
    quality: tuple[float, ...]
    detail: str


Measure = Callable[[PrecisionPolicy], Measurement]


@dataclass(frozen=True)
class Candidate:
    """A policy on (or off) the front, with the share of the model's MACs it puts in int8.

    Attributes:
        label: where it comes from (``all-w8a8-dynamic``, ``estimate``, ``floor 31.5 dB``).
        policy: the policy.
        share: its int8 share of all probed MACs.
        key: its decisions (module -> spec), to recognise the same policy under two labels.
        kinds: what the share counts (:func:`~opsnn_quant.policy.summary.measured_kinds`).
    """

    label: str
    policy: PrecisionPolicy
    share: float
    key: tuple[tuple[str, object], ...] = field(repr=False)
    kinds: str = "Linear/Conv2d"

    @classmethod
    def of(cls, label: str, policy: PrecisionPolicy, report: SensitivityReport) -> Candidate:
        """``policy`` resolved against ``report``'s modules, its int8 share counted."""
        resolved = policy.resolved(report.inventory(), report.weight_shapes(), tied=report.tied())
        int8 = [n for n, s in resolved.specs.items() if isinstance(s, QuantSpec)]
        share = int8_mac_shares(report, int8)["overall"]
        return cls(label, policy, share, tuple(resolved.specs.items()), measured_kinds(report))

    def predicted(self) -> str:
        """The search's predicted SQNR per modality, e.g. ``audio_encoder 31.2 dB``."""
        parts = [
            f"{m.value} {f.predicted_sqnr_db:.1f} dB"
            for m, f in self.policy.figures.items()
            if f.chosen == "int8" and f.predicted_sqnr_db is not None
        ]
        return ", ".join(parts) or "not estimated"


@dataclass(frozen=True)
class Round:
    """One candidate the walk looked at.

    Attributes:
        candidate: the candidate.
        measurement: its measurement (None: float, passes unmeasured).
        seconds: wall time of the measurement.
    """

    candidate: Candidate
    measurement: Measurement | None
    seconds: float

    @property
    def passed(self) -> bool:
        """Whether the candidate meets the bounds (a float one does)."""
        return self.measurement is None or self.measurement.passed

    def rank(self) -> tuple[float, tuple[float, ...]]:
        """Coverage first, then quality: what the choice maximises (coverage rounded so that
        two policies with the same int8 modules compare equal)."""
        quality = self.measurement.quality if self.measurement else (math.inf,)
        return round(self.candidate.share, 9), quality

    def note(self, index: int, timed: bool = False) -> str:
        """One line for the policy's notes (no wall time there: a policy is the same bytes on
        a rerun) and, ``timed``, for the summary printed after a run."""
        c, m = self.candidate, self.measurement
        verdict = "float, passes unmeasured" if m is None else (
            f"{'PASS' if m.passed else 'FAIL'}: {m.detail}"
        )  # fmt: skip
        line = (
            f"measured round {index} ({c.label}): {c.share:.1%} of the {c.kinds} MACs in int8 on "
            f"{c.policy.target} (what its engine runs), predicted {c.predicted()}; {verdict}"
        )
        return f"{line}; {self.seconds:.0f} s" if timed else line


@dataclass(frozen=True)
class FrontResult:
    """The walk's outcome: the chosen round and every round, in the order measured."""

    chosen: Round
    rounds: list[Round]
    skipped: str | None = None  # why the walk stopped before the estimate's ladder

    @property
    def evaluations(self) -> int:
        """Measurements spent."""
        return sum(r.measurement is not None for r in self.rounds)

    def notes(self, timed: bool = False) -> list[str]:
        """Every round, then the choice, one line each (``timed``: with each round's seconds)."""
        c = self.chosen.candidate
        why = (
            f"; {self.skipped}" if self.skipped else
            ": the most int8 MACs among the candidates that pass, then the best measured quality"
        )  # fmt: skip
        return [r.note(i + 1, timed) for i, r in enumerate(self.rounds)] + [
            f"measured search chose {c.label} ({c.share:.1%} of the {c.kinds} MACs in int8) after "
            f"{self.evaluations} evaluation(s){why}"
        ]

    def policy(self) -> PrecisionPolicy:
        """The chosen policy, with :meth:`notes` in its notes."""
        return self.chosen.candidate.policy.with_notes(*self.notes())


def coverage_ladder(
    report: SensitivityReport,
    budget: Budget,
    target: Target,
    floors: Sequence[float] = LADDER_FLOORS_DB,
) -> list[Candidate]:
    """The distinct policies the search builds at a uniform predicted floor, most int8 first.

    Args:
        report: the probe report.
        budget: the recipe's budget (its ``min_int8_mac_share``; its limits are replaced by
            each rung's floor).
        target: the target.
        floors: the floors tried (dB) after "no floor".

    Returns:
        One candidate per distinct set of decisions, by falling int8 share (ties: lower floor
        first), the no-floor policy first and an all-fp16 one last.
    """
    seen: dict[tuple[tuple[str, object], ...], Candidate] = {}
    modalities = {m.modality for m in report.modules}
    for floor in (None, *floors):
        limits = {} if floor is None else {m: ModalityLimit(min_sqnr_db=floor) for m in modalities}
        rung_budget = budget.model_copy(update={"limits": limits, "default": None})
        policy = build_policy(report, rung_budget, target)
        label = "no floor" if floor is None else f"floor {floor:g} dB"
        cand = Candidate.of(label, policy, report)
        seen.setdefault(cand.key, cand)
    # the bottom rung is always float (a module predicted error-free stays int8 at any floor)
    fp16 = Candidate.of("all fp16", naive_policy(report, target, "all-fp16"), report)
    seen.setdefault(fp16.key, fp16)
    ladder = list(seen.values())  # the order of the floors: rising floors, falling shares
    ladder.sort(key=lambda c: -c.share)  # stable: a share that rose again keeps its floor order
    return ladder


class FrontWalk:
    """The measured candidates and the evaluations left: :func:`walk_front` in steps, for a
    caller that decides between them whether the rest is needed (``calibrate`` measures the
    naive baselines before paying for the estimate the ladder is built from)."""

    def __init__(self, measure: Measure, max_evaluations: int, say: Progress) -> None:
        if max_evaluations < 1:
            raise ConfigError("budget.max_evaluations must be at least 1")
        self.measure, self.left, self.say = measure, max_evaluations, say
        self.rounds: list[Round] = []
        self.done: dict[tuple[tuple[str, object], ...], Round] = {}

    def visit(self, cand: Candidate) -> Round | None:
        """The candidate's round (measured now unless seen, float, or out of evaluations)."""
        if cand.key in self.done:
            return self.done[cand.key]
        if cand.share == 0.0:
            found = Round(cand, None, 0.0)
        elif self.left <= 0:
            return None
        else:
            self.left -= 1
            self.say(f"measuring {cand.label} ({cand.share:.1%} of the {cand.kinds} MACs in int8)")
            started = time.perf_counter()
            measurement = self.measure(cand.policy)
            found = Round(cand, measurement, time.perf_counter() - started)
            log.info("%s", found.note(len(self.rounds) + 1))
        self.done[cand.key] = found
        self.rounds.append(found)
        return found

    def best(self) -> Round | None:
        """The passing round with the most int8 MACs, then the best quality."""
        passing = [r for r in self.rounds if r.passed]
        return max(passing, key=Round.rank) if passing else None

    def passed_at(self, share: float) -> Round | None:
        """The best passing round if it has at least ``share`` of the MACs in int8 (None: no
        round that passes has): no candidate can have more, so the walk may stop there."""
        best = self.best()
        if best is None or round(best.candidate.share, 9) < round(share, 9):
            return None
        return best

    def bisect(self, ladder: Sequence[Candidate]) -> None:
        """Bisect ``ladder``'s rungs above the best passing round so far (see :func:`_bisect`)."""
        _bisect(self, list(ladder))

    def result(self, ladder: Sequence[Candidate] = (), skipped: str | None = None) -> FrontResult:
        """The choice (a float rung of ``ladder``, free, when nothing measured passed);
        ``skipped``: why the walk stopped before the ladder (said in the notes).

        Raises:
            ConfigError: nothing passed and no float candidate was given to fall back to.
        """
        if self.best() is None:
            for cand in ladder:
                if cand.share == 0.0:
                    self.visit(cand)
        chosen = self.best()
        if chosen is None:
            raise ConfigError(
                f"no candidate policy met budget.metric in {len(self.rounds)} round(s) and "
                "none was float; raise max_evaluations or loosen the bound"
            )
        return FrontResult(chosen, self.rounds, skipped)


def walk_front(
    starts: Sequence[Candidate],
    ladder: Sequence[Candidate],
    measure: Measure,
    max_evaluations: int,
    progress: Progress | None = None,
) -> FrontResult:
    """Measure the starting points, bisect the ladder above the best of them, choose.

    Args:
        starts: measured first, in order (the baselines, the estimate's proposal).
        ladder: :func:`coverage_ladder`'s rungs, most int8 first.
        measure: measures one policy against the bounds.
        max_evaluations: measurements allowed in all (a float candidate costs none).
        progress: told about each measurement.

    Returns:
        The chosen round and every round.

    Raises:
        ConfigError: ``max_evaluations`` < 1, no candidate at all, or nothing measured passes
            and no float candidate was given to fall back to.
    """
    walk = FrontWalk(measure, max_evaluations, progress or (lambda m: log.info("%s", m)))
    for cand in starts:
        walk.visit(cand)
    walk.bisect(ladder)
    return walk.result(ladder)


def _bisect(walk: FrontWalk, ladder: list[Candidate]) -> None:
    """Bisect the rungs with at least the int8 share of the best passing round so far (an
    equal share may still measure better): the first rung is measured, then the middle of the
    undecided span, until it closes or the budget ends."""
    best = walk.best()
    floor_share = round(best.candidate.share, 9) if best else -1.0
    rungs = [c for c in ladder if round(c.share, 9) >= floor_share]
    if not rungs:
        return
    first = walk.visit(rungs[0])
    if first is None or first.passed:
        return
    lo, hi = 0, len(rungs)  # rungs[lo] fails; rungs[hi:] are no better than the best so far
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = walk.visit(rungs[mid])
        if found is None:
            return
        if found.passed:
            hi = mid
        else:
            lo = mid


# ---- the starting points: the naive baselines, then the estimate ----------------------------


def decided_first(label: str, share: float) -> str:
    """The note of a search that stopped at a baseline with full int8 coverage."""
    return (
        f"{label} met budget.metric with every module the target runs in int8 ({share:.1%} of "
        "the MACs): no candidate has more int8 MACs, so the search stopped there and the "
        "probe's estimators (SmoothQuant search, local errors, attribution) did not run"
    )


def baseline_candidates(
    report: SensitivityReport, target: Target, schemes: Sequence[str] | None = None
) -> list[Candidate]:
    """The naive int8 baselines ``target`` runs (with an int8 module; whose scheme is among
    ``schemes`` when given): they need pass 1 only."""
    starts = []
    keys = set()
    for strategy, used in NAIVE_SCHEMES.items():
        if schemes is not None and not set(used) <= set(schemes):
            continue
        policy = naive_policy(report, target, strategy)
        cand = Candidate.of(strategy, policy, report)
        # with attention, the same as without on a target (or a model) without int8 attention
        if policy.rules and cand.key not in keys:
            starts.append(cand)
            keys.add(cand.key)
    return starts


def estimate_candidates(
    report: SensitivityReport, target: Target, budget: Budget
) -> list[Candidate]:
    """The estimate's own policy at the budget's predicted limits (none without limits)."""
    if not (budget.limits or budget.default is not None):
        return []
    estimate = build_policy(report, budget, target)
    return [Candidate.of("estimate at the recipe's limits", estimate, report)]
