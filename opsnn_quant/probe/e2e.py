"""The probe's end-to-end phase: each modality's recorded root calls replayed to the estimator.

Two ways to get there, chosen by :func:`replay_measured`:

* **Local errors from the replay** (the default: the structured estimator scoring every scheme).
  The estimator runs every candidate of every module at gradient time anyway, on the replayed
  calls' inputs; the same outputs give each candidate's local error (signal, noise, cross
  energies) against the module's float output in that forward. So pass 2 over the forward loop
  runs only for the modules the replay does not reach (outside every recorded root), after the
  attribution. The local best and the feasible schemes are known once the replay is done: the
  module's contribution is then its best scheme's, and schemes whose output overflowed drop out.
* **Local errors from pass 2** (the diagonal estimator, which needs pass 2's per-channel noise
  powers; ``e2e_schemes: best``, which needs the local best first; the exhaustive reference;
  ``probe.local_errors: forward_loop``): pass 2 first, then the attribution of each module's
  feasible schemes, the local best first.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from opsnn_quant.core.memory import release_memory
from opsnn_quant.core.timesteps import group_of
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.offload import BlockOffload, offload_of, window
from opsnn_quant.probe.attention import AttentionWatch
from opsnn_quant.probe.attribution import Attribution, estimate
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.local import LocalProbe
from opsnn_quant.probe.passes import Watches, inside_root
from opsnn_quant.probe.projections import NoiseFn, StepKey
from opsnn_quant.probe.report import EndToEnd
from opsnn_quant.quant.gptq import MomentStore
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.recording import sample_subset, split_batch
from opsnn_quant.types import Modality

log = logging.getLogger(__name__)


@dataclass
class ProbeRun:
    """One probe run: the model's modules, what is watched, and the costs measured."""

    adapter: ModelAdapter
    cfg: ProbeConfig
    named: dict[str, nn.Module]
    watched: dict[str, tuple[nn.Module, str]]
    roots: dict[str, Modality]  # root module -> modality (several roots per modality allowed)
    watches: Watches
    costs: dict[str, float] = field(default_factory=dict)
    smoothing_groups: dict[str, list[str]] = field(default_factory=dict)  # see the report's

    def root_members(self, root_name: str, names: Iterable[str]) -> list[str]:
        """The names among ``names`` inside root ``root_name`` and of its modality."""
        modality = self.roots[root_name]
        return [n for n in names if inside_root(self.adapter, n, root_name, modality)]


def replay_measured(run: ProbeRun) -> set[str]:
    """The Linear/Conv2d modules whose local errors the attribution's replay measures (see the
    module docstring): those inside a root with recorded calls, when the configuration scores
    every scheme with the structured estimator; empty otherwise (pass 2 measures everything)."""
    cfg = run.cfg
    if not (
        cfg.attribution
        and cfg.local_errors == "replayed"
        and cfg.estimator == "structured"
        and cfg.e2e_schemes == "all"
        and not cfg.exhaustive
    ):
        return set()
    local = run.watches.local
    called = [n for n, lp in local.items() if lp.calls and lp.schemes]
    measured: set[str] = set()
    for root_name, rec in run.watches.recorders.items():
        if rec.calls and cfg.estimates(run.roots[root_name].value):
            measured.update(run.root_members(root_name, called))
    return measured


def attribute_modalities(
    run: ProbeRun, say: Callable[[str], None], replayed: set[str]
) -> dict[str, EndToEnd]:
    """Per module, its end-to-end contribution within its modality (recorded calls replayed).

    ``replayed`` (from :func:`replay_measured`) are the modules whose local errors the replay
    measures; the others have theirs from pass 2 already. A modality with several roots (SDXL's
    two text encoders) is attributed root by root, and each root's contributions are weighted by
    its share of the modality's output energy, so they add up to the relative noise of all its
    outputs together.
    """
    local = run.watches.local
    # A module none of whose schemes stayed finite gets no end-to-end estimate: the policy pins it.
    best = {
        n: lp.best_scheme()
        for n, lp in local.items()
        if n not in replayed and lp.calls and lp.feasible_schemes()
    }
    e2e: dict[str, EndToEnd] = {}
    watches = run.watches.attention
    for modality in dict.fromkeys(run.roots.values()):
        if not run.cfg.estimates(modality.value):  # decided before the estimators
            continue
        results = []
        for root_name in (r for r, m in run.roots.items() if m == modality):
            calls = _replayable_calls(run, modality, root_name)
            names = run.root_members(root_name, (n for n in local if n in best or n in replayed))
            members = {n: run.named[n] for n in names}
            attention = {
                n: (run.named[n], watches[n])
                for n in run.root_members(root_name, (n for n, w in watches.items() if w.runs))
            }
            if not calls or not (members or attention):
                continue
            say(
                f"end-to-end attribution: {modality.value} ({len(members)} modules, "
                f"{len(attention)} attention, {len(calls)} replayed calls)"
            )
            result = _estimate_root(run, root_name, calls, members, best, replayed, attention)
            result = _with_local_best(result, local, best, replayed)
            results.append(_attention_best(result, attention, best))
            for name in members:  # nothing reads a root's candidates after its attribution
                local[name].release()
            release_memory()
        if results:
            e2e.update(_ranked(_merged(results), best, run.cfg))
            for result in results:
                _record_costs(run.costs, modality, result)
    for lp in local.values():
        lp.release()
    return e2e


