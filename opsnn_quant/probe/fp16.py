"""fp16 overflow probe: fp32 ranges and the module itself re-run in fp16 and bf16.

For each watched module and calibration call: fp32 input/output absmax and a streaming |x|
histogram (for the 99.9th percentile); for modules with weights or GELUs, the module re-run on the
fp16-cast input in two Ascend modes — INF_NAN (910B default: overflow becomes inf/nan) and
saturation (910A/310P: values clamp to ±65504, so the error is silent) — and in bf16. For norms,
the largest mean of squares over the normalised axes (the variance an fp16 kernel would hold).

How a module is re-run (:func:`run_as`): on an accelerator (npu, cuda) the real fp16/bf16 module.
On a CPU, whose fp16 kernels are slow (a 3x3 conv ~67x fp32) and unlike the NPU's, the Ascend
Cube is emulated instead: the operands (input, weights) are rounded to fp16/bf16, the module runs
in fp32 (the Cube accumulates in fp32), and its output is rounded to fp16/bf16 once, overflowing
to inf (INF_NAN mode) or clamped to ±65504 first (saturation mode). What the emulation cannot see
is an intermediate *inside* one module that overflows fp16 on the device while its output does
not (the norms' sum of squares is checked separately for that reason).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import nn

from opsnn_quant.core.memory import TRIM
from opsnn_quant.core.numerics import ExactSum, noise_energy, signal_energy
from opsnn_quant.core.stream import CallCounter
from opsnn_quant.probe.report import FP16_MAX, Fp16Stats
from opsnn_quant.probe.subsets import strided_samples
from opsnn_quant.quant.observers import PercentileObserver


def norm_mean_square_max(module: nn.Module, x: torch.Tensor) -> float | None:
    """Largest mean of x^2 over a norm's normalised axes (its variance's scale), in fp32."""
    xf = x.detach().to(torch.float32)
    if isinstance(module, nn.LayerNorm):
        dims = tuple(range(-len(module.normalized_shape), 0))
        return float(xf.pow(2).mean(dim=dims).max())
    if isinstance(module, nn.GroupNorm):
        b = xf.shape[0]
        g = xf.reshape(b, module.num_groups, -1)
        return float(g.pow(2).mean(dim=-1).max())
    return None


RISKY = FP16_MAX / 8  # a call whose fp32 range comes this close to 65504 is always re-run
RERUN_ROWS = 1024  # rows a sampled call that is not risky is re-run on (whole samples)
CHANNELS_FIRST = (nn.Conv1d, nn.Conv2d, nn.GroupNorm)  # (B, C, ...) inputs


def is_sampled_call(n: int) -> bool:
    """Whether call ``n`` (1-based) is one of the sampled calls 1, 4, 16, 64, ... (powers of 4)."""
    return n > 0 and n & (n - 1) == 0 and (n.bit_length() - 1) % 2 == 0


def is_sampled_position(batch: int, ordinal: int) -> bool:
    """Whether the call ``ordinal`` (1-based) of data batch ``batch`` (0-based) is re-run:
    calls 1, 4, 16, ... of batches 0, 3, 15, 63, ... (log-spaced in both, so the cost grows with
    the logs of the batches and of the calls per batch, and the choice depends on the call's
    place in the data, not on which process saw it)."""
    return is_sampled_call(batch + 1) and is_sampled_call(ordinal)


class ErrorEnergy:
    """Noise and signal energies summed over re-run calls (exactly: see :class:`ExactSum`)."""

    def __init__(self) -> None:
        self.noise = ExactSum()
        self.signal = ExactSum()

    def add(self, noise: float, signal: float) -> None:
        """Add one call's energies."""
        self.noise.add(noise)
        self.signal.add(signal)

    def merge(self, other: ErrorEnergy) -> None:
        """Add ``other``'s calls."""
        self.noise.merge(other.noise)
        self.signal.merge(other.signal)

    def ratio(self) -> float | None:
        """``sqrt(noise / signal)``; 0 for no noise and no signal, None for noise alone."""
        noise, signal = float(self.noise), float(self.signal)
        return math.sqrt(noise / signal) if signal > 0 else (0.0 if noise == 0 else None)


