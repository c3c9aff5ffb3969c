"""``ProbeConfig``: what the probe measures and how (the recipe's ``probe:`` section builds it)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from opsnn_quant.quant.spec import DEFAULT_ALPHA_GRID

DEFAULT_ERROR_ROWS = 4096  # pass 2's measured input rows per module


@dataclass(frozen=True)
class ProbeConfig:
    """What to probe and how.

    Attributes:
        min_headroom: flag a module whose |input| or |output| exceeds ``65504 / min_headroom``.
        fp16: run the fp16/bf16 overflow probe.
        bf16: also re-run modules in bf16 (the policy pins an overflowing module to bf16 only
            where this measured a small bf16 error; without it such pins are fp32).
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
        estimator_samples: replay at most this many samples of each recorded call (indices
            ``i * B // k``: both halves of a guidance pair), for every modality or per modality
            name; None / a modality left out replays every sample. The estimator's cost is per
            sample replayed: more recorded calls of fewer samples each cover more steps of a
            sampling loop at the same cost.
        e2e_schemes: ``"all"`` scores every candidate scheme of a module end to end (same
            forward/backward, more int8 reference work at gradient time) so the policy can pick
            schemes by end-to-end effect; ``"best"`` scores only the locally best scheme.
        estimator: ``"structured"`` projects each candidate's real output error (run at
            gradient time) on the output gradient: the policy's default, best at choosing
            schemes and at predicting the output SQNR. ``"diagonal"`` models each module's
            noise as white within an output channel with the power pass 2 measured: one forward
            + one backward and nothing else, every scheme free; ranks modules as well (see
            ``benchmarks/bench_probe.py``) but underestimates totals by up to ~2x.
        smoothquant_alphas: the SmoothQuant migration strengths searched per module (besides
            "off"), static and dynamic.
        timestep_groups: groups of denoising steps of the ``w8a8_timestep`` candidates; None
            chooses per module from the measured per-step ranges (up to 4).
        schemes: the candidate schemes measured (names of :data:`opsnn_quant.quant.schemes.
            SCHEMES`); None measures every one. ``calibrate`` passes those its target can run:
            the others' local errors and end-to-end scores would never be used.
        type_schemes: per module class name (``Linear``, ``Conv2d``), the schemes measured on
            its modules, within ``schemes``; a class left out gets none (its modules keep their
            MACs and fp16 ranges, and no int8 statistics are gathered for them). None: every
            scheme of ``schemes`` that fits. ``calibrate`` passes its target's
            (:meth:`~opsnn_quant.policy.targets.Target.schemes` of each type): an eager
            ``torch_npu`` target runs no int8 conv, so its convs' candidates were wasted work.
        fp16_rerun: how the fp16/bf16 re-runs run: ``auto`` emulates the Ascend Cube in fp32
            on a CPU (fp16-rounded operands, fp32 accumulation, one output rounding) and runs
            the real fp16/bf16 module on npu/cuda; ``emulate`` / ``native`` force one
            (see :func:`opsnn_quant.probe.fp16.run_as`).
        error_rows: input rows (tokens, conv output pixels) pass 2 measures per module, in
            at least 3 calls spread over the loop and at most 32 (see
            :meth:`opsnn_quant.probe.local.LocalProbe.error_calls`).
        local_errors: where the local int8 errors of the modules inside recorded roots are
            measured. ``replayed`` (with the structured estimator scoring every scheme, the
            default): from the candidate outputs the estimator computes at gradient time on the
            replayed calls, so pass 2 over the forward loop runs only for the modules no replay
            reaches. ``forward_loop``: pass 2 measures every module over the forward loop
            first (``error_rows`` rows each), as the diagonal estimator, ``e2e_schemes: best``
            and the exhaustive reference always do.
        decided: modalities decided before the estimators (``calibrate``'s decide first,
            :mod:`opsnn_quant.policy.first`), each with the schemes its modules gather pass-1
            statistics for (those its decided baseline quantizes with); no estimator runs on
            their modules (no SmoothQuant search, no local error, no attribution, no GPTQ
            moments). None: every modality is estimated.
        engine: the arithmetic the candidates compute (``QuantSpec.engine``): the target's
            engine's (``calibrate`` passes it), so that every error is the deployed one.
        engine_dtype: that engine's dtype (``QuantSpec.output_dtype``); None: the default.
        fold_smoothing: the Linears one norm feeds (and nothing else) share one SmoothQuant
            factor, alpha searched once per group on their stacked weights, as an engine that
            folds the factor into the norm needs (``Target.smoothing == "fold"``); the groups
            go into ``SensitivityReport.smoothing_groups``.
        seed: seed of reservoirs and random directions.
    """

    min_headroom: float = 2.0
    fp16: bool = True
    bf16: bool = True
    w8a8: bool = True
    attribution: bool = True
    exhaustive: bool = False
    max_root_calls: int = 8
    estimator_batch: int | Mapping[str, int] | None = None
    estimator_samples: int | Mapping[str, int] | None = None
    e2e_schemes: Literal["all", "best"] = "all"
    estimator: Literal["structured", "diagonal"] = "structured"
    smoothquant_alphas: tuple[float, ...] = DEFAULT_ALPHA_GRID
    timestep_groups: int | None = None
    schemes: tuple[str, ...] | None = None
    type_schemes: Mapping[str, tuple[str, ...]] | None = None
    decided: Mapping[str, tuple[str, ...]] | None = None
    fp16_rerun: Literal["auto", "emulate", "native"] = "auto"
    error_rows: int = DEFAULT_ERROR_ROWS
    local_errors: Literal["replayed", "forward_loop"] = "replayed"
    engine: str = "opsnn"
    engine_dtype: str | None = None
    fold_smoothing: bool = False
    seed: int = 0

    def replay_batch(self, modality: str) -> int | None:
        """Samples per chunk in which ``modality``'s recorded calls are replayed
        (``estimator_batch``, for every modality or by name; None: whole calls)."""
        value = self.estimator_batch
        return value.get(modality) if isinstance(value, Mapping) else value

    def schemes_for(self, module_type: str, modality: str) -> tuple[str, ...] | None:
        """The schemes measured on modules of class ``module_type`` in ``modality``: those of
        :meth:`schemes_of`, within the decided schemes where ``decided`` names the modality."""
        schemes = self.schemes_of(module_type)
        kept = None if self.decided is None else self.decided.get(modality)
        if kept is None:
            return schemes
        return tuple(s for s in (kept if schemes is None else schemes) if s in kept)

    def deciding(self, modalities: Collection[str], schemes: Sequence[str]) -> ProbeConfig:
        """This configuration with ``modalities`` decided, their modules gathering only
        ``schemes``' statistics (see ``decided``); itself when there are none."""
        if not modalities:
            return self
        return replace(self, decided={m: tuple(schemes) for m in sorted(modalities)})

    def estimates(self, modality: str) -> bool:
        """Whether the estimators run for ``modality`` (not one ``decided`` names)."""
        return self.decided is None or modality not in self.decided

    def schemes_of(self, module_type: str) -> tuple[str, ...] | None:
        """The schemes measured on modules of class ``module_type`` (None: every one that fits
        the module; see ``schemes`` and ``type_schemes``)."""
        if self.type_schemes is None:
            return self.schemes
        typed = tuple(self.type_schemes.get(module_type, ()))
        return typed if self.schemes is None else tuple(s for s in typed if s in self.schemes)

    @property
    def replays_local_errors(self) -> bool:
        """Whether the attribution's replay measures local errors (``local_errors``): it does
        with the structured estimator scoring every scheme, without the exhaustive reference."""
        return (
            self.w8a8
            and self.attribution
            and self.local_errors == "replayed"
            and self.estimator == "structured"
            and self.e2e_schemes == "all"
            and not self.exhaustive
        )