def _attention_best(
    result: Attribution,
    attention: Mapping[str, tuple[nn.Module, AttentionWatch]],
    best: dict[str, str],
) -> Attribution:
    """For the attention modules, their local best scheme (into ``best``), first in their
    per-scheme contributions; one no replayed call reached leaves the result."""
    for name, (_, watch) in attention.items():
        by_scheme = result.per_scheme.pop(name, {})
        result.contributions.pop(name, None)
        chosen = watch.best_scheme()
        if chosen is None or chosen not in by_scheme:
            continue
        best[name] = chosen
        order = (chosen, *(s for s in watch.schemes if s != chosen and s in watch.energies))
        result.per_scheme[name] = {s: by_scheme[s] for s in order}
        result.contributions[name] = by_scheme[chosen]
    return result


def _with_local_best(
    result: Attribution,
    local: Mapping[str, LocalProbe],
    best: dict[str, str],
    replayed: set[str],
) -> Attribution:
    """For the modules whose local errors the replay measured, their local best scheme (into
    ``best``) and feasible schemes: their contribution is the best scheme's, the schemes whose
    output overflowed leave, and a module with none left (or not reached) leaves the result."""
    for name in [n for n in result.per_scheme if n in replayed]:
        lp = local[name]
        feasible = lp.feasible_schemes()
        by_scheme = result.per_scheme.pop(name)
        result.contributions.pop(name)
        if not feasible:
            continue  # no call reached it (pass 2 will measure it), or every scheme overflowed
        best[name] = lp.best_scheme()
        order = (best[name], *(s for s in feasible if s != best[name]))
        result.per_scheme[name] = {s: by_scheme[s] for s in order}
        result.contributions[name] = by_scheme[best[name]]
    return result


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


def _replayable_calls(
    run: ProbeRun, modality: Modality, root_name: str
) -> list[tuple[tuple, dict]]:
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
    run: ProbeRun,
    root_name: str,
    calls: list[tuple[tuple, dict]],
    members: dict[str, nn.Module],
    best: dict[str, str],
    replayed: set[str],
    attention: dict[str, tuple[nn.Module, AttentionWatch]],
) -> Attribution:
    local, cfg = run.watches.local, run.cfg
    modality = run.roots[root_name]
    samples = _per_modality(cfg.estimator_samples, modality)
    schemes = {
        n: local[n].schemes if n in replayed else _scored_schemes(local[n], best[n], cfg.e2e_schemes)
        for n in members
    }  # fmt: skip
    calls = [sample_subset(call, samples) for call in calls]
    max_batch = _per_modality(cfg.estimator_batch, modality)
    parts = sum(len(split_batch(call, max_batch)) for call in calls)
    for name in members:
        if name in replayed:
            local[name].plan_replay(parts)
    model_bytes = sum(p.numel() * p.element_size() for p in run.adapter.model.parameters())
    weights = _Weights(
        local, offload_of(run.adapter.model), replayed, candidates_memory(model_bytes)
    )
    with window(run.adapter.model):  # the blocks weights.of opens: the last one closed after
        return _estimate_with(
            run, root_name, calls, members, schemes, max_batch, weights, attention
        )


# The candidates' integer weights the attribution keeps in memory (see _Weights): half the
# model's weights within these bounds (as GPTQ's moments, opsnn_quant.probe.moments)
MIN_CANDIDATES_MEMORY = 64 * 2**20
MAX_CANDIDATES_MEMORY = 512 * 2**20