class Fp16Accumulator:
    """Streaming fp16/bf16 statistics of one module.

    Ranges (absmax) are tracked on every call. The expensive parts are sampled: the fp16 re-runs
    run on calls 1, 4, 16, 64, ... of data batches 0, 3, 15, ... (:func:`is_sampled_position`:
    spread over the loop, e.g. early and late denoising steps, at a cost that grows with the
    logs of the batches and calls; an encoder called twice a batch is re-run once a batch) and
    on every call whose fp32 input
    or output range exceeds ``65504 / 8``: the emulated re-run of a module can only overflow
    where its fp32 output nears 65504, so the calls left out only refine the fp16 error average.
    The bf16 re-run, which only decides whether an fp16-overflowing module may run in bf16,
    runs on the first call of the data's first batch and on those risky calls; the saturation-mode re-run only where its
    result can differ from INF_NAN mode (an out-of-range input, or a non-finite fp16 output).
    A sampled call that is not risky is re-run on an evenly strided subset of its samples (about
    :data:`RERUN_ROWS` rows, one sample at least; every watched kind is independent across
    samples): there the re-run only adds to the error averages, and a whole Whisper encoder
    batch re-run twice cost more than the pass's own forward. Risky calls re-run whole.
    The p99.9 histograms (descriptive: the report's percentiles) are of calls 1, 4, 16, ...
    """

    def __init__(self, rerun: bool, mode: str = "auto", bf16: bool = True) -> None:
        self.rerun = rerun
        self.bf16 = bf16  # also re-run in bf16
        self.mode = mode  # how re-runs run: see run_as
        self.calls = 0
        self.in_hist = PercentileObserver(99.9)
        self.out_hist = PercentileObserver(99.9)
        self.in_absmax = 0.0
        self.out_absmax = 0.0
        self.sumsq_max: float | None = None
        self.inf_nan = 0
        self.err16 = ErrorEnergy()
        self.err16_valid = True
        self.err_sat = ErrorEnergy()
        self.err_bf16 = ErrorEnergy()
        self.counter = CallCounter()
        # Evidence other checks found on this module (an attention's softmax scores past 65504).
        self.extra_reasons: list[str] = []

    @torch.no_grad()
    def update(
        self, module: nn.Module, x: torch.Tensor | None, y: torch.Tensor | None, args: tuple
    ) -> None:
        """Record one call (``args`` are the call's positional inputs, for the re-runs)."""
        self.calls += 1
        batch, ordinal = self.counter.next()
        sampled = is_sampled_position(batch, ordinal)
        x_max = _absmax(x, self.in_hist if sampled else None)
        y_max = _absmax(y, self.out_hist if sampled else None)
        self.in_absmax, self.out_absmax = max(self.in_absmax, x_max), max(self.out_absmax, y_max)
        if x is not None:
            ms = norm_mean_square_max(module, x)
            if ms is not None:
                self.sumsq_max = ms if self.sumsq_max is None else max(self.sumsq_max, ms)
        if not self.rerun or x is None or y is None:
            return
        risky = max(x_max, y_max) >= RISKY
        if sampled or risky:
            if not risky:
                channels = x.shape[1] if isinstance(module, CHANNELS_FIRST) else x.shape[-1]
                args, y = strided_samples(args, y, RERUN_ROWS, channels)
            first = batch == 0 and ordinal == 1
            self._rerun(module, args, y, x_max, bf16=self.bf16 and (risky or first))
            TRIM.add(4 * y.numel() * 4)  # the re-runs' outputs and casts

    def _rerun(
        self, module: nn.Module, args: tuple, y: torch.Tensor, x_max: float, bf16: bool
    ) -> None:
        """Re-run one call in fp16 (INF_NAN, and saturation where it can differ) and, with
        ``bf16``, in bf16; add up each one's error against the fp32 output ``y``."""
        y16 = run_as(module, args, torch.float16, saturate=False, mode=self.mode)
        if y16 is None:
            return
        signal = signal_energy(y)  # shared by the three errors below
        finite = torch.isfinite(y16)
        all_finite = bool(finite.all())
        self.inf_nan += int((~finite).sum())
        noise16 = noise_energy(y, y16) if all_finite else None
        if noise16 is not None:
            self.err16.add(noise16, signal)
        else:
            self.err16_valid = False
        if noise16 is not None and x_max <= FP16_MAX:
            noise_sat: float | None = noise16  # nothing saturates: both modes compute the same
        else:
            ysat = run_as(module, args, torch.float16, saturate=True, mode=self.mode)
            noise_sat = None if ysat is None else noise_energy(y, torch.nan_to_num(ysat, nan=0.0))
        if noise_sat is not None:
            self.err_sat.add(noise_sat, signal)
        if bf16:
            ybf = run_as(module, args, torch.bfloat16, saturate=False, mode=self.mode)
            if ybf is not None:
                self.err_bf16.add(noise_energy(y, ybf), signal)

    def merge(self, other: Fp16Accumulator) -> None:
        """Add the statistics ``other`` gathered on the data that follows this one's."""
        self.calls += other.calls
        self.in_hist.merge(other.in_hist)
        self.out_hist.merge(other.out_hist)
        self.in_absmax = max(self.in_absmax, other.in_absmax)
        self.out_absmax = max(self.out_absmax, other.out_absmax)
        if other.sumsq_max is not None:
            mine = self.sumsq_max
            self.sumsq_max = other.sumsq_max if mine is None else max(mine, other.sumsq_max)
        self.inf_nan += other.inf_nan
        self.err16.merge(other.err16)
        self.err16_valid = self.err16_valid and other.err16_valid
        self.err_sat.merge(other.err_sat)
        self.err_bf16.merge(other.err_bf16)

    def result(self, min_headroom: float, is_norm: bool) -> Fp16Stats:
        """Fp16Stats with the overflow verdict and its evidence."""
        reasons = []
        limit = FP16_MAX / min_headroom
        if self.inf_nan:
            reasons.append(f"{self.inf_nan} inf/nan outputs when run in fp16")
        if self.out_absmax >= limit:
            reasons.append(
                f"output absmax {self.out_absmax:.4g} (headroom {FP16_MAX / self.out_absmax:.3g}x)"
            )
        if self.in_absmax >= limit:
            reasons.append(
                f"input absmax {self.in_absmax:.4g} (headroom {FP16_MAX / self.in_absmax:.3g}x)"
            )
        if is_norm and self.sumsq_max is not None and self.sumsq_max > FP16_MAX:
            reasons.append(f"norm variance scale (mean x^2) {self.sumsq_max:.4g} > 65504")
        reasons.extend(self.extra_reasons)

        return Fp16Stats(
            input_absmax=self.in_absmax,
            output_absmax=self.out_absmax,
            input_p999=_p999(self.in_hist),
            output_p999=_p999(self.out_hist),
            headroom_in=FP16_MAX / self.in_absmax if self.in_absmax > 0 else None,
            headroom_out=FP16_MAX / self.out_absmax if self.out_absmax > 0 else None,
            sumsq_absmax=self.sumsq_max,
            inf_nan_count=self.inf_nan,
            rel_error_fp16=self.err16.ratio() if (self.rerun and self.err16_valid) else None,
            rel_error_fp16_saturate=self.err_sat.ratio() if self.rerun else None,
            rel_error_bf16=self.err_bf16.ratio() if self.rerun and self.bf16 else None,
            overflow=bool(reasons),
            reasons=reasons,
        )


