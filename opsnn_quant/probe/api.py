"""``probe(model_or_adapter, forward_loop, config) -> SensitivityReport``.

Reads as its phases: the statistics pass over the forward loop (:mod:`opsnn_quant.probe.passes`),
the SmoothQuant search, the end-to-end attribution of each modality from its recorded root calls
(:mod:`opsnn_quant.probe.e2e`), whose candidates also give the local errors of the modules they
reach, the local errors of the rest (the calls pass 1 kept of modules outside every root; pass 2
over the forward loop only for what is left, or before the attribution when the configuration
needs it first: see :func:`~opsnn_quant.probe.e2e.replay_measured`), and the assembly of the
report.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from opsnn_quant.backends.devices import backend_label
from opsnn_quant.core.memory import frozen_heap, release_memory
from opsnn_quant.errors import ConfigError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.models.offload import checkpointed, offload_of
from opsnn_quant.probe.attention import AttentionWatch
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.e2e import ProbeRun, attribute_modalities, replay_measured
from opsnn_quant.probe.hooks import NORMS, count_params, watched_modules
from opsnn_quant.probe.moments import collect_groups, plan_groups, start_streaming
from opsnn_quant.probe.passes import (
    Watches,
    local_error_pass,
    measure_kept_inputs,
    smoothquant_search,
    statistics_pass,
    watches_for,
)
from opsnn_quant.probe.report import (
    FP16_MAX,
    EndToEnd,
    Finding,
    Fp16Stats,
    ModuleSensitivity,
    SensitivityReport,
    summarize_modalities,
)
from opsnn_quant.probe.seeding import PassOneStatistics
from opsnn_quant.producers import fold_groups
from opsnn_quant.quant.api import tied_to_embeddings
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.quant.spec import ATTENTION_TYPE
from opsnn_quant.recording import Call, RecordedRoots, RootRecorder, replay, sample_subset
from opsnn_quant.types import ForwardLoop, Modality

log = logging.getLogger(__name__)

__all__ = [
    "ProbeConfig",
    "ProbeResult",
    "Shard",
    "StagedProbe",
    "probe",
    "recollect",
    "run_probe",
    "start_probe",
    "statistics",
]


@dataclass(frozen=True)
class Shard:
    """Pass 1 over this process's share of the calibration data, the statistics of every
    share merged into those of one pass over all of it (see :mod:`opsnn_quant.core.stream`).

    Attributes:
        loop: the forward loop over this process's batches, numbered as in the whole data
            (``adapter.forward_loop(share, first_batch=...)``); the shares follow each other
            in rank order, this one first on the process that goes on.
        others: the other processes' statistics (each one's :func:`statistics`), in the order
            of their shares, which follow this one's.
    """

    loop: ForwardLoop
    others: Callable[[], list[Watches]]


@dataclass(frozen=True)
class ProbeResult:
    """A probe run: its report and what the phases after it reuse instead of running the
    model again.

    Attributes:
        report: the :class:`SensitivityReport` (``probe.json``).
        statistics: Linear/Conv2d name -> its pass-1 calibration statistics, for
            ``quantize(..., statistics=)`` on the same data (no calibration pass there).
        root_calls: root module -> one call recorded in pass 1 (inputs for the exports).
    """

    report: SensitivityReport
    statistics: dict[str, PassOneStatistics | AttentionWatch] = field(default_factory=dict)
    root_calls: dict[str, list[Call]] = field(default_factory=dict)


def probe(
    target: ModelAdapter | nn.Module,
    forward_loop: ForwardLoop | None = None,
    config: ProbeConfig | None = None,
    *,
    modalities: dict[str, Modality | str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> SensitivityReport:
    """Probe every module's fp16 overflow risk and int8 sensitivity.

    Args:
        target: a :class:`ModelAdapter` or a plain module (then ``modalities`` maps name
            prefixes to modalities, default: everything ``other``).
        forward_loop: runs the model over calibration data (an adapter's
            ``forward_loop(data)``); required for a plain module.
        config: what to probe.
        modalities: prefix -> modality for a plain module.
        progress: optional callback told about each phase.

    Returns:
        The :class:`SensitivityReport` (``probe.json``); :func:`run_probe` also returns what
        later phases can reuse.
    """
    return run_probe(target, forward_loop, config, modalities=modalities, progress=progress).report


def run_probe(
    target: ModelAdapter | nn.Module,
    forward_loop: ForwardLoop | None = None,
    config: ProbeConfig | None = None,
    *,
    modalities: dict[str, Modality | str] | None = None,
    progress: Callable[[str], None] | None = None,
    shard: Shard | None = None,
) -> ProbeResult:
    """:func:`probe`, returning the report with the pass-1 calibration statistics (for
    ``quantize(..., statistics=result.statistics)`` on the same data: no calibration pass) and
    one recorded call per root (inputs for the exports).

    Args:
        target, forward_loop, config, modalities, progress: as :func:`probe`.
        shard: pass 1 over this process's share of the data, merged with the other
            processes' (:func:`statistics` there); ``forward_loop`` (all of the data) then
            runs only what pass 1 does not cover (pass 2 for modules no replay reaches).

    Returns:
        The :class:`ProbeResult`.
    """
    cfg = config or ProbeConfig()
    adapter = _as_adapter(target, forward_loop, modalities)
    if forward_loop is None:
        raise ConfigError(
            "probe() needs a forward_loop: e.g. adapter.forward_loop(calibration_data)"
        )
    say = progress or (lambda msg: log.info("%s", msg))
    with frozen_heap():
        return _probe(adapter, forward_loop, cfg, say, shard)


def _probe(
    adapter: ModelAdapter,
    forward_loop: ForwardLoop,
    cfg: ProbeConfig,
    say: Callable[[str], None],
    shard: Shard | None,
) -> ProbeResult:
    if offload_of(adapter.model) is not None:
        check_offloaded_estimators(cfg)  # before pass 1, not after it
    run = _start(adapter, cfg)
    say("probe pass 1: ranges, fp16/bf16 re-runs, calibration statistics")
    run.costs["pass1_seconds"] = _pass_one(run, forward_loop, shard)
    return _estimate(run, forward_loop, say)


class StagedProbe:
    """A probe in two stages, for a caller that may decide on pass 1 alone (``calibrate``: a
    naive baseline, or a measured search whose baselines meet the budget at full int8 coverage
    reads no estimate).

    :func:`start_probe` runs pass 1; :meth:`first` is the report of pass 1 alone (the modules,
    their calls, MACs, fp16 findings and ties; no int8 error, no attribution) with the
    statistics ``quantize`` seeds from; :meth:`finish` runs the estimators (the SmoothQuant
    search, local errors, attribution) on the same run, as :func:`run_probe` would have after
    pass 1, and returns the whole result. Nothing runs twice.
    """

    def __init__(
        self,
        run: ProbeRun,
        forward_loop: ForwardLoop,
        say: Callable[[str], None],
        full: ProbeConfig | None = None,
    ):
        self._run: ProbeRun | None = run
        self._loop, self._say, self._full = forward_loop, say, full
        self.config = full if full is not None else run.cfg  # what the estimators run with
        self._done: ProbeResult | None = None

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` ran."""
        return self._done is not None

    def first(self, reason: str) -> ProbeResult:
        """The result of pass 1 alone, the report saying why no estimator ran (``reason``)."""
        if self._done is not None:
            return self._done
        run = self._run
        if run is None:
            raise RuntimeError("StagedProbe.first() after release()")
        report = _assemble(run, {}).model_copy(update={"not_estimated": reason})
        return ProbeResult(report, _statistics(run), _root_calls(run))

    def finish(self, decided: Collection[str] = ()) -> ProbeResult:
        """The estimators on the pass-1 run: the whole probe's result.

        Args:
            decided: modalities already decided (names): no estimator runs for them, and pass
                1, if it runs again, gathers for their modules the statistics it gathered the
                first time (``ProbeConfig.decided``).

        Raises:
            RuntimeError: after :meth:`release`.
        """
        if self._done is None:
            run = self._run
            if run is None:
                raise RuntimeError("StagedProbe.finish() after release()")
            full = self._full if self._full is not None else run.cfg
            first = run.cfg.schemes if run.cfg.schemes is not None else tuple(SCHEMES)
            full = full.deciding(decided, first)
            with frozen_heap():
                if replace(full, decided=None) != replace(run.cfg, decided=None):
                    # pass 1 ran with the first decision's schemes only: again with all of them
                    # (a decided modality's modules with the same ones as the first time)
                    self._say("probe pass 1 again, with the statistics of every candidate scheme")
                    seconds = run.costs["pass1_seconds"]
                    run = _start(run.adapter, full)
                    run.costs["pass1_first_seconds"] = seconds
                    run.costs["pass1_seconds"] = _pass_one(run, self._loop, None)
                run.cfg = full  # the estimators skip the decided modalities
                self._done = _estimate(run, self._loop, self._say)
        return self._done

    def recorded(self) -> RecordedRoots:
        """The root calls pass 1 kept for the estimators, with their float outputs (replayed
        now, on the float model): what a decision measured on the calibration data replays.

        Raises:
            RuntimeError: after :meth:`release`.
        """
        run = self._run
        if run is None:
            raise RuntimeError("StagedProbe.recorded() after release()")
        return replayed_roots(run.named, run.roots, run.watches.recorders, run.cfg.replay_batch)

    def release(self) -> None:
        """Drop what pass 1 kept for the estimators (inputs kept, recorded calls): the
        decision was made without them."""
        self._run = None


