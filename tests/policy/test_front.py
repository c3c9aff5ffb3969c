"""The measured front walk on hand-built reports: the ladder's rungs and the walk's choices can
be worked out by hand (contributions are relative noise energies; a floor of F dB allows
``10 ** (-F / 10)``)."""

import re

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.baselines import naive_policy
from opsnn_quant.policy.budget import Budget
from opsnn_quant.policy.front import (
    Candidate,
    Measurement,
    baseline_candidates,
    coverage_ladder,
    estimate_candidates,
    walk_front,
)
from opsnn_quant.policy.targets import get_target

from ._factory import linear, report

ATC = get_target("ascend910b-atc")
# Four equal-MAC Linears; the fallback order is contribution per MAC: d, c, b, a.
REP = report(linear("a", 1e-5), linear("b", 1e-4), linear("c", 1e-3), linear("d", 1e-2))
NO_SHARE_RULE = Budget(min_int8_mac_share=0.0)


def _int8(cand: Candidate) -> list[str]:
    return sorted(n for n, s in cand.key if hasattr(s, "smoothquant"))


def test_ladder_drops_worst_per_mac_one_rung_at_a_time():
    # No floor: all four (sum 1.111e-2, 19.5 dB). Floors up to 19.5 dB keep all; above, d goes
    # (1.11e-3, 29.5 dB); above 29.5 dB c; above 39.6 dB b; above 50 dB a: 5 distinct rungs.
    ladder = coverage_ladder(REP, NO_SHARE_RULE, ATC)
    assert [c.share for c in ladder] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert [_int8(c) for c in ladder] == [
        ["a", "b", "c", "d"], ["a", "b", "c"], ["a", "b"], ["a"], [],
    ]  # fmt: skip
    assert ladder[0].label == "no floor"
    assert ladder[1].label == "floor 20 dB"  # the first floor of the 0.5 dB grid above 19.5 dB


def test_ladder_honours_min_int8_mac_share():
    # With 0.6 as the minimum share, the rungs at 50 % and 25 % become all-fp16 (one rung).
    ladder = coverage_ladder(REP, Budget(min_int8_mac_share=0.6), ATC)
    assert [c.share for c in ladder] == [1.0, 0.75, 0.0]


def _measure_passing(max_noise_modules: set[str], quality=None):
    """A measurement that passes when the policy's int8 modules are within the given set."""
    seen = []

    def measure(policy):
        specs = policy.resolved(REP.inventory(), REP.weight_shapes()).specs
        int8 = {n for n, s in specs.items() if hasattr(s, "smoothquant")}
        seen.append(sorted(int8))
        ok = int8 <= max_noise_modules
        q = quality(int8) if quality else (-float(len(int8)),)
        return Measurement(ok, q, f"{len(int8)} int8")

    return measure, seen


def test_walk_bisects_to_the_most_coverage_that_passes():
    # Passing needs d out (c may stay): rungs [1.0 F, 0.75 P, 0.5, 0.25, 0.0]. The walk measures
    # rung 0 (fails), then the middle of (0, 5) = rung 2 (passes), then rung 1 (passes): done.
    ladder = coverage_ladder(REP, NO_SHARE_RULE, ATC)
    measure, seen = _measure_passing({"a", "b", "c"})
    result = walk_front([], ladder, measure, max_evaluations=10)
    assert result.chosen.candidate.share == 0.75
    assert seen == [["a", "b", "c", "d"], ["a", "b"], ["a", "b", "c"]]
    assert result.evaluations == 3


def test_walk_stops_at_max_evaluations_and_keeps_the_best_found():
    ladder = coverage_ladder(REP, NO_SHARE_RULE, ATC)
    measure, seen = _measure_passing({"a", "b", "c"})
    result = walk_front([], ladder, measure, max_evaluations=2)
    assert len(seen) == 2 and result.chosen.candidate.share == 0.5


def test_a_float_rung_passes_unmeasured():
    # Nothing int8 passes: the walk ends on the all-fp16 rung, which costs no evaluation.
    ladder = coverage_ladder(REP, NO_SHARE_RULE, ATC)
    measure, seen = _measure_passing(set())
    result = walk_front([], ladder, measure, max_evaluations=10)
    assert len(seen) == 3  # 100 %, 50 %, 25 % measured and failed; the float rung is free
    assert result.chosen.candidate.share == 0.0 and result.chosen.measurement is None
    assert "float, passes unmeasured" in result.policy().notes[-2]


def test_a_passing_baseline_sets_the_coverage_to_beat_and_wins_ties_on_quality():
    # The all-W8A8 baseline (min/max) puts all four in int8 and passes: nothing on the ladder has
    # more coverage, and the one rung with as much is the same policy: no rung is measured.
    base = Candidate.of("all-w8a8-minmax", naive_policy(REP, ATC, "all-w8a8-minmax"), REP)
    measure, seen = _measure_passing({"a", "b", "c", "d"})
    result = walk_front([base], coverage_ladder(REP, NO_SHARE_RULE, ATC), measure, 10)
    assert result.chosen.candidate.label == "all-w8a8-minmax" and len(seen) == 1


