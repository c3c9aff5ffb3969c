"""End-to-end attribution: how much each module's int8 noise moves its modality's final output.

Root calls (the UNet, the VAE decoder, an encoder, the whole Whisper model) are recorded during
the first calibration pass (:mod:`opsnn_quant.probe.recording`) and replayed offline.

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

**Exhaustive reference**: quantize one module at a time and replay (N + 1 passes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from opsnn_quant.errors import CalibrationError
from opsnn_quant.numerics import energies
from opsnn_quant.probe.hooks import first_tensor
from opsnn_quant.probe.memory import TRIM
from opsnn_quant.probe.recording import detached_copy, replay, split_batch

log = logging.getLogger(__name__)

# (name, scheme, args, y) -> the module's output under ``scheme``
NoiseFn = Callable[[str, str, tuple, torch.Tensor], torch.Tensor]
# (name, scheme) -> float64 mean noise power per output channel, or None if not measured
PowerFn = Callable[[str, str], "torch.Tensor | None"]


@dataclass
class Attribution:
    """Per-module contributions for one root, plus costs.

    ``contributions[name]`` is the contribution under the module's first scheme;
    ``per_scheme[name][scheme]`` those of every scheme it was scored under.
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
    """
    gen = torch.Generator().manual_seed(seed)
    params = list(root.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        t0 = time.perf_counter()
        refs = []  # kept for the exhaustive reference only (Whisper logits: ~7 MB per utterance)
        energy = 0.0
        with torch.no_grad():
            for call in calls:
                ref = replay(root, call)
                energy += energies(ref, ref).signal
                if exhaustive:
                    refs.append(ref)
        t_fwd = time.perf_counter() - t0

        t0 = time.perf_counter()
        acc = {n: dict.fromkeys(schemes[n], 0.0) for n in modules}
        for call in calls:
            # In chunks where asked: the backward keeps the whole forward graph (attention maps
            # included), several times an inference's memory; a chunk of the batch keeps less.
            for part in split_batch(call, max_batch):
                if noise_power is not None:
                    _diagonal_call(root, part, modules, noise_power, schemes, acc, gen)
                else:
                    _estimator_call(root, part, modules, quantized_output, schemes, acc, gen)
        t_est = time.perf_counter() - t0
        per_scheme = {
            n: {s: a / energy if energy > 0 else 0.0 for s, a in by.items()}
            for n, by in acc.items()
        }
        contributions = {n: per_scheme[n][schemes[n][0]] for n in modules}

        result = Attribution(contributions, per_scheme, energy, t_fwd, t_est)
        if exhaustive:
            t0 = time.perf_counter()
            result.exhaustive = {}
            for name, module in modules.items():
                noise = 0.0
                swap = _swap_output(module, name, schemes[name][0], quantized_output)
                with torch.no_grad(), swap:
                    for call, ref in zip(calls, refs, strict=True):
                        noise += energies(ref, replay(root, call)).noise
                result.exhaustive[name] = noise / energy if energy > 0 else 0.0
            result.seconds_exhaustive = time.perf_counter() - t0
        return result
    finally:
        for p, f in zip(params, flags, strict=True):
            p.requires_grad_(f)


def _estimator_call(
    root: nn.Module,
    call: tuple[tuple, dict],
    modules: dict[str, nn.Module],
    quantized_output: NoiseFn,
    schemes: dict[str, tuple[str, ...]],
    acc: dict[str, dict[str, float]],
    gen: torch.Generator,
) -> None:
    zero = torch.zeros((), requires_grad=True)
    batch: list[int] = []

    def hook_for(name: str) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple, out: Any) -> Any:
            y = first_tensor(out)
            if y is None or not isinstance(out, torch.Tensor):
                return None
            # Detached views, not copies: autograd usually holds these activations anyway. The
            # version counters catch an in-place change before the gradient arrives.
            saved = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            y_ref = y.detach()
            versions = [a._version for a in saved if isinstance(a, torch.Tensor)]
            y_ref_version = y_ref._version
            # Adding a zero that requires grad puts every watched output in the graph, even when
            # the root's inputs are integers (token ids).
            y_out = out + zero

            def grad_hook(g: torch.Tensor) -> None:
                now = [a._version for a in saved if isinstance(a, torch.Tensor)]
                if now != versions or y_ref._version != y_ref_version:
                    raise CalibrationError(
                        f"the input or output of '{name}' was modified in place before its "
                        "gradient arrived; its end-to-end contribution cannot be estimated"
                    )
                gf = g.detach().float()
                yf = y_ref.float()
                with torch.no_grad():
                    for scheme in schemes[name]:
                        # fp32 products and sums (fp64 over whole activations doubled the pass's
                        # cost); only the per-sample projections are squared in float64.
                        prod = (quantized_output(name, scheme, saved, y_ref).float() - yf) * gf
                        if batch and prod.dim() > 0 and prod.shape[0] == batch[0]:
                            s = prod.reshape(prod.shape[0], -1).sum(dim=1)
                        else:
                            s = prod.sum().reshape(1)
                        acc[name][scheme] += float(s.double().pow(2).sum())
                        TRIM.add(3 * y_ref.numel() * 4)  # the candidate's output and product

            y_out.register_hook(grad_hook)
            return y_out

        return hook

    hooks = [(module, hook_for(name)) for name, module in modules.items()]
    _forward_backward(root, call, hooks, gen, batch)


def _forward_backward(
    root: nn.Module,
    call: tuple[tuple, dict],
    hooks: list[tuple[nn.Module, Callable[..., Any]]],
    gen: torch.Generator,
    batch: list[int],
) -> None:
    """Replay ``call`` with gradients and the forward ``hooks`` installed, then backward a random
    direction ``v ~ N(0, I)`` of the root output; ``batch`` receives the output's batch size
    before the backward (the grad hooks split their projections by it)."""
    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    try:
        with torch.enable_grad():
            args, kwargs = detached_copy(call)
            y = first_tensor(root(*args, **kwargs))
            if y is None or not y.requires_grad:
                return
            batch.append(y.shape[0] if y.dim() > 0 else 1)
            v = torch.randn(y.shape, generator=gen, dtype=torch.float32).to(y.dtype)
            y.backward(v)
    finally:
        for h in handles:
            h.remove()


def _diagonal_call(
    root: nn.Module,
    call: tuple[tuple, dict],
    modules: dict[str, nn.Module],
    noise_power: PowerFn,
    schemes: dict[str, tuple[str, ...]],
    acc: dict[str, dict[str, float]],
    gen: torch.Generator,
) -> None:
    """One forward + backward; per module ``sum_c sigma_c^2 * sum(g_c^2)``, where ``g`` is the
    gradient of ``v . y`` at the module's output and ``sigma_c^2`` the measured noise power of
    output channel ``c``: ``E[(g . e)^2]`` for noise ``e`` white within each channel."""
    zero = torch.zeros((), requires_grad=True)

    def hook_for(name: str, channel_dim: int) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple, out: Any) -> Any:
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                return None
            y_out = out + zero

            def grad_hook(g: torch.Tensor) -> None:
                with torch.no_grad():
                    g2 = g.detach().float().pow(2)
                    dims = [d for d in range(g2.dim()) if d != channel_dim % g2.dim()]
                    per_channel = g2.sum(dim=dims).double()
                    for scheme in schemes[name]:
                        power = noise_power(name, scheme)
                        if power is not None:
                            acc[name][scheme] += float(per_channel @ power)

            y_out.register_hook(grad_hook)
            return y_out

        return hook

    hooks = [
        (module, hook_for(name, 1 if isinstance(module, nn.Conv2d) else -1))
        for name, module in modules.items()
    ]
    _forward_backward(root, call, hooks, gen, [])


class _swap_output:
    """Context: replace one module's output with its output under ``scheme`` (forward hook)."""

    def __init__(
        self, module: nn.Module, name: str, scheme: str, quantized_output: NoiseFn
    ) -> None:
        self.module, self.name, self.scheme, self.fn = module, name, scheme, quantized_output
        self.handle: Any = None

    def __enter__(self) -> None:
        def hook(module: nn.Module, args: tuple, out: Any) -> Any:
            if isinstance(out, torch.Tensor):
                return self.fn(self.name, self.scheme, args, out)
            return None

        self.handle = self.module.register_forward_hook(hook)

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()
