"""The probe's two calibration passes over the forward loop.

Pass 1 (statistics): fp32 ranges and fp16/bf16 re-runs of every watched module, the activation
statistics of every Linear/Conv2d's candidate schemes, attention scores, GELU inputs and a
reservoir of each modality root's calls. Pass 2 (local error): every candidate scheme of every
Linear/Conv2d run on that module's real inputs against its float output.

Hooks are small module-level functions bound with :func:`functools.partial` to the object they
feed, so every watch is visible in :class:`Watches` and nothing hides in closures.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from opsnn_quant.core.memory import release_memory, trim_heap
from opsnn_quant.core.tensors import first_tensor
from opsnn_quant.core.timesteps import at_step
from opsnn_quant.errors import CalibrationError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.offload import touch, window
from opsnn_quant.probe.all_macs import OtherMacs, paused
from opsnn_quant.probe.attention import AttentionWatch, observing
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.findings import GeluWatch, SoftmaxWatch, attention_parts
from opsnn_quant.probe.fp16 import Fp16Accumulator
from opsnn_quant.probe.hooks import QUANTIZABLE, in_rerun, macs_of
from opsnn_quant.probe.local import LocalProbe, decide_shared
from opsnn_quant.quant.attention import attention_modules
from opsnn_quant.quant.spec import ATTENTION_TYPE
from opsnn_quant.recording import RootRecorder
from opsnn_quant.types import ForwardLoop, Modality, match_prefix


@dataclass
class Watches:
    """What the passes collect, per module (see :func:`watches_for`).

    Attributes:
        fp16: watched module -> its fp16/bf16 statistics.
        local: Linear/Conv2d -> its candidate schemes' statistics and errors.
        macs: Linear/Conv2d -> [MACs summed over calls, calls].
        recorders: root module -> its call reservoir (for the attribution replay).
        inputs: Linear/Conv2d outside every root -> a reservoir of its own calls, when the
            replay measures local errors (:attr:`ProbeConfig.replays_local_errors`): their
            local errors are then measured on these, without a pass over the forward loop.
        softmax: attention module -> its largest softmax input.
        gelu: modality -> exact-vs-tanh GELU error of its GELUs.
        other_macs: modality -> the MACs of its matmul-like calls outside Linear/Conv2d
            (attention's products, Conv1d/Conv3d: :mod:`.all_macs`), summed over pass 1.
        attention: attention module -> its SDPA calls' ranges and MACs, where the target runs
            int8 attention (:mod:`.attention`).
    """

    fp16: dict[str, Fp16Accumulator] = field(default_factory=dict)
    local: dict[str, LocalProbe] = field(default_factory=dict)
    macs: dict[str, list[int]] = field(default_factory=dict)
    recorders: dict[str, RootRecorder] = field(default_factory=dict)
    inputs: dict[str, RootRecorder] = field(default_factory=dict)
    softmax: dict[str, SoftmaxWatch] = field(default_factory=dict)
    gelu: dict[Modality, GeluWatch] = field(default_factory=dict)
    other_macs: dict[str, int] = field(default_factory=dict)
    attention: dict[str, AttentionWatch] = field(default_factory=dict)

    def portable(self) -> Watches:
        """What pass 1 gathered, fit to send to another process: no modules, no filters (the
        modules' statistics and reservoirs only)."""
        return Watches(
            fp16=self.fp16,
            local={n: lp.portable() for n, lp in self.local.items()},
            macs=self.macs,
            recorders={n: r.portable() for n, r in self.recorders.items()},
            inputs={n: r.portable() for n, r in self.inputs.items()},
            softmax=self.softmax,
            gelu=self.gelu,
            other_macs=self.other_macs,
            attention=self.attention,
        )

    def merge(self, other: Watches) -> None:
        """Add what pass 1 gathered on the data that follows this one's (another rank's
        share of the batches), watch by watch: the result is pass 1 over both shares, bit for
        bit (see :mod:`opsnn_quant.core.stream` for the reservoirs)."""
        for name, acc in other.fp16.items():
            if name in self.fp16:  # (a pass without the fp16 re-runs takes none)
                self.fp16[name].merge(acc)
        for name, lp in other.local.items():
            self.local[name].merge(lp)
        for name, (macs, calls) in other.macs.items():
            self.macs[name][0] += macs
            self.macs[name][1] += calls
        for name, rec in [*other.recorders.items(), *other.inputs.items()]:
            (self.recorders.get(name) or self.inputs[name]).merge(rec)
        for name, sw in other.softmax.items():
            self.softmax[name].merge(sw)
        for modality, gw in other.gelu.items():
            self.gelu[modality].merge(gw)
        for key, macs in other.other_macs.items():
            self.other_macs[key] = self.other_macs.get(key, 0) + macs
        for name, watch in other.attention.items():
            self.attention[name].merge(watch)


class HookSet:
    """Handles of the hooks one pass installed, removed together."""

    def __init__(self) -> None:
        self.handles: list[RemovableHandle] = []

    def add(self, handle: RemovableHandle) -> None:
        """Keep ``handle`` for :meth:`remove`."""
        self.handles.append(handle)

    def remove(self) -> None:
        """Remove every hook."""
        for h in self.handles:
            h.remove()
        self.handles.clear()


def watches_for(
    adapter: ModelAdapter,
    cfg: ProbeConfig,
    named: dict[str, nn.Module],
    watched: dict[str, tuple[nn.Module, str]],
    roots: dict[str, Modality],
) -> Watches:
    """The empty watches of every module the configuration probes."""
    w = Watches()
    if cfg.fp16:
        w.fp16 = {
            n: Fp16Accumulator(rerun=kind in ("param", "act"), mode=cfg.fp16_rerun, bf16=cfg.bf16)
            for n, (_, kind) in watched.items()
        }
    if cfg.w8a8:
        w.local = {
            n: LocalProbe(
                n,
                m,
                alpha_grid=tuple(cfg.smoothquant_alphas),
                only=cfg.schemes_for(type(m).__name__, adapter.modality_of(n).value),
                timestep_groups=cfg.timestep_groups,
                error_rows=cfg.error_rows,
                engine=cfg.engine,
                engine_dtype=cfg.engine_dtype,
            )
            for n, m in named.items()
            if n and type(m) in QUANTIZABLE
        }
        w.macs = {n: [0, 0] for n in w.local}
        attention_schemes = cfg.schemes_of(ATTENTION_TYPE)
        if attention_schemes:  # only where the target runs int8 attention
            kept = {
                n: cfg.schemes_for(ATTENTION_TYPE, adapter.modality_of(n).value)
                for n in attention_modules(adapter.model)
            }
            w.attention = {n: AttentionWatch(tuple(s)) for n, s in kept.items() if s}
        if cfg.attribution:
            w.recorders = {
                r: RootRecorder(r, cfg.max_root_calls, cfg.seed, adapter.record_filter(r))
                for r in roots
            }
        if cfg.replays_local_errors:
            w.inputs = {
                n: RootRecorder(n, cfg.max_root_calls, cfg.seed)
                for n in w.local
                if not any(inside_root(adapter, n, r, m) for r, m in roots.items())
            }
    for name, (_, kind) in watched.items():
        if kind == "act":
            w.gelu.setdefault(adapter.modality_of(name), GeluWatch()).modules.append(name)
    for name, module in named.items():
        parts = attention_parts(module)
        if parts:
            _, _, heads, scale = parts
            w.softmax[name] = SoftmaxWatch(heads, scale)
    return w


def statistics_pass(
    w: Watches,
    adapter: ModelAdapter,
    named: dict[str, nn.Module],
    watched: dict[str, tuple[nn.Module, str]],
    forward_loop: ForwardLoop,
) -> float:
    """Pass 1: run the forward loop with every statistics hook; returns its seconds. The MACs
    the model's Linear/Conv2d modules do not make are counted beside it (``w.other_macs``),
    the hooks' own work paused (:mod:`.all_macs`)."""
    hooks = HookSet()
    for name, (module, kind) in watched.items():
        if name in w.fp16:
            hook = paused(partial(_fp16_hook, w.fp16[name]))
            hooks.add(module.register_forward_hook(hook, with_kwargs=True))
        if kind == "act":
            _watch_gelu(module, w.gelu[adapter.modality_of(name)], hooks)
    for name, lp in w.local.items():
        hook = paused(partial(_collect_hook, lp, w.macs[name]))
        hooks.add(lp.module.register_forward_hook(hook))
    for name, sw in w.softmax.items():
        module = named[name]
        parts = attention_parts(module)
        assert parts is not None
        q_name, k_name, _, _ = parts
        hooks.add(getattr(module, q_name).register_forward_hook(partial(_keep_output, sw, "q")))
        hooks.add(getattr(module, k_name).register_forward_hook(partial(_keep_output, sw, "k")))
        hooks.add(module.register_forward_hook(paused(partial(_close_attention, sw))))
    for root_name, recorder in [*w.recorders.items(), *w.inputs.items()]:
        pre_hook = paused(recorder.forward_pre_hook)
        hooks.add(named[root_name].register_forward_pre_hook(pre_hook, with_kwargs=True))
    counter = OtherMacs(adapter.roots(), named)
    with counter.counting(), observing(w.attention, named):
        seconds = _run(forward_loop, adapter.model, hooks)
    for modality, macs in counter.macs.items():
        w.other_macs[modality.value] = w.other_macs.get(modality.value, 0) + macs
    return seconds


def inside_root(adapter: ModelAdapter, name: str, root: str, modality: Modality) -> bool:
    """Whether module ``name`` is inside root ``root`` and of the root's ``modality`` (what the
    root's attribution covers)."""
    return match_prefix(name, (root,)) is not None and adapter.modality_of(name) == modality


def measure_kept_inputs(w: Watches, names: set[str], model: nn.Module | None = None) -> set[str]:
    """The local errors of the modules in ``names`` that pass 1 kept calls of (``w.inputs``),
    from those calls: the float output by the module itself, at the call's step (``model``
    offloaded: the module's block opened meanwhile, and its candidates dropped after). Returns
    the names measured so."""
    measured = set()
    with window(model) if model is not None else contextlib.nullcontext() as off:
        for name in sorted(names):
            rec = w.inputs.get(name)
            if rec is None or not rec.calls:
                continue
            touch(off, name)
            lp = w.local[name]
            with torch.no_grad():
                for (args, kwargs), step in zip(rec.calls, rec.steps, strict=True):
                    with at_step(step):
                        y = first_tensor(lp.module(*args, **kwargs))
                        if y is not None:
                            lp.measure_kept(args, y, len(rec.calls))
            lp.flush()
            if off is not None:
                lp.release()
            measured.add(name)
    return measured


def smoothquant_search(
    w: Watches, groups: Mapping[str, Sequence[str]], model: nn.Module | None = None
) -> tuple[float, dict[str, list[str]]]:
    """Between the passes: every module's SmoothQuant alphas, one shared factor per group of
    ``groups`` (producer -> the Linears it feeds) whose members all saw the same inputs.
    ``model`` (the model the modules are in): where it is offloaded (``--max-memory``), the
    blocks whose weights the search reads are opened one at a time, in model order.

    Returns:
        (seconds it took, the groups that share a factor).
    """
    t0 = time.perf_counter()
    shared: dict[str, list[str]] = {}
    with window(model) if model is not None else contextlib.nullcontext() as off:
        for producer, names in groups.items():
            members = [w.local[n] for n in names if n in w.local]
            with contextlib.ExitStack() as opened:
                if off is not None:
                    touch(off, names[0])
                    for name in names[1:]:  # a group across blocks (none seen): all open
                        opened.enter_context(off.opened(name))
                if len(members) == len(names) and decide_shared(members):
                    shared[producer] = list(names)
        done = {n for names in shared.values() for n in names}
        for name, lp in w.local.items():
            if name not in done:
                touch(off, name)
                lp.decide()
    trim_heap()  # the row reservoirs and the search's temporaries are freed
    return time.perf_counter() - t0, shared


def local_error_pass(
    w: Watches,
    model: nn.Module,
    forward_loop: ForwardLoop,
    only: set[str] | None = None,
    release: bool = False,
    transient: bool = False,
) -> float:
    """Pass 2: every candidate's output error on the module's real inputs (after
    :func:`smoothquant_search`), for every called module or those in ``only``. With
    ``release`` (nothing after this pass runs the candidates), each module's candidates are
    dropped after its last call: one module's at a time, not every module's; with
    ``transient`` (an offloaded model), after each call they measure
    (:attr:`LocalProbe.transient`). Returns the pass's seconds."""
    hooks = HookSet()
    measured = [lp for n, lp in w.local.items() if lp.calls and (only is None or n in only)]
    for lp in measured:
        lp.release_after_pass2 = release
        lp.transient = transient
        hooks.add(lp.module.register_forward_hook(partial(_measure_hook, lp)))
    t0 = time.perf_counter()
    try:
        _run(forward_loop, model, hooks)
    finally:
        for lp in measured:
            lp.release_after_pass2 = lp.transient = False
    with window(model) as off:  # an offloaded model: the block of each module flushed open
        for lp in measured:
            if lp.pending_batches:
                touch(off, lp.name)
            lp.flush()  # the small calls kept to measure together
            if release or transient:
                lp.release()
    return time.perf_counter() - t0


def _run(forward_loop: ForwardLoop, model: nn.Module, hooks: HookSet) -> float:
    t0 = time.perf_counter()
    try:
        forward_loop(model)
    finally:
        hooks.remove()
    seconds = time.perf_counter() - t0
    release_memory()
    return seconds


def _fp16_hook(acc: Fp16Accumulator, module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:  # fmt: skip
    if in_rerun():
        return
    x = first_tensor(args) if args else first_tensor(kwargs)
    acc.update(module, x, first_tensor(out), args)


def _collect_hook(lp: LocalProbe, macs: list[int], module: nn.Module, args: tuple, out: Any) -> None:  # fmt: skip
    if in_rerun():
        return
    x, y = first_tensor(args), first_tensor(out)
    if x is None or y is None:
        return
    try:
        lp.collect(x)
    except CalibrationError as e:  # NaN/Inf activations: say where they are
        raise CalibrationError(f"module '{lp.name}': {e}") from None
    macs[0] += macs_of(module, y)
    macs[1] += 1


def _measure_hook(lp: LocalProbe, module: nn.Module, args: tuple, out: Any) -> None:
    if in_rerun():
        return
    y = first_tensor(out)
    if y is not None:
        lp.measure(args, y)


def _keep_output(sw: SoftmaxWatch, attr: str, module: nn.Module, args: tuple, out: Any) -> None:
    if in_rerun():
        return
    setattr(sw, attr, first_tensor(out))


def _close_attention(sw: SoftmaxWatch, module: nn.Module, args: tuple, out: Any) -> None:
    if in_rerun():
        return
    sw.close_call()


def _gelu_of_proj(watch: GeluWatch, geglu: bool, module: nn.Module, args: tuple, out: torch.Tensor) -> None:  # fmt: skip
    if in_rerun():
        return
    watch.update(out.chunk(2, dim=-1)[1] if geglu else out)


def _gelu_of_input(watch: GeluWatch, module: nn.Module, args: tuple, out: Any) -> None:
    if in_rerun():
        return
    watch.update(args[0])


def _watch_gelu(module: nn.Module, watch: GeluWatch, hooks: HookSet) -> None:
    proj = getattr(module, "proj", None)
    if isinstance(proj, nn.Linear):  # diffusers GELU/GEGLU: the activation acts on proj's output
        geglu = type(module).__name__ == "GEGLU"
        hooks.add(proj.register_forward_hook(paused(partial(_gelu_of_proj, watch, geglu))))
    else:
        hooks.add(module.register_forward_hook(paused(partial(_gelu_of_input, watch))))