def test_equal_coverage_goes_to_the_better_measured_quality():
    # Both Linears' best scheme is w8a8_mse: the no-floor rung (100 %, MSE ranges) is another
    # policy than the min/max baseline (100 %). Equal coverage: the better measured quality
    # wins, whichever it is (dominance both ways).
    rep = report(*(linear(n, 1e-4, sqnr={"w8a8_mse": 40.0}, e2e_scheme="w8a8_mse") for n in "ab"))
    base = Candidate.of("all-w8a8-minmax", naive_policy(rep, ATC, "all-w8a8-minmax"), rep)
    ladder = coverage_ladder(rep, NO_SHARE_RULE, ATC)
    assert ladder[0].share == 1.0 and ladder[0].key != base.key
    for base_q, rung_q, winner in ((1.0, 2.0, "no floor"), (3.0, 2.0, "all-w8a8-minmax")):
        answers = iter([Measurement(True, (base_q,), ""), Measurement(True, (rung_q,), "")])
        result = walk_front([base], ladder, lambda p, a=answers: next(a), 10)
        assert result.evaluations == 2
        assert result.chosen.candidate.label == winner


def test_the_same_policy_under_two_labels_is_measured_once():
    base = Candidate.of("first", naive_policy(REP, ATC, "all-w8a8-minmax"), REP)
    again = Candidate.of("second", naive_policy(REP, ATC, "all-w8a8-minmax"), REP)
    measure, seen = _measure_passing({"a", "b", "c", "d"})
    result = walk_front([base, again], [], measure, 10)
    assert len(seen) == 1 and len(result.rounds) == 1


def test_no_passing_candidate_without_a_float_one_is_an_error():
    base = Candidate.of("all-w8a8-minmax", naive_policy(REP, ATC, "all-w8a8-minmax"), REP)
    measure, _ = _measure_passing(set())
    with pytest.raises(ConfigError, match=r"no candidate policy met budget\.metric"):
        walk_front([base], [], measure, 10)
    with pytest.raises(ConfigError, match="at least 1"):
        walk_front([base], [], measure, 0)


def test_the_chosen_policy_notes_every_round():
    ladder = coverage_ladder(REP, NO_SHARE_RULE, ATC)
    measure, _ = _measure_passing({"a", "b", "c"})
    walked = walk_front([], ladder, measure, 10)
    policy = walked.policy()
    rounds = [n for n in policy.notes if n.startswith("measured round")]
    assert len(rounds) == 3
    assert rounds[0].startswith(
        "measured round 1 (no floor): 100.0% of the Linear/Conv2d MACs in int8"
    )
    assert "FAIL: 4 int8" in rounds[0] and "PASS: 3 int8" in rounds[2]
    # no wall time in the policy (the same bytes on a rerun); the printed summary has it
    assert not [n for n in rounds if re.search(r"; \d+ s$", n)]
    timed = walked.notes(timed=True)
    assert [t.rsplit("; ", 1)[0] for t in timed[:3]] == rounds
    assert all(t.endswith(" s") for t in timed[:3])
    assert policy.notes[-1].startswith(
        "measured search chose floor 20 dB (75.0% of the Linear/Conv2d MACs"
    )


def test_a_step_walk_stops_where_a_pass_has_full_coverage_and_says_why():
    from opsnn_quant.policy.front import FrontWalk

    measure, _ = _measure_passing({"a", "b", "c", "d"})
    walk = FrontWalk(measure, 5, lambda m: None)
    base = Candidate.of("all-w8a8-minmax", naive_policy(REP, ATC, "all-w8a8-minmax"), REP)
    assert walk.passed_at(1.0) is None  # nothing measured yet
    walk.visit(base)
    assert walk.passed_at(1.0) is walk.rounds[0]  # all four int8 and passing: nothing has more
    result = walk.result(skipped="a baseline decided")
    assert result.skipped == "a baseline decided" and result.evaluations == 1
    assert result.notes()[-1].endswith("after 1 evaluation(s); a baseline decided")


def test_a_step_walk_does_not_stop_below_full_coverage():
    from opsnn_quant.policy.front import FrontWalk

    measure, _ = _measure_passing({"a", "b", "c"})
    walk = FrontWalk(measure, 5, lambda m: None)
    base = Candidate.of("all-w8a8-minmax", naive_policy(REP, ATC, "all-w8a8-minmax"), REP)
    walk.visit(base)
    assert not walk.rounds[0].passed and walk.passed_at(1.0) is None
    with pytest.raises(ConfigError, match="no candidate policy met"):
        walk.result()  # no float rung given to fall back to
    walk.bisect(coverage_ladder(REP, NO_SHARE_RULE, ATC))
    assert walk.best().candidate.share == 0.75  # the walk goes on as walk_front would


def test_the_starting_points_are_the_baselines_the_recipe_allows_then_the_estimate():
    from opsnn_quant.policy.budget import ModalityLimit

    def starting_points(rep, target, budget, schemes=None):
        return [
            *baseline_candidates(rep, target, schemes),
            *estimate_candidates(rep, target, budget),
        ]

    rep = report(linear("a", 1e-4), linear("b", 1e-2))
    vllm, atc = get_target("ascend910b-vllm-ascend"), get_target("ascend910b-atc")
    labels = lambda starts: [c.label for c in starts]  # noqa: E731
    assert labels(starting_points(rep, vllm, Budget())) == ["all-w8a8-minmax", "all-w8a8-dynamic"]
    # static activations only (probe.schemes): the per-token baseline is not a candidate
    static = ["w8a8", "w8a8_mse", "w8a8_smoothquant"]
    assert labels(starting_points(rep, vllm, Budget(), static)) == ["all-w8a8-minmax"]
    # ATC runs no per-token activations: its naive dynamic policy is empty, so not a candidate
    assert labels(starting_points(rep, atc, Budget())) == ["all-w8a8-minmax"]
    limits = Budget(limits={"denoiser": ModalityLimit(min_sqnr_db=25.0)})
    starts = starting_points(rep, atc, limits)
    assert labels(starts) == ["all-w8a8-minmax", "estimate at the recipe's limits"]
    assert starts[1].share == 0.5  # b (1e-2 > 10^-2.5) falls back: half the MACs
