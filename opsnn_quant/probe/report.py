"""``SensitivityReport``: what the probes measured, per module and per modality (``probe.json``).

A typed, versioned pydantic model with a JSON round trip. The policy search reads it; the
evaluation report draws its per-module chart from it.

A ``probe.json`` read back is validated like any user file: no NaN anywhere, counts and MACs
non-negative integers, every figure finite except the maxima of ``|x|`` over fp32 tensors
(:data:`Magnitude`), which are ``Infinity`` where a tensor held an infinity (an additive
``-inf`` attention mask): the writer writes them so (``json.dumps``) and they read back the
same. The optional figures that stand for an infinity as ``null`` (``sqnr_db``, headrooms) are
turned into ``null`` when the probe builds the report; in a file, an infinity there is refused.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from opsnn_quant.core.readers import load_json_model
from opsnn_quant.output.files import atomic_write_text
from opsnn_quant.quant.spec import ATTENTION_TYPE
from opsnn_quant.types import Modality

SCHEMA_VERSION = 1
FP16_MAX = 65504.0
BF16_MAX = float.fromhex("0x1.fep127")  # 3.39e38, the largest finite bfloat16


def _finite_or_none(v: Any, info: ValidationInfo) -> Any:
    # JSON has no inf/nan: the probe's inf/nan become None (plus flags elsewhere). A file that
    # holds one anyway is refused by the field's own type (what the writer writes is null).
    if info.mode == "python" and isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _not_nan(v: float) -> float:
    if math.isnan(v):
        raise PydanticCustomError("nan", "Input should be a number, not NaN")
    return v


# A figure that is always finite (SQNRs, cosines, dB gains).
Finite = Annotated[float, Field(allow_inf_nan=False)]
# A finite figure that cannot be negative (percentiles, headrooms, ratios, seconds).
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# A maximum of |x| (or of x^2, or a noise energy) over fp32 tensors: never NaN or negative,
# +inf where a tensor held an infinity (json.dumps writes it as ``Infinity``; it reads back).
Magnitude = Annotated[float, AfterValidator(_not_nan), Field(ge=0)]
# A value that may be infinite in either direction, but is a number.
NotNaN = Annotated[float, AfterValidator(_not_nan)]


def _no_nan_in(value: Any, where: str = "") -> None:
    """Raise ValueError at the first NaN in a JSON-like value (``config``)."""
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{where or 'value'} is NaN")
    if isinstance(value, dict):
        for k, v in value.items():
            _no_nan_in(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _no_nan_in(v, f"{where}.{i}" if where else str(i))


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

    input_absmax: Magnitude = 0.0
    output_absmax: Magnitude = 0.0
    input_p999: NonNegativeFinite = 0.0
    output_p999: NonNegativeFinite = 0.0
    headroom_in: NonNegativeFinite | None = None
    headroom_out: NonNegativeFinite | None = None
    sumsq_absmax: Magnitude | None = None
    inf_nan_count: NonNegativeInt = 0
    rel_error_fp16: NonNegativeFinite | None = None
    rel_error_fp16_saturate: NonNegativeFinite | None = None
    rel_error_bf16: NonNegativeFinite | None = None
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

    sqnr_db: Finite | None  # None = +inf (no error)
    cosine: Finite
    smoothquant_alpha: NonNegativeFinite | None = None
    infeasible: str | None = None
    fits_output_dtype: str | None = None
    # w8a8_timestep: the groups of steps it used
    timestep_bounds: list[NonNegativeInt] | None = None

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

    steps: list[NonNegativeInt]
    absmax: list[Magnitude]
    max_min_ratio: NonNegativeFinite | None
    single_scale_loss_db: Finite
    bounds: list[NonNegativeInt]
    groups_gain_db: Finite

    _fix = field_validator("max_min_ratio", mode="before")(_finite_or_none)


class EndToEnd(_Frozen):
    """How much this module's quantization moves the modality's final output.

    ``contribution`` is the estimated relative noise energy it adds to the final output
    (``||dy||^2 / ||y||^2``) under ``scheme`` (the locally best one); contributions of different
    modules add up (to first order). ``schemes`` holds the same estimate for every scheme scored
    (empty when only ``scheme`` was), from the same backward pass.
    """

    scheme: str
    contribution: Magnitude
    rank: NonNegativeInt
    exhaustive: Magnitude | None = None  # measured one-module-at-a-time, when that was run
    schemes: dict[str, Magnitude] = Field(default_factory=dict)


class ModuleSensitivity(_Frozen):
    """Everything measured about one module."""

    name: str
    type: str
    modality: Modality
    params: NonNegativeInt = 0
    macs: NonNegativeInt = 0  # multiply-accumulates per forward call (average over calls)
    calls: NonNegativeInt = 0
    fp16: Fp16Stats | None = None
    w8a8: dict[str, SchemeError] = Field(default_factory=dict)
    e2e: EndToEnd | None = None
    # of a Linear/Conv2d (the targets' shape limits)
    weight_shape: list[NonNegativeInt] | None = None
    timesteps: TimestepRanges | None = None  # per-step input ranges (diffusion models)
    # the nn.Embedding whose weight this module's is (a head tied to its token embedding): an
    # engine may load such a head from the embedding, in float (Target.tie_reason)
    tied_to: str | None = None

    @property
    def quantizable(self) -> bool:
        """True for module types the engine can make int8 (Linear, Conv2d) and for attention
        modules the probe measured for int8 attention (type ``SDPA``: precision ``a8``)."""
        return self.type in ("Linear", "Conv2d", ATTENTION_TYPE)

    @property
    def refused(self) -> str | None:
        """Why no int8 scheme can run this module, when the probe found every one infeasible
        (an attention call the fused op refuses, an output dtype overflow); None otherwise."""
        reasons = [e.infeasible for e in self.w8a8.values()]
        if not reasons or None in reasons:
            return None
        return sorted(r for r in reasons if r)[0]


class Finding(_Frozen):
    """A seed-specific check (softmax overflow, GELU approximation) and its verdict."""

    kind: str
    where: str
    modality: Modality
    value: NotNaN | None = None  # a softmax input max is +inf past a -inf mask
    verdict: str = ""


class ModalitySummary(_Frozen):
    """Per-modality roll-up."""

    modality: Modality
    modules: NonNegativeInt
    quantizable: NonNegativeInt
    overflowing: NonNegativeInt
    median_sqnr_db: Finite | None
    predicted_sqnr_db_all_w8a8: Finite | None  # from the summed e2e contributions
    output: str = ""  # what the final output of this modality is (e.g. "UNet noise prediction")
    macs: NonNegativeInt = 0
    # Over the whole of pass 1: the MACs of its Linear/Conv2d calls, and those of its matmul-like
    # calls outside them (attention's score and value products, Conv1d/Conv3d: no target runs
    # them in int8). None: not counted (a probe.json from before they were).
    pass_macs: NonNegativeInt | None = None
    other_macs: NonNegativeInt | None = None

    @property
    def linear_share(self) -> float | None:
        """The share of the modality's MACs that its Linear/Conv2d make (what an int8 share of
        its Linear/Conv2d MACs is scaled by to be one of all its MACs); None: not counted."""
        if self.other_macs is None or self.pass_macs is None:
            return None
        total = self.pass_macs + self.other_macs
        return self.pass_macs / total if total else None

    _fix = field_validator("predicted_sqnr_db_all_w8a8", mode="before")(_finite_or_none)


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
    # (:mod:`opsnn_quant.core.fingerprint`): a later run reuses the report only for the same ones.
    inputs: dict[str, str] = Field(default_factory=dict)
    # Wall-clock seconds of this run and their ratios (forward-equivalents): they differ on
    # every run, so they are not written to probe.json (whose bytes depend on the inputs only)
    # but to timings.json (opsnn_quant.pipeline.timings). Read from an older probe.json that has them.
    costs: dict[str, NonNegativeFinite] = Field(default_factory=dict, exclude=True)
    # Why the estimators (SmoothQuant search, local errors, end-to-end attribution) did not run,
    # when they did not: the decision read only pass 1 (a naive baseline, or one that met
    # budget.metric at full int8 coverage). None: the report has every estimate.
    not_estimated: str | None = None

    @field_validator("config")
    @classmethod
    def _config_has_no_nan(cls, v: dict[str, Any]) -> dict[str, Any]:
        _no_nan_in(v)
        return v

    @field_validator("modules")
    @classmethod
    def _each_module_once(cls, v: list[ModuleSensitivity]) -> list[ModuleSensitivity]:
        # a module listed twice would count its MACs twice (int8_mac_share halved)
        seen: set[str] = set()
        for m in v:
            if m.name in seen:
                raise PydanticCustomError(
                    "module_twice",
                    "{name} is listed twice; a probe report lists each module once",
                    {"name": m.name},
                )
            seen.add(m.name)
        return v

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

    def tied(self) -> dict[str, str]:
        """Module name -> the embedding its weight is tied to (see ``ModuleSensitivity``)."""
        return {m.name: m.tied_to for m in self.modules if m.tied_to is not None}

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
    entries: list[ModuleSensitivity],
    describe_output: Callable[[Modality], str],
    pass_macs: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, ModalitySummary]:
    """Per-modality summaries of the module entries (``describe_output`` names each root's
    output, e.g. an adapter's :meth:`~opsnn_quant.models.base.ModelAdapter.describe_output`;
    ``pass_macs``: modality -> the MACs of pass 1 in its Linear/Conv2d and outside them; None:
    not counted)."""
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
            pass_macs=None if pass_macs is None else pass_macs.get(modality.value, (0, 0))[0],
            other_macs=None if pass_macs is None else pass_macs.get(modality.value, (0, 0))[1],
        )
    return out
