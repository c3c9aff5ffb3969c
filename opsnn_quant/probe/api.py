"""``probe(model_or_adapter, forward_loop, config) -> SensitivityReport``.

Reads as its phases: the statistics pass and the local-error pass over the forward loop
(:mod:`opsnn_quant.probe.passes`), the end-to-end attribution of each modality from its recorded
root calls (:mod:`opsnn_quant.probe.attribution`), and the assembly of the report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from opsnn_quant.backends.devices import backend_label
from opsnn_quant.errors import ConfigError
from opsnn_quant.memory import frozen_heap, release_memory
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.probe.attribution import Attribution, estimate
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.hooks import NORMS, count_params, watched_modules
from opsnn_quant.probe.local import LocalProbe
from opsnn_quant.probe.passes import (
    Watches,
    local_error_pass,
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
from opsnn_quant.recording import Call, sample_subset
from opsnn_quant.types import ForwardLoop, Modality, match_prefix

log = logging.getLogger(__name__)

__all__ = ["ProbeConfig", "ProbeKeep", "probe"]


@dataclass
class ProbeKeep:
    """What a probe run hands on besides its report, for the phases after it (pass an empty
    one as ``probe(..., keep=)``).

    Attributes:
        statistics: Linear/Conv2d name -> its pass-1 calibration statistics, for
            ``quantize(..., statistics=)`` on the same data (no calibration pass there).
        root_calls: root module -> one call recorded in pass 1 (inputs for the exports).
    """

    statistics: dict[str, PassOneStatistics] = field(default_factory=dict)
    root_calls: dict[str, list[Call]] = field(default_factory=dict)


@dataclass
class _Run:
    """One probe run: the model's modules, what is watched, and the costs measured."""

    adapter: ModelAdapter
    cfg: ProbeConfig
    named: dict[str, nn.Module]
    watched: dict[str, tuple[nn.Module, str]]
    roots: dict[str, Modality]  # root module -> modality (several roots per modality allowed)
    watches: Watches
    costs: dict[str, float] = field(default_factory=dict)