def _absmax(t: torch.Tensor | None, hist: PercentileObserver | None) -> float:
    """``|t|``'s max (0 for none or an empty tensor); into ``hist`` too when given (and finite)."""
    if t is None or not t.numel():
        return 0.0
    # min and max in one sweep, no |t| copy (NaN stays NaN, as |t|'s max)
    lo, hi = torch.aminmax(t.detach())
    t_max = float(torch.maximum(-lo, hi))
    if hist is not None and math.isfinite(t_max):
        hist.collect_abs(t, t_max)
    return t_max


def _p999(obs: PercentileObserver) -> float:
    if obs.count == 0:
        return 0.0
    _, hi = obs._range(True)
    return float(hi)


RERUN_MODES = ("auto", "emulate", "native")


def run_as(
    module: nn.Module, args: tuple, dtype: torch.dtype, saturate: bool, mode: str = "auto"
) -> torch.Tensor | None:
    """``module``'s output when it runs in ``dtype`` (fp16/bf16) on ``args``, as fp32.

    Args:
        module: the module (left as it is).
        args: its call's positional inputs.
        dtype: ``torch.float16`` or ``torch.bfloat16``.
        saturate: fp16 saturation mode (910A/310P): inputs and outputs clamp to ±65504.
        mode: ``native`` runs a copy of the module in ``dtype`` (the device's own kernels);
            ``emulate`` emulates the Ascend Cube in fp32 (see the module docstring); ``auto``
            emulates on a CPU and runs natively elsewhere.

    Returns:
        The output (None when the module has no kernel for ``dtype`` or returns no tensor).
    """
    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    on_cpu = x is None or x.device.type == "cpu"
    if mode == "emulate" or (mode == "auto" and on_cpu):
        return _emulate(module, args, dtype, saturate)
    return _native(module, args, dtype, saturate)


