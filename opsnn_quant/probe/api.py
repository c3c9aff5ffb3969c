"""``probe(model_or_adapter, forward_loop, config) -> SensitivityReport``.

Two passes of the forward loop (statistics, then local int8 errors) and an offline replay of
recorded root calls for the end-to-end attribution. See :mod:`opsnn_quant.probe.fp16`,
:mod:`~opsnn_quant.probe.local` and :mod:`~opsnn_quant.probe.attribution`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.probe.attribution import estimate
from opsnn_quant.probe.findings import GeluWatch, SoftmaxWatch, attention_parts
from opsnn_quant.probe.fp16 import Fp16Accumulator
from opsnn_quant.probe.hooks import (
    NORMS,
    QUANTIZABLE,
    count_params,
    first_tensor,
    macs_of,
    watched_modules,
)
from opsnn_quant.probe.local import LocalProbe
from opsnn_quant.probe.memory import release_memory
from opsnn_quant.probe.recording import RootRecorder
from opsnn_quant.probe.report import (
    FP16_MAX,
    EndToEnd,
    ModuleSensitivity,
    SensitivityReport,
    summarize_modalities,
)
from opsnn_quant.types import ForwardLoop, Modality

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeConfig:
    """What to probe and how.

    Attributes:
        min_headroom: flag a module whose |input| or |output| exceeds ``65504 / min_headroom``.
        fp16: run the fp16/bf16 overflow probe.
        w8a8: run the local int8 error probe.
        attribution: estimate end-to-end contributions (needs ``w8a8``).
        exhaustive: also run the one-module-at-a-time reference (N + 1 replays; slow).
        max_root_calls: recorded calls per root for the attribution replay.
        estimator_batch: replay recorded calls to the estimator in chunks of this many samples
            (where a call can be split, see :func:`~opsnn_quant.probe.attribution.estimate`):
            its backward keeps the whole forward graph, so peak memory falls with the chunk.
            One number for every modality, or a mapping modality name -> samples (e.g. Whisper:
            ``{"audio_encoder": 1}``: 1500-frame utterances one at a time, which is also faster
            there, while the short decoder calls stay whole). None / a modality left out
            replays whole calls.
        e2e_schemes: ``"all"`` scores every candidate scheme of a module end to end (same
            forward/backward, more int8 reference work at gradient time) so the policy can pick
            schemes by end-to-end effect; ``"best"`` scores only the locally best scheme.
        estimator: ``"structured"`` projects each candidate's real output error (run at
            gradient time) on the output gradient: the policy's default, best at choosing
            schemes and at predicting the output SQNR. ``"diagonal"`` models each module's
            noise as white within an output channel with the power pass 2 measured: one forward
            + one backward and nothing else, every scheme free; ranks modules as well (see
            ``benchmarks/bench_probe.py``) but underestimates totals by up to ~2x.
        seed: seed of reservoirs and random directions.
    """

    min_headroom: float = 2.0
    fp16: bool = True
    w8a8: bool = True
    attribution: bool = True
    exhaustive: bool = False
    max_root_calls: int = 8
    estimator_batch: int | Mapping[str, int] | None = None
    e2e_schemes: Literal["all", "best"] = "all"
    estimator: Literal["structured", "diagonal"] = "structured"
    seed: int = 0


class _Hooks:
    def __init__(self) -> None:
        self.handles: list[Any] = []

    def add(self, handle: Any) -> None:
        self.handles.append(handle)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


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
        The :class:`SensitivityReport` (``probe.json``).
    """
    cfg = config or ProbeConfig()
    adapter = _as_adapter(target, forward_loop, modalities)
    if forward_loop is None:
        raise ConfigError(
            "probe() needs a forward_loop: e.g. adapter.forward_loop(calibration_data)"
        )
    model = adapter.model
    say = progress or (lambda msg: log.info("%s", msg))
    named = dict(model.named_modules())
    watched = watched_modules(model)
    fp16_acc = (
        {n: Fp16Accumulator(rerun=kind in ("param", "act")) for n, (_, kind) in watched.items()}
        if cfg.fp16
        else {}
    )
    local = (
        {n: LocalProbe(n, m) for n, m in named.items() if n and type(m) in QUANTIZABLE}
        if cfg.w8a8
        else {}
    )
    macs: dict[str, list[int]] = {n: [0, 0] for n in local}
    roots = {mod: r for mod, r in adapter.roots().items() if r in named}
    recorders = (
        {
            r: RootRecorder(r, cfg.max_root_calls, cfg.seed, adapter.record_filter(r))
            for r in roots.values()
        }
        if cfg.attribution and cfg.w8a8
        else {}
    )
    softmax: dict[str, SoftmaxWatch] = {}
    gelu: dict[Modality, GeluWatch] = {}
    costs: dict[str, float] = {}
    hooks = _Hooks()

    # ---- pass 1: statistics -------------------------------------------------------------------
    for name, (module, kind) in watched.items():
        if name in fp16_acc:
            acc = fp16_acc[name]

            def fp16_hook(
                mod: nn.Module, args: tuple, kwargs: dict, out: Any, acc: Fp16Accumulator = acc
            ) -> None:
                x = first_tensor(args) if args else first_tensor(kwargs)
                acc.update(mod, x, first_tensor(out), args)

            hooks.add(module.register_forward_hook(fp16_hook, with_kwargs=True))
        if kind == "act":
            watch = gelu.setdefault(adapter.modality_of(name), GeluWatch())
            watch.modules.append(name)
            _watch_gelu(module, watch, hooks)
    for name, lp in local.items():

        def local_hook(
            mod: nn.Module, args: tuple, out: Any, lp: LocalProbe = lp, n: str = name
        ) -> None:
            x = first_tensor(args)
            y = first_tensor(out)
            if x is None or y is None:
                return
            lp.collect(x)
            macs[n][0] += macs_of(mod, y)
            macs[n][1] += 1

        hooks.add(lp.module.register_forward_hook(local_hook))
    for name, module in named.items():
        parts = attention_parts(module)
        if parts:
            qn, kn, heads, scale = parts
            sw = softmax[name] = SoftmaxWatch(heads, scale)
            hooks.add(
                getattr(module, qn).register_forward_hook(
                    lambda m, a, o, sw=sw: setattr(sw, "q", first_tensor(o))
                )
            )
            hooks.add(
                getattr(module, kn).register_forward_hook(
                    lambda m, a, o, sw=sw: setattr(sw, "k", first_tensor(o))
                )
            )
            hooks.add(module.register_forward_hook(lambda m, a, o, sw=sw: sw.close_call()))
    for root_name, root_rec in recorders.items():
        root = named[root_name]
        hooks.add(
            root.register_forward_pre_hook(
                lambda m, a, k, rec=root_rec: rec.offer(a, k), with_kwargs=True
            )
        )
    say("probe pass 1/2: ranges, fp16/bf16 re-runs, calibration statistics")
    t0 = time.perf_counter()
    try:
        forward_loop(model)
    finally:
        hooks.remove()
    costs["pass1_seconds"] = time.perf_counter() - t0
    release_memory()

    # ---- pass 2: local int8 errors --------------------------------------------------------------
    if local:
        for lp in local.values():
            lp.decide()
        for lp in local.values():
            if lp.calls == 0:
                continue

            def measure_hook(mod: nn.Module, args: tuple, out: Any, lp: LocalProbe = lp) -> None:
                y = first_tensor(out)
                if y is not None:
                    lp.measure(args, y)

            hooks.add(lp.module.register_forward_hook(measure_hook))
        say("probe pass 2/2: local int8 error of every candidate scheme")
        t0 = time.perf_counter()
        try:
            forward_loop(model)
        finally:
            hooks.remove()
        costs["pass2_seconds"] = time.perf_counter() - t0
        release_memory()

    # ---- end-to-end attribution -----------------------------------------------------------------
    e2e: dict[str, EndToEnd] = {}
    # A module none of whose schemes stayed finite gets no end-to-end estimate: the policy pins it.
    best = {n: lp.best_scheme() for n, lp in local.items() if lp.calls and lp.feasible_schemes()}
    for modality, root_name in roots.items():
        rec = recorders.get(root_name)
        replay = rec.calls if rec is not None else []
        if not replay:
            if rec is not None and rec.failed:
                log.warning("%s", rec.failed)
            elif rec is not None and rec.refused:
                log.warning(
                    "%s: no end-to-end attribution: the %s adapter refused all %d calls of its "
                    "root '%s' for replay (its own forward_loop makes the call it records)",
                    modality.value, adapter.family, rec.refused, root_name,
                )  # fmt: skip
            continue
        members = {
            n: named[n]
            for n in best
            if (root_name == "" or n.startswith(root_name + "."))
            and adapter.modality_of(n) == modality
        }
        if not members:
            continue
        say(
            f"end-to-end attribution: {modality.value} ({len(members)} modules, {len(replay)} replayed calls)"
        )
        result = estimate(
            named[root_name],
            replay,
            members,
            lambda n, scheme, args, y: local[n].shadow(scheme)(*args),
            {n: _scored_schemes(local[n], best[n], cfg.e2e_schemes) for n in members},
            seed=cfg.seed,
            exhaustive=cfg.exhaustive,
            max_batch=_estimator_batch(cfg, modality),
            noise_power=(
                (lambda n, scheme: local[n].noise_power(scheme))
                if cfg.estimator == "diagonal"
                else None
            ),
        )
        release_memory()
        order = sorted(members, key=lambda n: (-result.contributions[n], n))
        for rank, n in enumerate(order, start=1):
            e2e[n] = EndToEnd(
                scheme=best[n],
                contribution=result.contributions[n],
                rank=rank,
                exhaustive=None if result.exhaustive is None else result.exhaustive[n],
                schemes=result.per_scheme[n] if cfg.e2e_schemes == "all" else {},
            )
        key = modality.value
        costs[f"{key}_forward_seconds"] = result.seconds_forward
        costs[f"{key}_estimator_seconds"] = result.seconds_estimator
        costs[f"{key}_estimator_forward_equivalents"] = result.seconds_estimator / max(
            result.seconds_forward, 1e-9
        )
        if result.seconds_exhaustive is not None:
            costs[f"{key}_exhaustive_seconds"] = result.seconds_exhaustive
            costs[f"{key}_exhaustive_forward_equivalents"] = result.seconds_exhaustive / max(
                result.seconds_forward, 1e-9
            )
    for lp in local.values():
        lp.release()

    # ---- assemble ---------------------------------------------------------------------------------
    entries: list[ModuleSensitivity] = []
    for name, module in named.items():
        if not name or (name not in watched and name not in local):
            continue
        kind = watched.get(name, (module, "param"))[1]
        calls = local[name].calls if name in local else 0
        fp16 = None
        if name in softmax and softmax[name].max_score > FP16_MAX and name in fp16_acc:
            fp16_acc[name].extra_reasons.append(
                f"softmax input: attention scores reach {softmax[name].max_score:.4g} > 65504"
            )
        if name in fp16_acc and (fp16_acc[name].in_absmax or fp16_acc[name].out_absmax or calls):
            fp16 = fp16_acc[name].result(cfg.min_headroom, isinstance(module, NORMS))
        entries.append(
            ModuleSensitivity(
                name=name,
                type=type(module).__name__,
                modality=adapter.modality_of(name),
                params=count_params(module) if kind not in ("residual", "attention") else 0,
                macs=macs[name][0] // max(macs[name][1], 1) if name in macs else 0,
                calls=calls,
                fp16=fp16,
                w8a8=local[name].results() if name in local else {},
                e2e=e2e.get(name),
            )
        )
    findings = [
        w.finding(n or "(model)", adapter.modality_of(n))
        for n, w in softmax.items()
        if w.max_score > 0
    ]
    findings += [w.finding(m) for m, w in gelu.items() if w.ref > 0]
    report = SensitivityReport(
        model=adapter.model_id,
        backend="cpu-reference" if not _on_npu(model) else "npu",
        config={"family": adapter.family, **asdict(cfg)},
        modules=entries,
        modalities=summarize_modalities(entries, adapter.describe_output),
        findings=findings,
        costs={k: round(v, 6) for k, v in costs.items()},
    )
    return report


