"""W8A8 local-error probe: each module's output error when only its own input/weights are int8.

Pass 1 collects, per Linear/Conv2d, the activation statistics every candidate scheme needs
(min/max, an MSE-clip histogram, per-channel maxima and a row reservoir for SmoothQuant). Between
passes the SmoothQuant alpha is searched once per module. The frozen candidates (the real Ascend
arithmetic of :mod:`opsnn_quant.quant.modules`) then run on calls' inputs and accumulate signal,
noise and cross energies, nothing beyond the current batch kept: on the attribution's replayed
calls (:meth:`LocalProbe.replayed_output`), on calls pass 1 kept (:meth:`LocalProbe.measure_kept`)
or in pass 2 over the forward loop (:meth:`LocalProbe.measure`).

Memory: int8 weights are cached per *weight variant* (plain, smoothed for static, smoothed for
dynamic), a quarter of the fp32 weight each; no fp32 weight copies are kept.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from opsnn_quant.core.memory import TRIM, trim_heap
from opsnn_quant.core.timesteps import at_step, current_step, group_of
from opsnn_quant.probe.config import DEFAULT_ERROR_ROWS
from opsnn_quant.probe.crossfit import SplitMoments, crossfit_pixels, crossfit_rows
from opsnn_quant.probe.energy import SchemeEnergy
from opsnn_quant.probe.pending import PENDING_ROWS, PendingBatch
from opsnn_quant.probe.report import SchemeError, TimestepRanges
from opsnn_quant.probe.seeding import PassOneStatistics, all_stepped, group_range, symmetric_range
from opsnn_quant.probe.steps import StepRanges
from opsnn_quant.probe.subsets import strided_rows, strided_samples
from opsnn_quant.quant.engines import get_engine
from opsnn_quant.quant.gptq import MomentStore
from opsnn_quant.quant.modules import QuantConv2d, QuantLinear, QuantModule, im2col_conv
from opsnn_quant.quant.observers import MinMaxObserver, MSEObserver, observed_span
from opsnn_quant.quant.schemes import SCHEMES, scheme_spec, schemes_for
from opsnn_quant.quant.smoothquant import ChannelStats, search_alphas
from opsnn_quant.quant.spec import DEFAULT_ALPHA_GRID, QuantSpec
from opsnn_quant.types import Precision

# Candidates per module type, from the one scheme table (quant/schemes.py).
LINEAR_SCHEMES = schemes_for("Linear")
CONV_SCHEMES = schemes_for("Conv2d")
# The candidates run with QuantSpec's default output dtype (what fp16 deployments use).
CANDIDATE_OUTPUT_DTYPE: str = QuantSpec.output_dtype


MIN_ERROR_CALLS = 3
# One mode's SmoothQuant search outcome: (alpha, factor, error); (None, None, error) unsmoothed.
Searched = tuple[float | None, torch.Tensor | None, float]


def _alpha_key(scheme: str) -> str:
    """Which searched SmoothQuant alpha a scheme uses: static and dynamic are searched apart."""
    return "static" if SCHEMES[scheme].template.static_activations else "dynamic"


@dataclass
class LocalProbe:
    """Statistics and candidates of one Linear/Conv2d module."""

    name: str
    module: nn.Module
    minmax: MinMaxObserver = field(default_factory=MinMaxObserver)
    mse: MSEObserver = field(default_factory=MSEObserver)
    stats: ChannelStats | None = None
    alphas: dict[str, float | None] = field(default_factory=dict)
    smooth: dict[str, torch.Tensor | None] = field(default_factory=dict)
    energies: dict[str, SchemeEnergy] = field(default_factory=dict)
    _shadows: dict[str, QuantModule[Any]] = field(default_factory=dict)
    _variant: dict[str, str] = field(default_factory=dict)
    # the candidates' integer weights parked in files (see park): a reader per variant
    _parked: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)
    _in_files: bool = False  # whether the candidates' weights are parked now
    calls: int = 0
    max_error_calls: int = 32
    error_rows: int = DEFAULT_ERROR_ROWS  # input rows pass 2 measures per module (see error_calls)
    alpha_grid: tuple[float, ...] = DEFAULT_ALPHA_GRID  # SmoothQuant strengths searched
    only: tuple[str, ...] | None = None  # the schemes to measure (None: every one that fits)
    timestep_groups: int | None = None  # groups of steps of w8a8_timestep (None: chosen)
    # the target's engine: candidates compute its Linear, in its dtype (QuantSpec.engine)
    engine: str = "opsnn"
    engine_dtype: str | None = None
    steps: StepRanges = field(default_factory=StepRanges)
    step_bounds: tuple[int, ...] | None = None  # chosen by decide() when steps were seen
    _pass2_calls: int = 0
    _elements: int = 0  # input elements pass 1 saw (all calls, in a sampling loop or not)
    _pending: dict[tuple[Any, ...], PendingBatch] = field(default_factory=dict)
    moments: SplitMoments | None = None  # raw inputs' moments in halves (GPTQ), pass 1
    # whether pass 1 collects them (False: a pass of their own does, see probe/moments.py)
    collect_moments: bool = True
    collect_mse: bool = True  # whether a scheme measured here reads the MSE histogram
    _replay_share: float | None = None  # rows per replayed call measured (plan_replay)
    # pass 2: measure the kept small calls and drop the candidates at the module's last call
    # (when nothing after pass 2 runs them: its candidates are not all held at once)
    release_after_pass2: bool = False
    # pass 2 on an offloaded model (--max-memory): candidates are built while the module's
    # block is loaded (in its forward hook; the pass opens it for the last batch of small
    # calls) and dropped after each call, none kept for later calls (the int8 weights of
    # every block would add up); the same calls batched the same way: the same sums
    transient: bool = False

    def __post_init__(self) -> None:
        if any(SCHEMES[s].template.needs_moments for s in self.schemes):
            # the inputs' Hessian and mean of the GPTQ / bias-corrected candidates
            self.moments = SplitMoments(self.in_k)
        # what no scheme measured here reads is not collected (pass 1 of a run that decides
        # first gathers the naive baselines' statistics only: min/max, no histogram, no
        # per-channel maxima; the estimators, if they run, re-run pass 1 with every scheme)
        self.collect_mse = self.only is None or any(
            SCHEMES[s].template.observer == "mse" for s in self.only
        )
        smoothed = self.only is None or any(SCHEMES[s].smoothquant for s in self.only)
        if isinstance(self.module, nn.Linear) and smoothed:
            self.stats = ChannelStats(self.module.in_features)
            # per-step scales on smoothed inputs need each step's per-channel maxima
            self.steps.per_channel = self.only is None or any(
                SCHEMES[s].per_step and SCHEMES[s].smoothquant for s in self.only
            )

    @property
    def schemes(self) -> tuple[str, ...]:
        """Candidate scheme names for this module (its type and input channels)."""
        if isinstance(self.module, nn.Linear):
            fitting = schemes_for("Linear", self.module.in_features)
        elif im2col_conv(self.module):
            fitting = schemes_for("Conv2d", self.in_k)
        else:
            fitting = tuple(s for s in CONV_SCHEMES if not SCHEMES[s].template.needs_moments)
        if not all_stepped(self.steps, self._elements):
            # not a sampling loop (or calls outside it): no groups of steps to keep scales per
            fitting = tuple(s for s in fitting if not SCHEMES[s].per_step)
        return fitting if self.only is None else tuple(s for s in fitting if s in self.only)

    @property
    def in_k(self) -> int:
        """Inputs per output of the module's matmul: a Linear's in_features, a conv's
        C * KH * KW (its im2col rows)."""
        return int(self.weight2d().shape[1])

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """The (M, K) rows the weight multiplies: a Linear's input rows, a conv's im2col."""
        if isinstance(self.module, nn.Conv2d):
            c = self.module
            cols = F.unfold(x, c.kernel_size, c.dilation, c.padding, c.stride)  # type: ignore[arg-type]
            return cols.transpose(1, 2).reshape(-1, self.in_k)
        return x.reshape(-1, self.in_k)

    @torch.no_grad()
    def collect(self, x: torch.Tensor) -> None:
        """Pass 1: one call's input (counted only, when no scheme is measured on it)."""
        self.calls += 1
        self._elements += x.numel()
        if self.only == ():
            return  # the target runs no int8 scheme on this module type: nothing to calibrate
        step = current_step()
        if not x.numel():
            if step is not None:
                self.steps.collect(step, x)
            return
        # One min/max and one per-channel reduction, shared by every statistic of this input.
        xf = x.detach().to(torch.float32)
        span = observed_span(xf)
        self.minmax.collect(xf, span)
        if self.collect_mse:
            self.mse.collect(xf, span)
        channels = None
        if self.stats is not None:
            channels = xf.reshape(-1, self.stats.channels).abs().amax(dim=0)
            self.stats.collect(xf, channels)
        if self.moments is not None and self.collect_moments:
            self.moments.collect(self.rows(xf))
        if step is not None:
            self.steps.collect(step, x, max(-span[0], span[1]), channels)

    @torch.no_grad()
    def collect_moments_only(self, x: torch.Tensor) -> None:
        """One call's input, for the moments alone (a pass of their own: the rows and their
        conversion exactly as :meth:`collect` gives them)."""
        if self.moments is None or self.only == () or not x.numel():
            return
        self.moments.collect(self.rows(x.detach().to(torch.float32)))

    @torch.no_grad()
    def merge(self, other: LocalProbe) -> None:
        """Add the pass-1 statistics ``other`` (of the same module, on the data that follows
        this one's: another rank's share) collected; every one merges exactly (see
        :mod:`opsnn_quant.probe.merge`)."""
        self.calls += other.calls
        self._elements += other._elements
        self.minmax.merge(other.minmax)
        self.mse.merge(other.mse)
        if self.stats is not None and other.stats is not None:
            self.stats.merge(other.stats)
        if self.moments is not None and other.moments is not None:
            self.moments.merge(other.moments)
        self.steps.merge(other.steps)

    def portable(self) -> LocalProbe:
        """These statistics without the module (to send to another process)."""
        out = copy.copy(self)
        out.module = nn.Identity()
        return out

    def decide(self, searched: Sequence[Searched] | None = None) -> None:
        """Between passes: the groups of steps (per-step ranges seen) and SmoothQuant alphas by
        searched output error (``searched``: the (static, dynamic) outcome of a search made for
        a group this module belongs to, see :func:`decide_shared`)."""
        if len(self.steps.absmax) >= 2:
            self.step_bounds = self.steps.choose(self.timestep_groups)
        if self.stats is None or self.stats.seen == 0:
            return
        if searched is None:
            searched = search_alphas(self.stats, self.weight2d(), (False, True), self.alpha_grid)
        for key, (alpha, s, _) in zip(("static", "dynamic"), searched, strict=True):
            self.alphas[key], self.smooth[key] = alpha, s
        self.stats.rows = None  # the reservoir is no longer needed

    def weight2d(self) -> torch.Tensor:
        """The float weight as (N, K) rows (a view)."""
        weight: torch.Tensor = getattr(self.module, "weight")  # noqa: B009
        return weight.detach().reshape(weight.shape[0], -1)

    def shadow(self, scheme: str, half: int | None = None) -> QuantModule[Any]:
        """The frozen candidate for ``scheme`` (built once, int8 weights only); a candidate
        fitted to the inputs' moments (GPTQ) is fitted for measuring rows of ``half``
        (:mod:`opsnn_quant.probe.crossfit`; None: on all rows)."""
        slot = scheme if half is None else f"{scheme}@{half}"
        if self._in_files:
            self._unpark()
        if slot in self._shadows:
            return self._shadows[slot]
        key = _alpha_key(scheme)
        alpha = self.alphas.get(key) if SCHEMES[scheme].smoothquant else None
        smooth = self.smooth.get(key) if SCHEMES[scheme].smoothquant else None
        spec = SCHEMES[scheme].spec(alpha if smooth is not None else None, self.step_bounds)
        if smooth is None and spec.smoothquant:
            spec = scheme_spec(scheme.replace("_smoothquant", ""))
        spec = self._for_engine(spec)
        q: QuantModule[Any]
        if isinstance(self.module, nn.Linear):
            q = QuantLinear.from_float(self.module, spec, self.name)
        else:
            assert isinstance(self.module, nn.Conv2d)
            q = QuantConv2d.from_float(self.module, spec, self.name)
        iq = q.input_quantizer
        iq.calls = self.calls
        if spec.needs_moments:
            assert self.moments is not None
            iq.moments = self.moments.merged() if half is None else self.moments.fitted_for(half)
        if smooth is not None:
            iq.smooth = smooth
            iq.chosen_alpha = alpha
        if spec.timestep_bounds is not None:
            # Symmetric minmax per group of steps follows exactly from the per-step maxima.
            groups = range(len(spec.timestep_bounds))
            iq.observers = [
                group_range(self.steps, spec.timestep_bounds, i, smooth) for i in groups
            ]
        elif spec.static_activations:
            if smooth is not None:
                # min/max of x / s_j follows exactly from the per-channel maxima (minmax observer).
                assert self.stats is not None
                iq.observer = symmetric_range(float((self.stats.absmax / smooth).max()))
            else:
                iq.observer = self.mse if spec.observer == "mse" else self.minmax
        # Candidates with the same (un)smoothed weight share one int8 tensor.
        variant = "plain" if smooth is None else key
        if spec.precision == Precision.W4A16:
            variant = "int4"  # packed int4 words and per-group scales: a weight of its own
        if spec.engine_def.weight_scales == "model":  # dynamic / weight-only scales in its dtype
            variant = f"{variant}-{spec.static_activations}"
        if spec.needs_moments:  # GPTQ's integers: shared by the candidates of one half only
            variant = f"gptq{'' if half is None else half}-{variant}"
        sibling = next((o for n, o in self._shadows.items() if self._variant[n] == variant), None)
        q.freeze(None if sibling is None else (sibling.weight, sibling.weight_quantizer.scale))
        q.cache_weight_float = False
        self._variant[slot] = variant
        self._shadows[slot] = q
        return q

    def _for_engine(self, spec: QuantSpec) -> QuantSpec:
        """``spec`` in the engine's arithmetic and dtype (as the policy will write it)."""
        engine = get_engine(self.engine)
        if not engine.model_dtype or not engine.runs(spec.precision):
            return spec
        changes: dict[str, Any] = {
            "engine": self.engine,
            "output_dtype": self.engine_dtype or spec.output_dtype,
        }
        return dataclasses.replace(spec, **changes)

    @torch.no_grad()
    def measure(self, args: tuple, y: torch.Tensor) -> None:
        """Pass 2: every candidate's output on this call's input against the float output.

        Only :meth:`error_calls` of the ``calls`` pass 1 counted are measured, evenly spread
        over them (e.g. every 3rd decoder step, or denoising steps 0, 4 and 8 of 10), and of a
        call bigger than its share of ``error_rows`` only an evenly strided subset of its
        samples (a UNet call's guidance pair: some unconditional, some conditional ones): the
        rows of a Linear/Conv2d are independent under every candidate (per-tensor, per-token
        and per-channel scales), so the subset's error is exactly its own.
        """
        index = self._pass2_calls
        self._pass2_calls += 1
        stride = max(1, -(-self.calls // self.error_calls()))
        if not index % stride:
            rows = max(1, math.ceil(self.error_rows / self.error_calls()))
            args, y = strided_samples(args, y, rows, self._channels())
            if not self._pend(args, y):
                self._measure_now(args, y)
            if self.transient:
                self.release()  # built again, from the loaded block, where next measured
        if self.release_after_pass2 and self._pass2_calls == self.calls:
            # the module's last call (pass 1 counted them): what :meth:`flush` would measure
            # at the end of the pass, measured now, in the same order; then its candidates
            # (int8 weights, a quarter of the float weight per variant) go
            self.flush()
            self.release()

    @torch.no_grad()
    def measure_kept(self, args: tuple, y: torch.Tensor, calls: int) -> None:
        """Like :meth:`measure`, on one of ``calls`` calls kept in pass 1 (a module outside
        every recorded root): each measured on an evenly strided subset of its samples, about
        ``error_rows / calls`` rows."""
        rows = max(1, math.ceil(self.error_rows / max(calls, 1)))
        args, y = strided_samples(args, y, rows, self._channels())
        if not self._pend(args, y):
            self._measure_now(args, y)

    def _measure_now(self, args: tuple, y: torch.Tensor) -> None:
        for scheme in self.schemes:
            self._add_error(scheme, y, self.candidate_output(scheme, args))

    def _add_error(self, scheme: str, y: torch.Tensor, yq: torch.Tensor) -> None:
        channel_dim = 1 if isinstance(self.module, nn.Conv2d) else -1
        self.energies.setdefault(scheme, SchemeEnergy()).add(y, yq, channel_dim)
        TRIM.add(4 * yq.numel() * yq.element_size())  # output + the reference's copies

    def plan_replay(self, parts: int) -> None:
        """Before the attribution's replay measures this module's local errors: it will see
        ``parts`` calls (recorded calls, or their chunks), of which about ``error_rows`` rows
        in all are measured (see :meth:`replayed_output`)."""
        self._replay_share = self.error_rows / max(parts, 1)

    @torch.no_grad()
    def replayed_output(
        self, scheme: str, args: tuple, y: torch.Tensor, calls: int = 1
    ) -> torch.Tensor:
        """:meth:`candidate_output` on ``calls`` replayed calls (small ones run as one batch),
        with its local error against the float output ``y`` added on an evenly strided subset
        of the rows (tokens; output pixels of a conv) of at most about ``calls * error_rows /
        parts`` (:meth:`plan_replay`): the error sums cost a sweep of their own, the estimator
        needs the whole output, the SQNR does not."""
        yq = self.candidate_output(scheme, args)
        if self._replay_share is None:
            self._add_error(scheme, y, yq)
            return yq
        dim, rows = 1 if isinstance(self.module, nn.Conv2d) else -1, calls * self._replay_share
        self._add_error(scheme, strided_rows(y, dim, rows), strided_rows(yq, dim, rows))
        return yq

    def _pend(self, args: tuple, y: torch.Tensor) -> bool:
        """Keep a small call (a decoder's per-token step, a DiT's few tokens, a low-resolution
        feature map) to measure with others at once: one candidate run of 512 rows costs what
        one of 4 rows costs in per-call overhead. Exact: the rows of a Linear (the samples of a
        Conv2d) are independent under every candidate, and calls join only calls of the same
        group of denoising steps (per-step candidates read the step; the batch runs at the
        first one's) and, for a Conv2d, of the same feature-map shape; a call of another group
        or shape measures the open batch first."""
        x = args[0] if len(args) == 1 else None
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or y.shape[0] != x.shape[0]:
            return False
        if x.numel() // max(self._channels(), 1) >= PENDING_ROWS:
            return False
        step = current_step()
        group = None if step is None else self._step_group(step)
        if isinstance(self.module, nn.Linear):
            k = self.module.in_features
            x, y, key = x.reshape(-1, k), y.reshape(-1, y.shape[-1]), (group,)
        else:
            key = (group, *x.shape[1:], *y.shape[1:])
        for other in [k for k in self._pending if k != key]:
            # One open batch per module: a loop that moves on to the next group of steps (or a
            # new feature-map size) measures what it kept, so the probe holds one batch per
            # module, not one per group (a UNet's low-resolution levels: hundreds of MB).
            self._flush_one(other)
        batch = self._pending.setdefault(key, PendingBatch(step))
        batch.add(x, y)
        if batch.full(self._channels()):
            self._flush_one(key)
        return True

    @property
    def pending_batches(self) -> int:
        """How many batches of small calls wait for :meth:`flush`."""
        return len(self._pending)

    def _step_group(self, step: int) -> int:
        return 0 if self.step_bounds is None else group_of(step, self.step_bounds)

    def _flush_one(self, key: tuple[Any, ...]) -> None:
        batch = self._pending.pop(key)
        x, y = batch.tensors()
        with at_step(batch.step):
            self._measure_now((x,), y)

    def flush(self) -> None:
        """Measure the small calls kept by :meth:`measure` (end of pass 2), in the order their
        batches began."""
        for key in list(self._pending):
            self._flush_one(key)

    def error_calls(self) -> int:
        """How many calls pass 2 measures: enough for ``error_rows`` input rows (tokens, or
        output pixels of a conv), at least :data:`MIN_ERROR_CALLS` (spread over the loop) and
        at most ``max_error_calls``. A big call (a UNet conv on 8 latents of 32x32: 8192 rows)
        estimates its SQNR to a few hundredths of a dB; a decoder's per-token call (4 rows)
        needs many; the cost of the candidates stays a few calls' worth, not the loop's."""
        rows = self._elements / max(self._channels() * self.calls, 1)
        wanted = max(MIN_ERROR_CALLS, math.ceil(self.error_rows / max(rows, 1.0)))
        return min(self.max_error_calls, wanted)

    def _channels(self) -> int:
        if isinstance(self.module, nn.Linear):
            return self.module.in_features
        return int(getattr(self.module, "in_channels", 1))

    def pass_one(self) -> PassOneStatistics:
        """Pass 1's statistics of this module, for ``quantize()`` (no reference to it)."""
        return PassOneStatistics(
            calls=self.calls,
            elements=self._elements,
            minmax=self.minmax,
            mse=self.mse,
            channel_absmax=None if self.stats is None else self.stats.absmax,
            channel_seen=0 if self.stats is None else self.stats.seen,
            steps=self.steps,
            moments=None if self.moments is None else self.moments.merged(),
        )

    def timestep_ranges(self) -> TimestepRanges | None:
        """The per-step ranges for the report (None when no sampling loop set the step)."""
        steps = self.steps.steps
        if len(steps) < 2 or self.step_bounds is None:
            return None
        a = [self.steps.absmax[t] for t in steps]
        lo = min(a)
        return TimestepRanges(
            steps=steps,
            absmax=a,
            max_min_ratio=max(a) / lo if lo > 0 else None,
            single_scale_loss_db=round(self.steps.gain_db(self.steps.per_step_bounds()), 4),
            bounds=list(self.step_bounds),
            groups_gain_db=round(self.steps.gain_db(self.step_bounds), 4),
        )

    @torch.no_grad()
    def candidate_output(self, scheme: str, args: tuple) -> torch.Tensor:
        """The module's output under ``scheme`` on one call's inputs, as deployed.

        The int8-activation schemes quantize the input and give :data:`CANDIDATE_OUTPUT_DTYPE`
        out of the int8 matmul; a weight-only scheme has the float activations of the
        deployment instead (fp16 in and out), so it is run on the inputs rounded to that dtype.
        The output comes back in the float output's dtype.
        """
        if self.moments is not None and SCHEMES[scheme].template.needs_moments:
            # out of sample: each row through the candidate fitted on the other half's rows
            x = args[0]
            if isinstance(self.module, nn.Conv2d):
                rows = self.rows(x.detach().to(torch.float32))
                return crossfit_pixels(rows, lambda half: self.shadow(scheme, half)(x))
            return crossfit_rows(x, lambda half, rows: self.shadow(scheme, half)(rows))
        shadow = self.shadow(scheme)
        if not shadow.spec.weight_only:
            return shadow(*args)
        dtype = getattr(torch, self.engine_dtype or CANDIDATE_OUTPUT_DTYPE)
        out_dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), torch.float32)
        cast = (
            a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        )
        return shadow(*cast).to(out_dtype)

    def noise_power(self, scheme: str) -> torch.Tensor | None:
        """Measured mean noise power per output channel under ``scheme`` (pass 2)."""
        energy = self.energies.get(scheme)
        return None if energy is None else energy.channel_power()

    def results(self) -> dict[str, SchemeError]:
        """Per scheme SQNR/cosine (with the alpha SmoothQuant chose, the groups of steps)."""
        out = {}
        for scheme, energy in self.energies.items():
            alpha = None
            if SCHEMES[scheme].smoothquant:
                alpha = self.alphas.get(_alpha_key(scheme))
            err = energy.result(alpha, self.engine_dtype or CANDIDATE_OUTPUT_DTYPE)
            if SCHEMES[scheme].per_step and self.step_bounds is not None:
                err = err.model_copy(update={"timestep_bounds": list(self.step_bounds)})
            out[scheme] = err
        return out

    def best_scheme(self) -> str:
        """The scheme with the highest local SQNR (ties: the simpler, listed first)."""
        res = self.results()

        def key(s: str) -> float:
            if s not in res or res[s].infeasible:
                return -math.inf
            db = res[s].sqnr_db
            # rounded: a last-bit difference between runs must not change the choice
            return math.inf if db is None else round(db, 4)

        return max(self.schemes, key=key)

    def feasible_schemes(self) -> tuple[str, ...]:
        """The measured schemes whose output stayed finite (empty when none did)."""
        res = self.results()
        return tuple(s for s in self.schemes if s in res and not res[s].infeasible)

    def release(self) -> None:
        """Drop the cached candidates (and give the heap's free pages back)."""
        self._parked.clear()
        self._in_files = False
        if self._shadows:
            self._shadows.clear()
            self._variant.clear()
            trim_heap()

    def candidate_bytes(self) -> int:
        """The built candidates' integer weights in memory (0 when parked), each variant once."""
        if self._in_files:
            return 0
        seen: dict[str, int] = {}
        for slot, q in self._shadows.items():
            seen[self._variant[slot]] = q.weight.numel() * q.weight.element_size()
        return sum(seen.values())

    @torch.no_grad()
    def park(self, store: MomentStore) -> None:
        """Move the built candidates' integer weights (the only term of their size) to files of
        ``store``, written once per variant (they never change once built), until the next
        :meth:`shadow` reads them back: the same bits, still shared by the candidates of one
        variant. What keeps a root's attribution to about one module's candidates in memory
        (GPTQ's per-half integers included: 7.5 bytes per weight for the eager target's
        schemes) instead of all of them."""
        if self._in_files or not self._shadows:
            return
        for slot, q in self._shadows.items():
            variant = self._variant[slot]
            if variant not in self._parked:
                self._parked[variant] = store.write(q.weight)
        for q in self._shadows.values():
            q.weight = torch.empty(0, dtype=q.weight.dtype)
        self._in_files = True

    def _unpark(self) -> None:
        """The parked weights back into the candidates (one tensor per variant, shared)."""
        loaded = {v: read() for v, read in self._parked.items()}
        for slot, q in self._shadows.items():
            q.weight = loaded[self._variant[slot]]
        self._in_files = False


def decide_shared(members: Sequence[LocalProbe]) -> bool:
    """:meth:`LocalProbe.decide` for Linears fed by one producer, with one SmoothQuant factor:
    the per-channel input maxima (one input: the same for all), the maxima of the stacked
    weights' columns, alpha searched once by the output error of all of them together (a
    stacked weight's output rows are each member's). Returns False (nothing decided) when the
    members did not see the same inputs: then each decides on its own."""
    lead = members[0].stats
    if lead is None or lead.seen == 0:
        return False
    for lp in members[1:]:
        if (
            lp.stats is None
            or lp.stats.seen != lead.seen
            or not torch.equal(lp.stats.absmax, lead.absmax)
        ):
            return False
    weights = torch.cat([lp.weight2d().to(torch.float32) for lp in members])
    searched = search_alphas(lead, weights, (False, True), members[0].alpha_grid)
    for lp in members:
        lp.decide(searched)
    return True