def candidates_memory(weight_bytes: int) -> int:
    """The bytes of candidate weights an in-memory attribution keeps unparked, for a model of
    ``weight_bytes``: half of them, within [64 MiB, 512 MiB]."""
    return min(max(weight_bytes // 2, MIN_CANDIDATES_MEMORY), MAX_CANDIDATES_MEMORY)


def _estimate_with(
    run: ProbeRun,
    root_name: str,
    calls: list[tuple[tuple, dict]],
    members: dict[str, nn.Module],
    schemes: dict[str, tuple[str, ...]],
    max_batch: int | None,
    weights: _Weights,
    attention: dict[str, tuple[nn.Module, AttentionWatch]],
) -> Attribution:
    """:func:`~opsnn_quant.probe.attribution.estimate` of one root's ``members``, their
    candidates' weights read where ``weights`` says."""
    local, cfg, replayed = run.watches.local, run.cfg, weights.replayed
    return estimate(
        run.named[root_name],
        calls,
        members,
        _candidates(local, replayed, weights),
        schemes,
        seed=cfg.seed,
        exhaustive=cfg.exhaustive,
        max_batch=max_batch,
        steps=run.watches.recorders[root_name].steps,
        unreached=_measure_unreached(local, replayed, weights),
        step_key=_step_key(local),
        noise_power=(
            (lambda n, scheme: local[n].noise_power(scheme))
            if cfg.estimator == "diagonal"
            else None
        ),
        attention=attention,
    )


def _candidates(local: Mapping[str, LocalProbe], replayed: set[str], weights: _Weights) -> NoiseFn:
    """The estimator's candidate outputs; those of ``replayed`` modules also add their local
    error (:meth:`LocalProbe.replayed_output`); built from weights ``weights`` opens."""

    def output(
        name: str, scheme: str, args: tuple, y: torch.Tensor, calls: int = 1
    ) -> torch.Tensor:
        with weights.of(name):
            if name in replayed:
                return local[name].replayed_output(scheme, args, y, calls)
            return local[name].candidate_output(scheme, args)

    return output


class _Weights:
    """Where the attribution's candidates read their module's weights: in memory, or on an
    offloaded model (``--max-memory``) in the module's block: loaded for the backward through
    it (a checkpointed block stays loaded through its backward), else opened and kept open
    until a module of another block needs its own (the batched small calls run module by
    module at the end of the replay). A block's candidates are dropped once a module of
    another block builds its own: one block's int8 weights at a time, in every variant."""

    def __init__(
        self,
        local: Mapping[str, LocalProbe],
        off: BlockOffload | None,
        replayed: set[str],
        budget: int = 2**62,
    ) -> None:
        self.local, self.off, self.replayed = local, off, replayed
        self.block: str | None = None  # the block whose modules' candidates are built
        self.built: set[str] = set()
        # in memory: the candidates of the modules measured last, up to ``budget`` bytes; the
        # others' integer weights parked in files (LocalProbe.park) until their module is
        # measured again (the next replayed call, the batched small calls). A root's
        # candidates all held at once are 7.5 bytes per weight for the eager target's schemes
        # (Whisper-base's decoder: +700 MB, the row's peak). A budget, not a park at each
        # switch of module: a model whose candidates fit (the demos) writes and reads nothing
        self.budget = budget
        self.resident: dict[str, int] = {}  # unparked modules, least recently measured first
        self.store: MomentStore | None = None

    @contextlib.contextmanager
    def of(self, name: str) -> Iterator[None]:
        """Module ``name``'s weights readable meanwhile."""
        off = self.off
        if off is None:
            self.resident.pop(name, None)
            yield
            self.resident[name] = self.local[name].candidate_bytes()
            while sum(self.resident.values()) > self.budget and len(self.resident) > 1:
                oldest = next(iter(self.resident))
                self.store = self.store or MomentStore()
                self.local[oldest].park(self.store)
                del self.resident[oldest]
            return
        owner = off.owner(name)
        if owner != self.block:
            for built in self.built:
                self.local[built].release()
            self.built.clear()
            self.block = owner
        self.built.add(name)
        if owner is not None and not off.blocks[owner].loaded:
            off.touch(name)  # open until another block's module is touched (see window())
        yield


def _step_key(local: Mapping[str, LocalProbe]) -> StepKey:
    """Which replayed calls a candidate may run on at once: a per-step scheme's calls of one
    group of denoising steps (it reads the clock); any calls for the other schemes."""

    def key(name: str, scheme: str, step: int | None) -> int | None:
        if step is None or not SCHEMES[scheme].per_step:
            return None
        bounds = local[name].step_bounds
        return 0 if bounds is None else group_of(step, bounds)

    return key


def _measure_unreached(
    local: Mapping[str, LocalProbe], replayed: set[str], weights: _Weights
) -> Callable[[str, tuple, torch.Tensor], None]:
    """For a ``replayed`` module that ran in a replayed call but got no gradient (the root
    output does not depend on it: its contribution is 0), its local errors all the same."""

    def measure(name: str, args: tuple, y: torch.Tensor) -> None:
        if name in replayed:
            with weights.of(name):
                for scheme in local[name].schemes:
                    local[name].replayed_output(scheme, args, y)

    return measure


def _ranked(result: Attribution, best: dict[str, str], cfg: ProbeConfig) -> dict[str, EndToEnd]:
    order = sorted(result.contributions, key=lambda n: (-result.contributions[n], n))
    return {
        n: EndToEnd(
            scheme=best[n],
            contribution=result.contributions[n],
            rank=rank,
            exhaustive=None if result.exhaustive is None else result.exhaustive.get(n),
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