def _estimator_batch(cfg: ProbeConfig, modality: Modality) -> int | None:
    if isinstance(cfg.estimator_batch, Mapping):
        return cfg.estimator_batch.get(modality.value)
    return cfg.estimator_batch


def _watch_gelu(module: nn.Module, watch: GeluWatch, hooks: _Hooks) -> None:
    proj = getattr(module, "proj", None)
    if isinstance(proj, nn.Linear):  # diffusers GELU/GEGLU: the activation acts on proj's output
        geglu = type(module).__name__ == "GEGLU"

        def on_proj(m: nn.Module, a: tuple, o: torch.Tensor) -> None:
            watch.update(o.chunk(2, dim=-1)[1] if geglu else o)

        hooks.add(proj.register_forward_hook(on_proj))
    else:
        hooks.add(module.register_forward_hook(lambda m, a, o: watch.update(a[0])))


def _on_npu(model: nn.Module) -> bool:
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "npu"


def _scored_schemes(lp: LocalProbe, best: str, which: str) -> tuple[str, ...]:
    """The local best first (the reference scheme of ranks and the exhaustive run), then, with
    ``which == "all"``, every other scheme the local probe measured."""
    if which != "all":
        return (best,)
    return (best, *(s for s in lp.feasible_schemes() if s != best))