def start_probe(
    adapter: ModelAdapter,
    forward_loop: ForwardLoop,
    config: ProbeConfig,
    *,
    progress: Callable[[str], None] | None = None,
    shard: Shard | None = None,
    full: ProbeConfig | None = None,
) -> StagedProbe:
    """Pass 1 of :func:`run_probe` (see :class:`StagedProbe`): the rest runs only when asked.

    Args:
        adapter, forward_loop: as :func:`run_probe`.
        config: pass 1's configuration.
        progress: as :func:`run_probe`.
        shard: as :func:`run_probe`.
        full: the configuration the estimators run with, when pass 1 gathers the statistics
            of fewer schemes (those the first decision reads: GPTQ's K x K moments and the
            other schemes' observers are then never paid for unless the estimators run; pass
            1 runs again with ``full`` first, over the whole ``forward_loop`` in this process
            even where the first pass was shared: the other processes' shares ran ``config``).
            None: ``config``.
    """
    say = progress or (lambda msg: log.info("%s", msg))
    with frozen_heap():
        run = _start(adapter, config)
        say("probe pass 1: ranges, fp16/bf16 re-runs, calibration statistics")
        run.costs["pass1_seconds"] = _pass_one(run, forward_loop, shard)
    return StagedProbe(run, forward_loop, say, full)


