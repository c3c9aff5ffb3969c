"""``SensitivityReport``: what the probes measured, per module and per modality (``probe.json``).

A typed, versioned pydantic model with a JSON round trip. The policy search reads it; the
evaluation report draws its per-module chart from it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opsnn_quant.io import atomic_write_text, load_json_model
from opsnn_quant.types import Modality

SCHEMA_VERSION = 1
FP16_MAX = 65504.0
BF16_MAX = float.fromhex("0x1.fep127")  # 3.39e38, the largest finite bfloat16


def _finite_or_none(v: float | None) -> float | None:
    # JSON has no inf/nan: store them as None plus flags elsewhere.
    if v is None or math.isfinite(v):
        return v
    return None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Fp16Stats(_Frozen):
    """fp16/bf16 behaviour of one module, over all calibration calls.

    Attributes:
        input_absmax, output_absmax: fp32 maxima of |input| / |output|.
        input_p999, output_p999: 99.9th percentile of |x| (from a streaming histogram).
        headroom_in, headroom_out: ``65504 / absmax`` (< 1 overflows; small means little margin).
        sumsq_absmax: for norms, the largest intermediate sum of squares (``sum x^2`` over the
            normalised axis) — it overflows fp16 before the inputs do.
        inf_nan_count: outputs that were inf/nan when the module ran in fp16 (INF_NAN mode, 910B).
        rel_error_fp16: relative L2 error of the fp16 run vs fp32 (INF_NAN mode; None when
            inf/nan made it undefined).
        rel_error_fp16_saturate: the same with saturation to ±65504 (910A/310P mode), where an
            overflow is silent.
        rel_error_bf16: relative L2 error of a bf16 run.
        overflow: the module overflows (or comes within the configured headroom of) fp16.
        reasons: the evidence, in words.
    """

    input_absmax: float = 0.0
    output_absmax: float = 0.0
    input_p999: float = 0.0
    output_p999: float = 0.0
    headroom_in: float | None = None
    headroom_out: float | None = None
    sumsq_absmax: float | None = None
    inf_nan_count: int = 0
    rel_error_fp16: float | None = None
    rel_error_fp16_saturate: float | None = None
    rel_error_bf16: float | None = None
    overflow: bool = False
    reasons: list[str] = Field(default_factory=list)

    _fix = field_validator(
        "headroom_in", "headroom_out", "rel_error_fp16", "rel_error_fp16_saturate", "rel_error_bf16",
        mode="before",
    )(_finite_or_none)  # fmt: skip


class SchemeError(_Frozen):
    """Local error of one module's output when only its own input/weights are quantized.

    Attributes:
        sqnr_db: local SQNR; None = +inf (no error), unless ``infeasible`` is set.
        cosine: cosine similarity with the float output.
        smoothquant_alpha: the alpha SmoothQuant searched (SmoothQuant schemes).
        infeasible: why the scheme cannot run this module (its int8 matmul's output dtype
            overflowed on the calibration data); None when it can. An infeasible scheme has no
            error figure and is never chosen.
        fits_output_dtype: an output dtype of the int8 matmul that would hold the module's
            output (``bfloat16``), when the scheme is infeasible in its own.
    """

    sqnr_db: float | None  # None = +inf (no error)
    cosine: float
    smoothquant_alpha: float | None = None
    infeasible: str | None = None
    fits_output_dtype: str | None = None
    timestep_bounds: list[int] | None = None  # w8a8_timestep: the groups of steps it used

    _fix = field_validator("sqnr_db", mode="before")(_finite_or_none)


class TimestepRanges(_Frozen):
    """How a module's input range moves over the denoising steps (diffusion models).

    Attributes:
        steps: the step indices seen.
        absmax: the input absmax at each of them.
        max_min_ratio: largest / smallest per-step absmax.
        single_scale_loss_db: modelled input SQNR a single static scale loses against one scale
            per step (:mod:`opsnn_quant.probe.steps`).
        bounds: the groups of steps chosen for ``w8a8_timestep`` (each group's first step).
        groups_gain_db: modelled input SQNR those groups gain over a single scale.
    """

    steps: list[int]
    absmax: list[float]
    max_min_ratio: float | None
    single_scale_loss_db: float
    bounds: list[int]
    groups_gain_db: float

    _fix = field_validator("max_min_ratio", mode="before")(_finite_or_none)


class EndToEnd(_Frozen):
    """How much this module's quantization moves the modality's final output.

    ``contribution`` is the estimated relative noise energy it adds to the final output
    (``||dy||^2 / ||y||^2``) under ``scheme`` (the locally best one); contributions of different
    modules add up (to first order). ``schemes`` holds the same estimate for every scheme scored
    (empty when only ``scheme`` was), from the same backward pass.
    """

    scheme: str
    contribution: float
    rank: int
    exhaustive: float | None = None  # measured one-module-at-a-time, when that was run
    schemes: dict[str, float] = Field(default_factory=dict)


class ModuleSensitivity(_Frozen):
    """Everything measured about one module."""

    name: str
    type: str
    modality: Modality
    params: int = 0
    macs: int = 0  # multiply-accumulates per forward call (average over calls)
    calls: int = 0
    fp16: Fp16Stats | None = None
    w8a8: dict[str, SchemeError] = Field(default_factory=dict)
    e2e: EndToEnd | None = None
    weight_shape: list[int] | None = None  # of a Linear/Conv2d (the targets' shape limits)
    timesteps: TimestepRanges | None = None  # per-step input ranges (diffusion models)

    @property
    def quantizable(self) -> bool:
        """True for module types the engine can make int8 (Linear, Conv2d)."""
        return self.type in ("Linear", "Conv2d")


class Finding(_Frozen):
    """A seed-specific check (softmax overflow, GELU approximation) and its verdict."""

    kind: str
    where: str
    modality: Modality
    value: float | None = None
    verdict: str = ""


class ModalitySummary(_Frozen):
    """Per-modality roll-up."""

    modality: Modality
    modules: int
    quantizable: int
    overflowing: int
    median_sqnr_db: float | None
    predicted_sqnr_db_all_w8a8: float | None  # from the summed e2e contributions
    output: str = ""  # what the final output of this modality is (e.g. "UNet noise prediction")
    macs: int = 0


class SensitivityReport(_Frozen):
    """The output of :func:`opsnn_quant.probe.probe`."""

    schema_version: int = SCHEMA_VERSION
    model: str
    backend: str = "cpu-reference"
    config: dict[str, Any] = Field(default_factory=dict)
    modules: list[ModuleSensitivity]
    modalities: dict[str, ModalitySummary] = Field(default_factory=dict)
    findings: list[Finding] = Field(default_factory=list)
    # producer (a norm) -> the Linears it feeds, whose SmoothQuant candidates were measured with
    # one shared factor (the probe's ``fold_smoothing``): what an engine that folds the factor
    # into the producer can run smoothed (vLLM-Ascend)
    smoothing_groups: dict[str, list[str]] = Field(default_factory=dict)
    # Fingerprints of the model and the calibration data the probe ran on
    # (:mod:`opsnn_quant.fingerprint`): a later run reuses the report only for the same ones.
    inputs: dict[str, str] = Field(default_factory=dict)
    # Wall-clock seconds of this run and their ratios (forward-equivalents): they differ on
    # every run, so they are not written to probe.json (whose bytes depend on the inputs only)
    # but to timings.json (opsnn_quant.pipeline.timings). Read from an older probe.json that has them.
    costs: dict[str, float] = Field(default_factory=dict, exclude=True)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(
                f"probe.json schema_version {v} is not supported (expected {SCHEMA_VERSION})"
            )
        return v

    def module(self, name: str) -> ModuleSensitivity:
        """The entry of module ``name``."""
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(name)

    def inventory(self) -> dict[str, str]:
        """Module name -> class name, in model order: the inventory a policy resolves against."""
        return {m.name: m.type for m in self.modules}

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Module name -> weight shape, for the probed Linear/Conv2d (a target's shape limits)."""
        return {m.name: tuple(m.weight_shape) for m in self.modules if m.weight_shape}

    def by_modality(self, modality: Modality | str) -> list[ModuleSensitivity]:
        """Entries of one modality, in model order."""
        return [m for m in self.modules if m.modality == Modality(modality)]

    def to_json(self) -> str:
        """Deterministic JSON text (sorted keys, fixed indentation), without :attr:`costs`."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write ``probe.json`` atomically."""
        return atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> SensitivityReport:
        """Read and validate a ``probe.json``.

        Raises:
            ConfigError: missing file, bad JSON or a schema violation (the message names the field).
        """
        return load_json_model(cls, path)


def summarize_modalities(
    entries: list[ModuleSensitivity], describe_output: Callable[[Modality], str]
) -> dict[str, ModalitySummary]:
    """Per-modality summaries of the module entries (``describe_output`` names each root's
    output, e.g. an adapter's :meth:`~opsnn_quant.models.base.ModelAdapter.describe_output`)."""
    out = {}
    for modality in sorted({e.modality for e in entries}, key=lambda m: m.value):
        group = [e for e in entries if e.modality == modality]
        quant = [e for e in group if e.quantizable]
        sqnrs = []
        for e in quant:
            vals = [s.sqnr_db for s in e.w8a8.values() if s.sqnr_db is not None]
            if vals:
                sqnrs.append(max(vals))
        contrib = [e.e2e.contribution for e in quant if e.e2e is not None]
        total = sum(contrib)
        predicted = None
        if contrib:
            predicted = 10 * math.log10(1.0 / total) if total > 0 else None
        out[modality.value] = ModalitySummary(
            modality=modality,
            modules=len(group),
            quantizable=len(quant),
            overflowing=sum(1 for e in group if e.fp16 is not None and e.fp16.overflow),
            median_sqnr_db=statistics.median(sqnrs) if sqnrs else None,
            predicted_sqnr_db_all_w8a8=predicted,
            output=describe_output(modality),
            macs=sum(e.macs for e in quant),
        )
    return out
