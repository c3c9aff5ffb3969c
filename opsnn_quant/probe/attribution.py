"""End-to-end attribution: how much each module's int8 noise moves its modality's final output.

Root calls (the UNet, the VAE decoder, an encoder, the whole Whisper model) are recorded during
the first calibration pass (:mod:`opsnn_quant.recording`) and replayed offline.

**Structured estimator** (one forward with gradients + one backward per recorded call, whatever the number of
modules). Module i adds noise ``e_i`` (its candidate's output minus the float output) to its output;
to first order the root output moves by ``J_i e_i``. For a random direction ``v ~ N(0, I)`` on the
output, ``E[(v . J_i e_i)^2] = ||J_i e_i||^2``, and ``v . J_i e_i = e_i . (J_i^T v)`` where
``J_i^T v`` is the gradient of ``v . y`` with respect to module i's output: one backward pass gives
it for every module at once. Each sample of the batch draws its own ``v``, so one call averages
over the batch. The estimate is unbiased for the actual (structured) noise, not a white-noise
model. Contribution = estimated ``sum ||J_i e_i||^2 / sum ||y||^2``.

**Several candidate schemes per module** cost no extra pass: the noises are computed when the
module's gradient arrives (from its saved input and output) and all are projected on the *same*
gradient, so the comparison between schemes carries common random numbers. Local SQNR alone can
rank schemes wrongly end to end (e.g. SmoothQuant moving noise into the channels the output is most
sensitive to); this measures that directly.

**Diagonal estimator** (``noise_power``; the cheapest): the same forward + backward, but no
candidate runs at gradient time. Each module's noise is modelled as white within an output channel
``c`` with the power ``sigma_c^2`` the local probe measured in pass 2, so
``E[(g . e)^2] = sum_c sigma_c^2 sum(g_c^2)``: a per-channel reduction of the gradient, the same for
every scheme. It ranks modules about as well as the structured estimator but misses correlations
between the noise and the gradient inside a channel (e.g. clipping error on the tokens the output
is most sensitive to), so it predicts totals and chooses schemes less well.

**Attention modules** (``attention``): the output of their SDPA call is a tap point of its own
(:mod:`.attention`): the candidates' int8 attention outputs are computed from the call's query,
key and value when the gradient arrives there, and projected on it as above (structured, with
either estimator: there is no per-channel noise model of an attention).

**Exhaustive reference**: quantize one module at a time and replay (N + 1 passes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from opsnn_quant.core.numerics import signal_energy
from opsnn_quant.core.tensors import first_tensor
from opsnn_quant.core.timesteps import at_step, current_step
from opsnn_quant.errors import CalibrationError
from opsnn_quant.models.offload import in_recompute
from opsnn_quant.probe.attention import AttentionWatch, SdpaTaps, detached
from opsnn_quant.probe.exhaustive import float_outputs, one_at_a_time
from opsnn_quant.probe.projections import KeptCalls, NoiseFn, Projector, StepKey
from opsnn_quant.quant.attention import read_call
from opsnn_quant.recording import detached_copy, split_batch

log = logging.getLogger(__name__)

# (name, scheme) -> float64 mean noise power per output channel, or None if not measured
PowerFn = Callable[[str, str], "torch.Tensor | None"]
# (name, args, y): a module ran in a replayed call but no gradient reached its output
UnreachedFn = Callable[[str, tuple, torch.Tensor], None]


@dataclass
class Attribution:
    """Per-module contributions for one root, plus costs.

    ``contributions[name]`` is the contribution under the module's first scheme;
    ``per_scheme[name][scheme]`` those of every scheme it was scored under.
    ``seconds_forward`` is the no-gradient replay that keeps the float outputs for the exhaustive
    reference (0 without it: the output energy comes from the estimator's own forward).
    """

    contributions: dict[str, float]
    per_scheme: dict[str, dict[str, float]]
    output_energy: float
    seconds_forward: float
    seconds_estimator: float
    exhaustive: dict[str, float] | None = None
    seconds_exhaustive: float | None = None


def estimate(
    root: nn.Module,
    calls: list[tuple[tuple, dict]],
    modules: dict[str, nn.Module],
    quantized_output: NoiseFn,
    schemes: dict[str, tuple[str, ...]],
    seed: int = 0,
    exhaustive: bool = False,
    max_batch: int | None = None,
    noise_power: PowerFn | None = None,
    steps: list[int | None] | None = None,
    unreached: UnreachedFn | None = None,
    step_key: StepKey | None = None,
    attention: dict[str, tuple[nn.Module, AttentionWatch]] | None = None,
) -> Attribution:
    """Attribute the root's output noise to ``modules`` (see module docstring).

    Args:
        root: the root module (float).
        calls: recorded calls to replay.
        modules: name -> module inside the root whose int8 noise is attributed.
        quantized_output: the module's output under a scheme, for its call ``args`` and float ``y``.
        schemes: name -> the schemes to score it under (at least one; the first is the module's
            reference scheme, the one ``contributions`` and the exhaustive run use).
        seed: seed of the random output directions.
        exhaustive: also run the one-module-at-a-time reference (first scheme only).
        max_batch: replay each call to the estimator in chunks of at most this many samples
            where the call can be split (see :func:`~opsnn_quant.probe.recording.split_batch`); None keeps calls whole.
        noise_power: the *diagonal* estimator: per (module, scheme) the measured mean noise
            power of each output channel (from the local probe); the noise is then modelled
            as white within a channel and no candidate is run at gradient time
            (``quantized_output`` is not called). None: the structured estimator.
        steps: the denoising step each call was recorded at (the clock is set to it while the
            call replays, forward and backward, so per-step candidates use their step's scales).
        unreached: structured estimator only: told of every call of a module that ran in a
            replayed call but whose output no gradient reached (its contribution stays 0), with
            the call's inputs and float output, once the call's backward is done.
        step_key: structured estimator only: which calls' rows may run through one candidate
            of ``(name, scheme)`` at once, by the step each was recorded at (the same key: the
            candidate reads the same clock); None: calls of the same step only (see
            :mod:`~opsnn_quant.probe.projections`).
        attention: attention modules inside the root -> (module, its pass-1 watch): their SDPA
            output attributed under each of the watch's schemes (their local errors added to
            the watch); their contribution under the first scheme in ``contributions``.
    """
    steps = steps if steps is not None else [None] * len(calls)
    gen = torch.Generator().manual_seed(seed)
    params = list(root.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        # The float outputs are kept for the exhaustive reference only (Whisper logits: ~7 MB
        # per utterance); the output energy comes from the estimator's own forward.
        refs, t_fwd = float_outputs(root, calls, steps) if exhaustive else ([], 0.0)

        t0 = time.perf_counter()
        energy = 0.0
        acc = {n: dict.fromkeys(schemes[n], 0.0) for n in modules}
        attention = attention or {}
        acc |= {n: dict.fromkeys(w.schemes, 0.0) for n, (_, w) in attention.items()}
        kept = KeptCalls()  # the small calls all modules keep to project in batches
        projectors = {
            n: Projector(n, m, schemes[n], quantized_output, acc[n], step_key, kept)
            for n, m in modules.items()
        }
        for call, step in zip(calls, steps, strict=True):
            # In chunks where asked: the backward keeps the whole forward graph (attention maps
            # included), several times an inference's memory; a chunk of the batch keeps less.
            for part in split_batch(call, max_batch):
                state = _CallState()
                taps = _AttentionCall(attention, acc, state)
                # a torch function mode sees every call: entered only where there is attention
                tapping = (
                    SdpaTaps(taps.modules, taps.handle).tapping() if attention else nullcontext()
                )
                with at_step(step), tapping:
                    if noise_power is not None:
                        _diagonal_call(root, part, modules, noise_power, schemes, acc, gen, state)
                    else:
                        _estimator_call(root, part, modules, projectors, gen, unreached, state)
                energy += state.signal
        for projector in projectors.values():
            projector.flush()
        t_est = time.perf_counter() - t0
        per_scheme = {
            n: {s: a / energy if energy > 0 else 0.0 for s, a in by.items()}
            for n, by in acc.items()
        }
        contributions = {n: per_scheme[n][schemes[n][0]] for n in modules}
        contributions |= {n: per_scheme[n][w.schemes[0]] for n, (_, w) in attention.items()}

        result = Attribution(contributions, per_scheme, energy, t_fwd, t_est)
        if exhaustive:
            t0 = time.perf_counter()
            first = {n: schemes[n][0] for n in modules}
            noise = one_at_a_time(root, calls, steps, refs, modules, first, quantized_output)
            result.exhaustive = {n: e / energy if energy > 0 else 0.0 for n, e in noise.items()}
            result.seconds_exhaustive = time.perf_counter() - t0
        return result
    finally:
        # the parameters as the root holds them now: an offloaded block's are new tensors
        # each time it loads (the flags they carry are the ones set above, kept by the loads)
        for p, f in zip(root.parameters(), flags, strict=True):
            p.requires_grad_(f)


class _StructuredTap:
    """The structured estimator's view of one module during one recorded call.

    Its forward hook saves the call's input and float output (detached views) and puts the
    output in the graph; the gradient hook hands them and the arriving gradient to the module's
    :class:`~opsnn_quant.probe.projections.Projector`, which projects every candidate scheme's
    noise ``(y_q - y)`` on it (small calls batched over the replay).
    """

    def __init__(self, name: str, projector: Projector, call: _CallState) -> None:
        self.name, self.projector, self.call = name, projector, call
        # calls no gradient reached yet: inputs, float output, their version counters
        self.waiting: dict[int, tuple[tuple, torch.Tensor, tuple[list[int], int]]] = {}
        self.calls = 0

    def forward_hook(self, module: nn.Module, args: tuple, out: Any) -> Any:
        """Save this call's input/output and return the output wired into the graph."""
        y = first_tensor(out)
        if y is None or not isinstance(out, torch.Tensor):
            return None
        if in_recompute():  # a checkpointed block's second run of this call: the same graph
            return self.call.watch(out)
        # Detached views, not copies: autograd usually holds these activations anyway. The
        # version counters catch an in-place change before the gradient arrives.
        saved = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        y_ref = y.detach()
        versions = (
            [a._version for a in saved if isinstance(a, torch.Tensor)],
            y_ref._version,
        )
        y_out = self.call.watch(out)
        key = self.calls = self.calls + 1
        self.waiting[key] = (saved, y_ref, versions)
        y_out.register_hook(partial(self.on_gradient, saved, y_ref, versions, key))
        return y_out

    def finish(self, unreached: UnreachedFn | None) -> None:
        """After the call's backward: tell ``unreached`` of the calls no gradient reached."""
        if unreached is not None:
            for saved, y_ref, versions in self.waiting.values():
                self._check_versions(saved, y_ref, versions)
                unreached(self.name, saved, y_ref)
        self.waiting.clear()

    def _check_versions(
        self, saved: tuple, y_ref: torch.Tensor, versions: tuple[list[int], int]
    ) -> None:
        now = ([a._version for a in saved if isinstance(a, torch.Tensor)], y_ref._version)
        if now != versions:
            raise CalibrationError(
                f"the input or output of '{self.name}' was modified in place before its "
                "gradient arrived; its end-to-end contribution cannot be estimated"
            )

    def on_gradient(
        self,
        saved: tuple,
        y_ref: torch.Tensor,
        versions: tuple[list[int], int],
        key: int,
        g: torch.Tensor,
    ) -> None:
        """Hand the call and the gradient ``g`` of ``v . y`` at this output to the projector."""
        self.waiting.pop(key, None)
        self._check_versions(saved, y_ref, versions)
        self.projector.add(saved, y_ref, g, self.call.batch)


class _DiagonalTap:
    """The diagonal estimator's view of one module: ``sum_c sigma_c^2 * sum(g_c^2)``, where
    ``g`` is the gradient of ``v . y`` at the module's output and ``sigma_c^2`` the measured
    noise power of output channel ``c``: ``E[(g . e)^2]`` for noise white within each channel."""

    def __init__(
        self,
        name: str,
        schemes: tuple[str, ...],
        noise_power: PowerFn,
        acc: dict[str, float],
        channel_dim: int,
        call: _CallState,
    ) -> None:
        self.name, self.schemes, self.noise_power = name, schemes, noise_power
        self.acc, self.channel_dim, self.call = acc, channel_dim, call

    def forward_hook(self, module: nn.Module, args: tuple, out: Any) -> Any:
        """Return the output wired into the graph, with the gradient hook on it."""
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None
        y_out = self.call.watch(out)
        if not in_recompute():  # a checkpointed block's second run: its hook is on the first
            y_out.register_hook(self.on_gradient)
        return y_out

    def on_gradient(self, g: torch.Tensor) -> None:
        """Accumulate the per-channel gradient energy weighted by each scheme's noise power."""
        with torch.no_grad():
            g2 = g.detach().float().pow(2)
            dims = [d for d in range(g2.dim()) if d != self.channel_dim % g2.dim()]
            per_channel = g2.sum(dim=dims).double()
            for scheme in self.schemes:
                power = self.noise_power(self.name, scheme)
                if power is not None:
                    self.acc[scheme] += float(per_channel @ power)


class _CallState:
    """What the taps of one recorded call share: the zero that puts every watched output in the
    graph, and the batch size of the root's output (known just before the backward)."""

    def __init__(self) -> None:
        self.zero = torch.zeros((), requires_grad=True)
        self.batch: int | None = None
        self.signal = 0.0  # sum of the root output's squares (the float output: taps add zero)

    def watch(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` in the graph even when the root's inputs are integers (token ids)."""
        return out + self.zero


class _AttentionCall:
    """The attention modules' SDPA outputs in one replayed call: each wired into the graph
    like a module's output; when its gradient arrives, every candidate's output of the call's
    own query/key/value, its noise projected on the gradient (per sample of the root's batch)
    and its local error added to the module's watch."""

    def __init__(
        self,
        attention: dict[str, tuple[nn.Module, AttentionWatch]],
        acc: dict[str, dict[str, float]],
        state: _CallState,
    ) -> None:
        self.watches = {n: w for n, (_, w) in attention.items()}
        self.modules = {n: m for n, (m, _) in attention.items()}
        self.acc, self.state = acc, state

    def handle(self, name: str, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """The SDPA call's output, wired to its gradient hook when the op can run the call."""
        out = func(*args, **kwargs)
        call = read_call(args, kwargs)
        if call.problem is not None or not isinstance(out, torch.Tensor) or in_recompute():
            return out
        wired = self.state.watch(out)
        # the clock as the call ran: a per-step candidate takes that step's group's scales
        step = current_step()
        wired.register_hook(partial(self.on_gradient, name, detached(call), step, out.detach()))
        return wired

    @torch.no_grad()
    def on_gradient(
        self, name: str, call: Any, step: int | None, reference: torch.Tensor, g: torch.Tensor
    ) -> None:
        """Project each candidate's noise on ``g`` and add its local error."""
        watch = self.watches[name]
        batch = self.state.batch
        g64 = g.detach().to(torch.float64)
        rows = batch if batch and g64.dim() > 0 and g64.shape[0] == batch else 1
        for scheme, out in watch.candidates(call, step).items():
            watch.add_error(scheme, reference, out)
            e = out.to(torch.float64) - reference.to(torch.float64)
            per_sample = (g64.reshape(rows, -1) * e.reshape(rows, -1)).sum(dim=1)
            self.acc[name][scheme] += float(per_sample.square().sum())


def _estimator_call(
    root: nn.Module,
    call: tuple[tuple, dict],
    modules: dict[str, nn.Module],
    projectors: dict[str, Projector],
    gen: torch.Generator,
    unreached: UnreachedFn | None,
    state: _CallState,
) -> _CallState:
    taps = [
        (module, _StructuredTap(name, projectors[name], state)) for name, module in modules.items()
    ]
    _forward_backward(root, call, [(m, t.forward_hook) for m, t in taps], gen, state)
    for _, tap in taps:
        tap.finish(unreached)
    return state


def _diagonal_call(
    root: nn.Module,
    call: tuple[tuple, dict],
    modules: dict[str, nn.Module],
    noise_power: PowerFn,
    schemes: dict[str, tuple[str, ...]],
    acc: dict[str, dict[str, float]],
    gen: torch.Generator,
    state: _CallState,
) -> _CallState:
    taps = [
        (
            module,
            _DiagonalTap(
                name, schemes[name], noise_power, acc[name],
                1 if isinstance(module, nn.Conv2d) else -1, state,
            ),
        )
        for name, module in modules.items()
    ]  # fmt: skip
    _forward_backward(root, call, [(m, t.forward_hook) for m, t in taps], gen, state)
    return state


def _forward_backward(
    root: nn.Module,
    call: tuple[tuple, dict],
    hooks: list[tuple[nn.Module, Callable[..., Any]]],
    gen: torch.Generator,
    state: _CallState,
) -> None:
    """Replay ``call`` with gradients and the forward ``hooks`` installed, then backward a random
    direction ``v ~ N(0, I)`` of the root output; ``state.batch`` receives the output's batch
    size before the backward (the structured taps split their projections by it) and
    ``state.signal`` the output's energy."""
    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    try:
        with torch.enable_grad():
            args, kwargs = detached_copy(call)
            y = first_tensor(root(*args, **kwargs))
            if y is None:
                return
            state.signal = signal_energy(y)
            if not y.requires_grad:
                return
            state.batch = y.shape[0] if y.dim() > 0 else 1
            v = torch.randn(y.shape, generator=gen, dtype=torch.float32).to(y.dtype)
            y.backward(v)
    finally:
        for h in handles:
            h.remove()