@torch.no_grad()
def replayed_roots(
    named: Mapping[str, nn.Module],
    roots: Mapping[str, Modality],
    recorders: Mapping[str, RootRecorder],
    batch: Callable[[str], int | None],
) -> RecordedRoots:
    """The calls ``recorders`` kept of each root, each with its float output (replayed in
    chunks of ``batch(modality)`` samples, as they will be measured)."""
    calls = {r: rec.calls for r, rec in recorders.items() if rec.calls}
    steps = {r: list(recorders[r].steps) for r in calls}
    chunks = {r: n for r in calls if (n := batch(roots[r].value)) is not None}
    outputs = {
        r: [
            replay(named[r], c, s, chunks.get(r)).float()
            for c, s in zip(calls[r], steps[r], strict=True)
        ]
        for r in calls
    }
    release_memory()  # the replays' transient buffers, before the candidates are measured
    return RecordedRoots(calls, outputs, dict(roots), steps, chunks)


def _root_calls(run: ProbeRun) -> dict[str, list[Call]]:
    return {r: rec.calls[:1] for r, rec in run.watches.recorders.items() if rec.calls}


def _estimate(run: ProbeRun, forward_loop: ForwardLoop, say: Callable[[str], None]) -> ProbeResult:
    """Everything after pass 1: the SmoothQuant search, local errors, attribution, report."""
    adapter = run.adapter
    offloaded = offload_of(adapter.model) is not None
    if offloaded:
        check_offloaded_estimators(run.cfg)
    replayed: set[str] = set()
    if run.watches.local:
        say("SmoothQuant alpha search")
        seconds, run.smoothing_groups = smoothquant_search(
            run.watches, _fold_groups(run), adapter.model
        )
        run.costs["smoothquant_search_seconds"] = seconds
        replayed = replay_measured(run)
        if not replayed:
            run.watches.inputs.clear()  # pass 2 measures every module over the forward loop
            say("probe pass 2: local int8 error of every candidate scheme")
            # the diagonal estimator reads pass 2's noise powers, not the candidates
            release = run.cfg.estimator == "diagonal" and not run.cfg.exhaustive
            estimated = _estimated_modules(run)
            run.costs["pass2_seconds"] = local_error_pass(
                run.watches, adapter.model, forward_loop, release=release, transient=offloaded,
                only=estimated,
            )  # fmt: skip
    with checkpointed(adapter.model):  # an offloaded model's backward: one block at a time
        e2e = attribute_modalities(run, say, replayed)
    if replayed:
        _measure_rest(run, forward_loop, say, offloaded)
    statistics = _statistics(run)
    return ProbeResult(_assemble(run, e2e), statistics, _root_calls(run))