def _rounded(t: torch.Tensor, dtype: torch.dtype, saturate: bool) -> torch.Tensor:
    """``t`` rounded to ``dtype`` and back to fp32 (clamped to ±65504 first in saturation mode)."""
    t = t.detach()
    if saturate:
        t = t.clamp(-FP16_MAX, FP16_MAX)
    return t.to(dtype).to(torch.float32)


def _emulate(
    module: nn.Module, args: tuple, dtype: torch.dtype, saturate: bool
) -> torch.Tensor | None:
    from opsnn_quant.core.tensors import first_tensor
    from opsnn_quant.probe.hooks import rerunning

    inputs = tuple(
        _rounded(a, dtype, saturate) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    )
    tensors = _converted(module, lambda t: _rounded(t, dtype, saturate=False))
    with torch.no_grad(), rerunning():
        # The module itself with its tensors swapped for rounded ones (no copy of its
        # structure); the probe's hooks on it and its children stand aside meanwhile.
        y = first_tensor(torch.func.functional_call(module, tensors, inputs))
    if y is None:
        return None
    # One rounding of the fp32 result to the output dtype: past 65504 it is inf (INF_NAN mode),
    # or clamped to ±65504 first (saturation mode).
    return _rounded(y, dtype, saturate)


def _converted(
    module: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Name -> ``convert``-ed copy of every floating parameter and buffer of ``module`` (what
    :func:`torch.func.functional_call` runs it with)."""
    named = itertools.chain(module.named_parameters(), module.named_buffers())
    return {n: convert(t.detach()) for n, t in named if t.is_floating_point()}


def _native(
    module: nn.Module, args: tuple, dtype: torch.dtype, saturate: bool
) -> torch.Tensor | None:
    """Run a copy of ``module`` in ``dtype`` on the ``dtype``-cast inputs (None if unsupported):
    the device's own fp16/bf16 kernels."""
    from opsnn_quant.core.tensors import first_tensor
    from opsnn_quant.probe.hooks import rerunning

    def cast(a: object) -> object:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            t = a.detach()
            if saturate:
                t = t.clamp(-FP16_MAX, FP16_MAX)
            return t.to(dtype)
        return a

    tensors = _converted(module, lambda t: t.to(dtype))
    try:
        with torch.no_grad(), rerunning():
            out = torch.func.functional_call(module, tensors, tuple(cast(a) for a in args))
    except RuntimeError:  # an op without a kernel in this dtype
        return None
    y = first_tensor(out)
    if y is None:
        return None
    y = y.to(torch.float32)
    if saturate:
        y = y.clamp(-FP16_MAX, FP16_MAX)
    return y
