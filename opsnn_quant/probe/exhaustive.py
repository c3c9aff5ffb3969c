"""The attribution's exhaustive reference: each module quantized alone, the root replayed
(N + 1 passes), against the float outputs."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from opsnn_quant.core.numerics import energies
from opsnn_quant.probe.projections import NoiseFn
from opsnn_quant.recording import replay


def float_outputs(
    root: nn.Module, calls: list[tuple[tuple, dict]], steps: list[int | None]
) -> tuple[list[torch.Tensor], float]:
    """The root's float output of every call (no gradients), and the seconds it took."""
    t0 = time.perf_counter()
    with torch.no_grad():
        refs = [replay(root, call, step) for call, step in zip(calls, steps, strict=True)]
    return refs, time.perf_counter() - t0


def one_at_a_time(
    root: nn.Module,
    calls: list[tuple[tuple, dict]],
    steps: list[int | None],
    refs: list[torch.Tensor],
    modules: dict[str, nn.Module],
    schemes: dict[str, str],
    quantized_output: NoiseFn,
) -> dict[str, float]:
    """Per module, the root output's noise energy over ``calls`` (against ``refs``) with only
    that module's output replaced by its output under ``schemes[name]``."""
    noise: dict[str, float] = {}
    for name, module in modules.items():
        total = 0.0
        with torch.no_grad(), SwapOutput(module, name, schemes[name], quantized_output):
            for call, ref, step in zip(calls, refs, steps, strict=True):
                total += energies(ref, replay(root, call, step)).noise
        noise[name] = total
    return noise


class SwapOutput:
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