def _statistics(run: ProbeRun) -> dict[str, PassOneStatistics | AttentionWatch]:
    """What ``quantize`` can take instead of a calibration pass: each Linear/Conv2d's pass-1
    statistics, each attention module's SDPA ranges (where the op runs its calls)."""
    w = run.watches
    out: dict[str, PassOneStatistics | AttentionWatch] = {
        n: lp.pass_one() for n, lp in w.local.items()
    }
    return out | {n: watch for n, watch in w.attention.items() if watch.runs}


OFFLOADED_ESTIMATOR = (
    "the exhaustive reference (probe.exhaustive) does not run on an offloaded model "
    "(--max-memory): it swaps one module at a time and replays the whole model for each"
)


def check_offloaded_estimators(cfg: ProbeConfig) -> None:
    """Refuse the estimators that do not run on an offloaded model (``--max-memory``): the
    exhaustive reference. The others do: the estimator's backward is checkpointed block by
    block (:meth:`~opsnn_quant.models.offload.BlockOffload.checkpointed`), each block kept
    loaded through its backward, where the structured estimator builds its modules'
    candidates (kept until another block's are built); pass 2 builds them inside each
    module's forward.

    Raises:
        ConfigError: the configuration needs what does not run offloaded.
    """
    if cfg.attribution and cfg.exhaustive:
        raise ConfigError(f"--max-memory: {OFFLOADED_ESTIMATOR}")


def recollect(
    adapter: ModelAdapter,
    forward_loop: ForwardLoop,
    report: SensitivityReport,
    config: ProbeConfig,
    *,
    progress: Callable[[str], None] | None = None,
    shard: Shard | None = None,
) -> ProbeResult:
    """``report`` (an earlier probe of this model on this data, with ``config``) with
    what its run kept in memory: pass 1 again, alone, for the calibration statistics and the
    roots' recorded calls. Pass 1 is deterministic, so these are the bits the full run had
    (``quantize`` seeded from them writes the same checkpoint); the candidates' measurements,
    the costly part, are not repeated.

    Args:
        adapter: the float model the report was made of.
        forward_loop: the loop the probe ran.
        report: the earlier report.
        config: the configuration it was made with (the caller checks it against
            ``report.config``).
        progress: optional callback told about the pass.
        shard: pass 1 over this process's share, merged (as :func:`run_probe`).

    Returns:
        The :class:`ProbeResult` of ``report``.
    """
    say = progress or (lambda msg: log.info("%s", msg))
    # Without the fp16/bf16 re-runs (the report has their findings): they watch the forward
    # and change none of the statistics gathered beside them.
    config = replace(config, fp16=False)
    with frozen_heap():
        run = _start(adapter, config)
        say("probe pass 1 again: the calibration statistics the report's run kept in memory")
        _pass_one(run, forward_loop, shard)
        statistics = _statistics(run)
        roots = {r: rec.calls[:1] for r, rec in run.watches.recorders.items() if rec.calls}
    return ProbeResult(report, statistics, roots)


def statistics(adapter: ModelAdapter, loop: ForwardLoop, config: ProbeConfig) -> Watches:
    """Pass 1 alone over ``loop`` (a share of the data): what a process that shares a probe's
    data sends to the one that goes on (:class:`Shard`), ready to send."""
    with frozen_heap():
        run = _start(adapter, config)
        statistics_pass(run.watches, adapter, run.named, run.watched, loop)
        return run.watches.portable()


