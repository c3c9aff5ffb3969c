"""The measured search of ``calibrate``: a policy chosen on the user's metric, not the estimate.

With ``budget.metric`` in the recipe, the policy phase does not stop at the estimate: it
measures candidates (:mod:`opsnn_quant.policy.front`) on a slice of the metric suite's data
(:class:`~opsnn_quant.evaluation.slice_scorer.SliceScorer`). Each measurement quantizes a float
copy of the run's model (:func:`float_copy`: new modules over the same tensors) with the
candidate exactly as the quantize phase will (same calibration data, the probe's statistics
where they seed it), generates on the slice and judges
the bounds on their intervals (a candidate passes only when its interval does). The float
model's slice outputs are generated once each, only as far as a candidate needed them.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsnn_quant.core.determinism import set_reproducible
from opsnn_quant.core.memory import trim_heap
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.evaluate import suite_records
from opsnn_quant.evaluation.slice_scorer import SliceScorer
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.data import load_records
from opsnn_quant.pipeline.context import RunContext, load_recipe_model
from opsnn_quant.policy.baselines import int8_runnable
from opsnn_quant.policy.budget import DEFAULT_MAX_EVALUATIONS, MetricBudget
from opsnn_quant.policy.front import (
    FrontResult,
    FrontWalk,
    Measurement,
    baseline_candidates,
    coverage_ladder,
    decided_first,
    estimate_candidates,
)
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.summary import int8_mac_shares
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.quant.api import SeedsAttention, SeedsCalibration, quantize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasuredSearch:
    """What one measured search needs beside the run: the probe's report and statistics, the
    calibration records quantize runs on, the suite the bounds are measured with and the slice
    (:func:`slice_records`)."""

    report: SensitivityReport
    target: Target
    calibration: Sequence[dict[str, Any]]
    statistics: Mapping[str, SeedsCalibration | SeedsAttention] | None
    suite: Suite
    records: list[dict[str, Any]]


def measured_policy(
    ctx: RunContext,
    search: MeasuredSearch,
    estimated: Callable[[], MeasuredSearch] | None = None,
) -> FrontResult:
    """Decide first: measure the naive baselines the target runs, and stop at the first that
    meets the budget with every module the target runs in int8 (no candidate has more int8
    MACs: the estimate could not change the choice). Otherwise ``estimated()`` (the probe's
    estimators, run now on the same pass 1) gives the search the whole report, and the
    estimate's proposal and the coverage ladder are measured; return the walk.

    At equal coverage the baselines are preferred in the order measured: static W8A8 first
    (no per-token quantization at run time), then W8A8 dynamic.
    """
    budget = ctx.recipe.budget
    metric = budget.metric
    assert metric is not None, "measured_policy needs budget.metric"
    # The float model and every candidate's copy transcribe the same slice: an adapter may keep
    # what it derives from it while they do, not while the estimators replay calibration data.
    with ctx.adapter.repeated_inputs():
        scorer = _scorer(ctx, metric, search)
        current = [search]  # the search the measurements use: the whole report once estimated

        def measure(policy: PrecisionPolicy) -> Measurement:
            return _measure(ctx, current[0], scorer, policy)

        walk = FrontWalk(measure, budget.max_evaluations or DEFAULT_MAX_EVALUATIONS, ctx.say)
        full = int8_mac_shares(search.report, int8_runnable(search.report, search.target))
        for cand in baseline_candidates(search.report, search.target, ctx.recipe.probe.schemes):
            walk.visit(cand)
            decided = walk.passed_at(full["overall"])
            if decided is not None and ctx.recipe.search == "first":
                skipped = decided_first(decided.candidate.label, full["overall"])
                return walk.result(skipped=skipped)
    if estimated is not None:
        current[0] = search = estimated()
    with ctx.adapter.repeated_inputs():
        for cand in estimate_candidates(search.report, search.target, budget):
            walk.visit(cand)
        ctx.say("building the coverage ladder from the estimate")
        ladder = coverage_ladder(search.report, budget, search.target)
        walk.bisect(ladder)
        return walk.result(ladder)


def _scorer(ctx: RunContext, metric: MetricBudget, search: MeasuredSearch) -> SliceScorer:
    """The scorer, its float outputs generated by the run's own float model (still float: the
    policy phase runs before quantize swaps its modules; no copy), as far as the candidates
    need them."""
    ctx.say(f"budget.metric: the float model on the slice ({len(search.records)} records)")
    return SliceScorer(
        ctx.adapter,
        search.suite,
        metric.bounds(),
        search.records,
        allow_pickle=ctx.recipe.model.allow_pickle,
    )


def float_copy(ctx: RunContext) -> ModelAdapter:
    """A float copy of the run's model for a candidate to be quantized in: new module objects
    over the run's own tensors (still float: the policy phase runs before quantize swaps its
    modules). ``quantize`` swaps the copy's modules and builds new tensors, never writing into
    a float one (a test holds it to that on every scheme), so the copy costs no weights: a
    candidate adds only its int8 weights, where a deep copy added the whole float model again.
    Loaded again where the run offloads blocks (``--max-memory``: the offload files are the
    run's)."""
    if ctx.recipe.model.max_memory is not None:
        return load_recipe_model(ctx.recipe, ctx.run.source)
    return sharing_copy(ctx.adapter)


def sharing_copy(adapter: ModelAdapter) -> ModelAdapter:
    """``adapter`` deep-copied but for its model's parameters and buffers, which the copy
    shares (ties kept), and what inference only reads (:meth:`ModelAdapter.read_only_parts`)."""
    model = adapter.model
    shared: dict[int, Any] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    shared.update({id(o): o for o in adapter.read_only_parts()})
    return copy.deepcopy(adapter, shared)


def slice_records(metric: MetricBudget, suite: Suite) -> list[dict[str, Any]]:
    """The records the candidates are measured on: ``samples`` from ``start`` of ``data``, else
    of the suite's ``data.tuning``, else of the suite's data after its own samples (see
    :class:`MetricBudget`).

    Raises:
        ConfigError: the source is missing or has too few records.
    """
    source = metric.data or suite.data.tuning
    if source is None:
        start = suite.data.samples if metric.start is None else metric.start
        return suite_records(suite, start, metric.samples)
    start = metric.start or 0
    records = load_records(source, start + metric.samples)[start:]
    if len(records) < metric.samples:
        whose = "" if metric.data else f"suite {suite.name}'s data.tuning "
        raise ConfigError(
            f"budget.metric: {whose}{source} has {start + len(records)} records, fewer than the "
            f"{start + metric.samples} needed for {metric.samples} from record {start}"
        )
    return records


def metric_source(metric: MetricBudget, suite: Suite | None = None) -> str:
    """Where the slice comes from, in words (``suite``: the one ``metric`` names)."""
    start = metric.start
    tuning = suite.data.tuning if suite is not None else None
    if metric.data is None and tuning is not None:
        return f"suite {metric.suite}'s tuning data {tuning} from record {start or 0}"
    if metric.data is None:
        where = "after its samples" if start is None else f"from record {start}"
        return f"suite {metric.suite}'s data, {where}"
    return f"{metric.data} from record {start or 0}"


def _measure(
    ctx: RunContext, search: MeasuredSearch, scorer: SliceScorer, policy: PrecisionPolicy
) -> Measurement:
    """Quantize a fresh float copy with ``policy`` as the quantize phase would, score it."""
    adapter = float_copy(ctx)
    resolved = policy.resolved(
        search.report.inventory(), search.report.weight_shapes(), tied=search.report.tied()
    )
    set_reproducible(seed=ctx.seed)
    loop = adapter.forward_loop(list(search.calibration))
    quantize(adapter.model, resolved, loop, statistics=search.statistics)
    score = scorer.score(adapter)
    # One quantized copy at a time: reference counting frees it here (a test holds every
    # scheme's copy to that); a full collection walked the whole loaded model for nothing.
    del adapter, loop
    trim_heap()
    return Measurement(score.passed, score.quality, score.describe())