def probe(
    target: ModelAdapter | nn.Module,
    forward_loop: ForwardLoop | None = None,
    config: ProbeConfig | None = None,
    *,
    modalities: dict[str, Modality | str] | None = None,
    progress: Callable[[str], None] | None = None,
    keep: ProbeKeep | None = None,
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
        keep: filled with what later phases can reuse instead of running the model again.

    Returns:
        The :class:`SensitivityReport` (``probe.json``).
    """
    cfg = config or ProbeConfig()
    adapter = _as_adapter(target, forward_loop, modalities)
    if forward_loop is None:
        raise ConfigError(
            "probe() needs a forward_loop: e.g. adapter.forward_loop(calibration_data)"
        )
    say = progress or (lambda msg: log.info("%s", msg))
    with frozen_heap():
        return _probe(adapter, forward_loop, cfg, say, keep)


def _probe(
    adapter: ModelAdapter,
    forward_loop: ForwardLoop,
    cfg: ProbeConfig,
    say: Callable[[str], None],
    keep: ProbeKeep | None,
) -> SensitivityReport:
    run = _start(adapter, cfg)
    say("probe pass 1/2: ranges, fp16/bf16 re-runs, calibration statistics")
    run.costs["pass1_seconds"] = statistics_pass(
        run.watches, adapter, run.named, run.watched, forward_loop
    )
    if run.watches.local:
        say("SmoothQuant alpha search")
        run.costs["smoothquant_search_seconds"] = smoothquant_search(run.watches)
        say("probe pass 2/2: local int8 error of every candidate scheme")
        run.costs["pass2_seconds"] = local_error_pass(run.watches, adapter.model, forward_loop)
    e2e = _attribute_modalities(run, say)
    if keep is not None:
        keep.statistics.update({n: lp.pass_one() for n, lp in run.watches.local.items()})
        keep.root_calls.update(
            {r: rec.calls[:1] for r, rec in run.watches.recorders.items() if rec.calls}
        )
    return _assemble(run, e2e)


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


def _start(adapter: ModelAdapter, cfg: ProbeConfig) -> _Run:
    named = dict(adapter.model.named_modules())
    watched = watched_modules(adapter.model)
    roots = {r: mod for r, mod in adapter.roots().items() if r in named}
    watches = watches_for(adapter, cfg, named, watched, roots)
    return _Run(adapter, cfg, named, watched, roots, watches)


# ---- end-to-end attribution ------------------------------------------------------------------


def _attribute_modalities(run: _Run, say: Callable[[str], None]) -> dict[str, EndToEnd]:
    """Per module, its end-to-end contribution within its modality (recorded calls replayed).

    A modality with several roots (SDXL's two text encoders) is attributed root by root, and
    each root's contributions are weighted by its share of the modality's output energy, so they
    add up to the relative noise of all its outputs together.
    """
    local = run.watches.local
    # A module none of whose schemes stayed finite gets no end-to-end estimate: the policy pins it.
    best = {n: lp.best_scheme() for n, lp in local.items() if lp.calls and lp.feasible_schemes()}
    e2e: dict[str, EndToEnd] = {}
    for modality in dict.fromkeys(run.roots.values()):
        results = []
        for root_name in (r for r, m in run.roots.items() if m == modality):
            replay = _replayable_calls(run, modality, root_name)
            members = {
                n: run.named[n]
                for n in best
                if match_prefix(n, (root_name,)) is not None
                and run.adapter.modality_of(n) == modality
            }
            if not replay or not members:
                continue
            say(
                f"end-to-end attribution: {modality.value} ({len(members)} modules, {len(replay)} replayed calls)"
            )
            results.append(_estimate_root(run, root_name, replay, members, best, modality))
            release_memory()
        if results:
            e2e.update(_ranked(_merged(results), best, run.cfg))
            for result in results:
                _record_costs(run.costs, modality, result)
    for lp in local.values():
        lp.release()
    return e2e


def _merged(results: list[Attribution]) -> Attribution:
    """One modality's attribution from its roots' (each weighted by its output energy share)."""
    if len(results) == 1:
        return results[0]
    total = sum(r.output_energy for r in results)
    merged = Attribution({}, {}, total, 0.0, 0.0, exhaustive=None)
    for r in results:
        w = r.output_energy / total if total > 0 else 0.0
        merged.contributions.update({n: c * w for n, c in r.contributions.items()})
        merged.per_scheme.update(
            {n: {s: c * w for s, c in by.items()} for n, by in r.per_scheme.items()}
        )
        if r.exhaustive is not None:
            merged.exhaustive = merged.exhaustive or {}
            merged.exhaustive.update({n: c * w for n, c in r.exhaustive.items()})
    return merged


def _replayable_calls(run: _Run, modality: Modality, root_name: str) -> list[tuple[tuple, dict]]:
    rec = run.watches.recorders.get(root_name)
    if rec is None:
        return []
    if not rec.calls:
        if rec.failed:
            log.warning("%s", rec.failed)
        elif rec.refused:
            log.warning(
                "%s: no end-to-end attribution: the %s adapter refused all %d calls of its "
                "root '%s' for replay (its own forward_loop makes the call it records)",
                modality.value, run.adapter.family, rec.refused, root_name,
            )  # fmt: skip
    return rec.calls


def _estimate_root(
    run: _Run,
    root_name: str,
    replay: list[tuple[tuple, dict]],
    members: dict[str, nn.Module],
    best: dict[str, str],
    modality: Modality,
) -> Attribution:
    local, cfg = run.watches.local, run.cfg
    samples = _per_modality(cfg.estimator_samples, modality)
    return estimate(
        run.named[root_name],
        [sample_subset(call, samples) for call in replay],
        members,
        lambda n, scheme, args, y: local[n].candidate_output(scheme, args),
        {n: _scored_schemes(local[n], best[n], cfg.e2e_schemes) for n in members},
        seed=cfg.seed,
        exhaustive=cfg.exhaustive,
        max_batch=_per_modality(cfg.estimator_batch, modality),
        steps=run.watches.recorders[root_name].steps,
        noise_power=(
            (lambda n, scheme: local[n].noise_power(scheme))
            if cfg.estimator == "diagonal"
            else None
        ),
    )


def _ranked(result: Attribution, best: dict[str, str], cfg: ProbeConfig) -> dict[str, EndToEnd]:
    order = sorted(result.contributions, key=lambda n: (-result.contributions[n], n))
    return {
        n: EndToEnd(
            scheme=best[n],
            contribution=result.contributions[n],
            rank=rank,
            exhaustive=None if result.exhaustive is None else result.exhaustive[n],
            schemes=result.per_scheme[n] if cfg.e2e_schemes == "all" else {},
        )
        for rank, n in enumerate(order, start=1)
    }


def _record_costs(costs: dict[str, float], modality: Modality, result: Attribution) -> None:
    """Add one root's attribution costs to its modality's (summed over its roots)."""
    key = modality.value
    fwd = costs[f"{key}_forward_seconds"] = (
        costs.get(f"{key}_forward_seconds", 0.0) + result.seconds_forward
    )
    est = costs[f"{key}_estimator_seconds"] = (
        costs.get(f"{key}_estimator_seconds", 0.0) + result.seconds_estimator
    )
    if fwd <= 0:
        return  # no float replay timed (it runs for the exhaustive reference only): no unit
    costs[f"{key}_estimator_forward_equivalents"] = est / fwd
    if result.seconds_exhaustive is not None:
        exh = costs[f"{key}_exhaustive_seconds"] = (
            costs.get(f"{key}_exhaustive_seconds", 0.0) + result.seconds_exhaustive
        )
        costs[f"{key}_exhaustive_forward_equivalents"] = exh / fwd


def _per_modality(value: int | Mapping[str, int] | None, modality: Modality) -> int | None:
    """A count given for every modality or per modality name (None: not given)."""
    if isinstance(value, Mapping):
        return value.get(modality.value)
    return value


def _scored_schemes(lp: LocalProbe, best: str, which: str) -> tuple[str, ...]:
    """The local best first (the reference scheme of ranks and the exhaustive run), then, with
    ``which == "all"``, every other scheme the local probe measured."""
    if which != "all":
        return (best,)
    return (best, *(s for s in lp.feasible_schemes() if s != best))


# ---- assembly ----------------------------------------------------------------------------------


def _assemble(run: _Run, e2e: dict[str, EndToEnd]) -> SensitivityReport:
    """The report: one entry per watched or quantizable module, findings, modality summaries."""
    adapter, w = run.adapter, run.watches
    entries = [
        _module_entry(run, name, module, e2e.get(name))
        for name, module in run.named.items()
        if name and (name in run.watched or name in w.local)
    ]
    findings: list[Finding] = [
        sw.finding(n or "(model)", adapter.modality_of(n))
        for n, sw in w.softmax.items()
        if sw.max_score > 0
    ]
    findings += [gw.finding(m) for m, gw in w.gelu.items() if gw.ref > 0]
    return SensitivityReport(
        model=adapter.model_id,
        backend=backend_label(adapter.device),
        # JSON form (tuples as lists), so a report equals its own round trip.
        config={"family": adapter.family, **json.loads(json.dumps(asdict(run.cfg)))},
        modules=entries,
        modalities=summarize_modalities(entries, adapter.describe_output),
        findings=findings,
        costs={k: round(v, 6) for k, v in run.costs.items()},
    )


def _module_entry(run: _Run, name: str, module: nn.Module, e2e: EndToEnd | None) -> ModuleSensitivity:  # fmt: skip
    w = run.watches
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
    )


def _weight_shape(module: nn.Module) -> list[int] | None:
    weight = getattr(module, "weight", None)
    return [int(d) for d in weight.shape] if isinstance(weight, torch.Tensor) else None


def _fp16_stats(run: _Run, name: str, module: nn.Module, calls: int) -> Fp16Stats | None:
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