def _pass_one(run: ProbeRun, forward_loop: ForwardLoop, shard: Shard | None) -> float:
    """Pass 1 over the data, or over this process's share merged with the others'; its
    seconds (this process's own pass)."""
    w = run.watches
    if shard is None:
        # GPTQ's moments beyond what memory allows: streamed to files, the first group's here,
        # the others' in passes of their own (see opsnn_quant.probe.moments)
        weights = sum(p.numel() * p.element_size() for p in run.adapter.model.parameters())
        plan = plan_groups(w.local, weight_bytes=weights)
        store = start_streaming(w.local, plan)
        seconds = statistics_pass(w, run.adapter, run.named, run.watched, forward_loop)
        if store is not None:
            model = run.adapter.model
            run.costs["moments_seconds"] = collect_groups(w.local, model, forward_loop, plan, store)
            run.costs["moments_passes"] = len(plan.groups) - 1
        return seconds
    seconds = statistics_pass(w, run.adapter, run.named, run.watched, shard.loop)
    t0 = time.perf_counter()
    for other in shard.others():  # waits for the slowest share
        w.merge(other)
    run.costs["pass1_merge_seconds"] = time.perf_counter() - t0
    return seconds


def _estimated_modules(run: ProbeRun) -> set[str] | None:
    """The Linear/Conv2d modules of the modalities the estimators run for (None: all of
    them, no modality decided)."""
    cfg = run.cfg
    if not cfg.decided:
        return None
    modality = run.adapter.modality_of
    return {n for n in run.watches.local if cfg.estimates(modality(n).value)}


def _fold_groups(run: ProbeRun) -> dict[str, list[str]]:
    """The Linears each norm alone feeds (see :func:`~opsnn_quant.producers.fold_groups`), traced
    on one sample of each root's first recorded call; none unless ``cfg.fold_smoothing``."""
    if not run.cfg.fold_smoothing:
        return {}
    recorders = run.watches.recorders
    roots = {r: [sample_subset(rec.calls[0], 1)] for r, rec in recorders.items() if rec.calls}
    return fold_groups(run.adapter.model, roots)


def _measure_rest(
    run: ProbeRun, forward_loop: ForwardLoop, say: Callable[[str], None], offloaded: bool
) -> None:
    """The local errors the attribution's replay did not measure: of modules outside every
    root from the calls pass 1 kept of them, and pass 2 over the forward loop for any left (in
    a root without recorded calls, or never called by a replayed call); none left: no pass."""
    w = run.watches
    model = run.adapter.model
    rest = {n for n, lp in w.local.items() if lp.calls and lp.schemes and not lp.energies}
    if run.cfg.decided:
        rest &= _estimated_modules(run) or set()
    t0 = time.perf_counter()
    rest -= measure_kept_inputs(w, rest, model)
    run.costs["kept_inputs_seconds"] = time.perf_counter() - t0
    run.costs["pass2_seconds"] = 0.0
    if rest:
        say(f"probe pass 2: local int8 error of the {len(rest)} modules the replay did not reach")
        run.costs["pass2_seconds"] = local_error_pass(
            w, model, forward_loop, only=rest, release=True, transient=offloaded
        )
    for lp in w.local.values():
        lp.release()
    w.inputs.clear()


def _as_adapter(
    target: ModelAdapter | nn.Module, forward_loop: ForwardLoop | None, modalities: dict | None
) -> ModelAdapter:
    if isinstance(target, ModelAdapter):
        return target
    if not isinstance(target, nn.Module):
        raise ConfigError(
            f"probe() takes a ModelAdapter or an nn.Module, got {type(target).__name__}"
        )
    if forward_loop is None:
        raise ConfigError("probing a plain nn.Module needs a forward_loop")
    return GenericAdapter(target, modalities or {"": Modality.OTHER}, forward_loop)


def _start(adapter: ModelAdapter, cfg: ProbeConfig) -> ProbeRun:
    named = dict(adapter.model.named_modules())
    watched = watched_modules(adapter.model)
    roots = {r: mod for r, mod in adapter.roots().items() if r in named}
    watches = watches_for(adapter, cfg, named, watched, roots)
    return ProbeRun(adapter, cfg, named, watched, roots, watches)


# ---- assembly ----------------------------------------------------------------------------------


def _assemble(run: ProbeRun, e2e: dict[str, EndToEnd]) -> SensitivityReport:
    """The report: one entry per watched or quantizable module, findings, modality summaries."""
    adapter, w = run.adapter, run.watches
    tied = tied_to_embeddings(adapter.model)
    entries = [
        _module_entry(run, name, module, e2e.get(name), tied.get(name))
        for name, module in run.named.items()
        if name and (name in run.watched or name in w.local)
    ]
    findings: list[Finding] = [
        sw.finding(n or "(model)", adapter.modality_of(n))
        for n, sw in w.softmax.items()
        if sw.max_score > 0
    ]
    findings += [gw.finding(m) for m, gw in w.gelu.items() if gw.seen]
    return SensitivityReport(
        model=adapter.model_id,
        backend=backend_label(adapter.device),
        # JSON form (tuples as lists), so a report equals its own round trip.
        config={"family": adapter.family, **json.loads(json.dumps(asdict(run.cfg)))},
        modules=entries,
        modalities=summarize_modalities(entries, adapter.describe_output, _pass_macs(run)),
        findings=findings,
        smoothing_groups=run.smoothing_groups,
        costs={k: round(v, 6) for k, v in run.costs.items()},
    )


def _pass_macs(run: ProbeRun) -> dict[str, tuple[int, int]]:
    """Modality -> the MACs of pass 1 in its Linear/Conv2d calls (and the SDPA calls of the
    attention modules measured for int8: the target runs them) and outside them."""
    w = run.watches
    out = {m: (0, macs) for m, macs in w.other_macs.items()}
    measured = {n: watch.macs for n, watch in w.attention.items() if watch.calls}
    for name, macs in [*((n, m) for n, (m, _) in w.macs.items()), *measured.items()]:
        key = run.adapter.modality_of(name).value
        linear, other = out.get(key, (0, 0))
        # an SDPA's MACs were counted outside the Linear/Conv2d: moved over
        moved = macs if name in measured else 0
        out[key] = (linear + macs, max(other - moved, 0))
    return out


def _module_entry(
    run: ProbeRun, name: str, module: nn.Module, e2e: EndToEnd | None, tied_to: str | None
) -> ModuleSensitivity:
    w = run.watches
    watch = w.attention.get(name)
    if watch is not None and watch.calls:
        return _attention_entry(run, name, module, watch, e2e)
    kind = run.watched.get(name, (module, "param"))[1]
    lp = w.local.get(name)
    calls = lp.calls if lp is not None else 0
    macs = w.macs.get(name)
    return ModuleSensitivity(
        name=name,
        type=type(module).__name__,
        modality=run.adapter.modality_of(name),
        params=count_params(module) if kind not in ("residual", "attention") else 0,
        macs=macs[0] // max(macs[1], 1) if macs is not None else 0,
        calls=calls,
        fp16=_fp16_stats(run, name, module, calls),
        w8a8=lp.results() if lp is not None else {},
        e2e=e2e,
        weight_shape=_weight_shape(lp.module) if lp is not None else None,
        timesteps=lp.timestep_ranges() if lp is not None else None,
        tied_to=tied_to,
    )


def _attention_entry(
    run: ProbeRun, name: str, module: nn.Module, watch: AttentionWatch, e2e: EndToEnd | None
) -> ModuleSensitivity:
    """An attention module measured for int8 attention: type ``Attention``, the MACs and calls
    of its SDPA, its candidates' local errors (infeasible, with the reason, where the op
    refuses one of its calls)."""
    return ModuleSensitivity(
        name=name,
        type=ATTENTION_TYPE,
        modality=run.adapter.modality_of(name),
        macs=watch.macs // watch.calls,
        calls=watch.calls,
        fp16=_fp16_stats(run, name, module, watch.calls),
        w8a8=watch.results(),
        e2e=e2e,
    )


def _weight_shape(module: nn.Module) -> list[int] | None:
    weight = getattr(module, "weight", None)
    return [int(d) for d in weight.shape] if isinstance(weight, torch.Tensor) else None


def _fp16_stats(run: ProbeRun, name: str, module: nn.Module, calls: int) -> Fp16Stats | None:
    w = run.watches
    acc = w.fp16.get(name)
    if acc is None:
        return None
    sw = w.softmax.get(name)
    if sw is not None and sw.max_score > FP16_MAX:
        acc.extra_reasons.append(
            f"softmax input: attention scores reach {sw.max_score:.4g} > 65504"
        )
    if not (acc.in_absmax or acc.out_absmax or calls):
        return None
    return acc.result(run.cfg.min_headroom, isinstance(module, NORMS))
