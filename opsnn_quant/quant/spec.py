"""``QuantSpec``: how one module is quantized (scheme, observer, SmoothQuant)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from opsnn_quant.core.timesteps import check_bounds
from opsnn_quant.errors import ConfigError
from opsnn_quant.quant.engines import Engine, get_engine
from opsnn_quant.types import Precision

ObserverName = Literal["minmax", "percentile", "mse", "kl"]
OBSERVERS: tuple[str, ...] = ("minmax", "percentile", "mse", "kl")
OUTPUT_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
DEFAULT_ALPHA_GRID: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
DEFAULT_GROUP_SIZE = 128
ATTENTION_TYPE = "SDPA"
"""The module type of an attention module whose scaled-dot-product attention may run in int8
(:mod:`opsnn_quant.quant.attention`) in module inventories, probe reports and targets' int8
maps, whatever its class (diffusers ``Attention``, transformers ``WhisperAttention``...): not a
class name, so a report made for a target without int8 attention keeps its classes."""
# Weight-only precisions: activations stay float.
WEIGHT_ONLY = frozenset({Precision.W8A16, Precision.W4A16})


@dataclass(frozen=True)
class QuantSpec:
    """The quantization of one Linear/Conv2d module.

    Weights are always symmetric int8 per output channel (what QuantBatchMatmulV3 and ATC take).

    Attributes:
        precision: ``w8a8`` (static per-tensor activations), ``w8a8_dynamic`` (per token) or
            ``w8a16`` (weight only).
        activation_symmetric: static activations without offset (True) or with an int8 offset.
        observer: how the static activation range is chosen: ``minmax``, ``percentile``,
            ``mse`` (clip search on a histogram, in the spirit of AMCT's IFMR) or ``kl``.
        percentile: the percentile for ``observer="percentile"``.
        smoothquant_alpha: SmoothQuant migration strength; ``None`` disables it, ``"auto"``
            searches :data:`DEFAULT_ALPHA_GRID` (and "off") by the layer's output error.
        output_dtype: dtype of the quantized matmul's output on the device (``float16`` as in
            fp16 deployments; ``bfloat16`` on 910B). The CPU reference casts it back to the
            input's dtype afterwards.
        group_size: ``w4a16`` only: int4 weight scales per group of this many input channels
            (torch_npu takes a multiple of 32 below K); None elsewhere (default 128 for w4a16).
        timestep_bounds: ``w8a8`` only: static activation scales per group of denoising steps,
            given by each group's first step (``(0, 4, 8)``: steps 0-3, 4-7, 8 on); the step
            comes from :mod:`opsnn_quant.core.timesteps` (set by the diffusion sampling loops).
        engine: whose arithmetic the module computes once frozen, an entry of the engine table
            (:mod:`opsnn_quant.quant.engines`, :attr:`engine_def`): ``opsnn`` (torch_npu's
            quant ops as this package calls them: fp32 activations on the reference, SmoothQuant
            in the quantize multiplier), ``mindie-sd`` or ``vllm-ascend`` (that engine's Linear,
            activations and scales in ``output_dtype``: :mod:`opsnn_quant.ascend.engines`).
        weight_rounding: how the int8 weight is rounded to its per-channel scales: ``nearest``,
            or ``gptq`` (error-compensating, from the calibration inputs' Hessian:
            :mod:`opsnn_quant.quant.gptq`); the weight's form and scales are the same either way.
            Linear only, int8 weights (not ``w4a16``).
        k_mean: ``a8`` only: the key's mean over the keys is subtracted before it is quantized
            (exact for softmax; a narrower int8 range, :mod:`opsnn_quant.quant.attention`).
        per_head: ``a8`` only: query/key/value scales per key/value head (the fused op takes
            one scale per call, so the op is called once per key/value head), not per tensor.
        bias_correction: ``w8a8`` only: the quantized weight's expected output shift on the
            calibration inputs is removed from the int32 ``quant_bias``.
            A ``vllm-ascend`` module with SmoothQuant takes ``x / s`` (the output of the norm
            its factor is folded into) into the engine's Linear, which applies none itself.
    """

    precision: Precision = Precision.W8A8
    activation_symmetric: bool = True
    observer: ObserverName = "minmax"
    percentile: float = 99.99
    smoothquant_alpha: float | Literal["auto"] | None = None
    output_dtype: Literal["float16", "bfloat16"] = "float16"
    group_size: int | None = None
    timestep_bounds: tuple[int, ...] | None = None
    engine: str = "opsnn"
    weight_rounding: Literal["nearest", "gptq"] = "nearest"
    bias_correction: bool = False
    k_mean: bool = False
    per_head: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision(self.precision))
        if self.precision.is_float:
            raise ConfigError(f"QuantSpec needs an int8 precision, got {self.precision.value}")
        if self.observer not in OBSERVERS:
            raise ConfigError(f"unknown observer {self.observer!r}; choose one of {OBSERVERS}")
        if not 50.0 < self.percentile <= 100.0:
            raise ConfigError(f"percentile must be in (50, 100], got {self.percentile}")
        alpha = self.smoothquant_alpha
        if (
            alpha is not None
            and alpha != "auto"
            and not (isinstance(alpha, int | float) and 0.0 <= float(alpha) <= 1.0)
        ):
            raise ConfigError(f"smoothquant_alpha must be in [0, 1], 'auto' or null, got {alpha!r}")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ConfigError(f"output_dtype must be one of {OUTPUT_DTYPES}")
        if self.precision in WEIGHT_ONLY and alpha is not None:
            raise ConfigError(
                f"SmoothQuant needs quantized activations; {self.precision.value} cannot use it"
            )
        if self.precision == Precision.W4A16:
            if self.group_size is None:
                object.__setattr__(self, "group_size", DEFAULT_GROUP_SIZE)
            if not (
                isinstance(self.group_size, int)
                and self.group_size > 0
                and self.group_size % 32 == 0
            ):
                raise ConfigError(
                    f"w4a16 group_size must be a positive multiple of 32, got {self.group_size!r}"
                )
        elif self.group_size is not None:
            raise ConfigError(f"group_size is for w4a16 only, not {self.precision.value}")
        self._check_engine()
        self._check_weight_rounding()
        self._check_attention()
        if self.timestep_bounds is not None:
            if self.precision not in (Precision.W8A8, Precision.A8):
                raise ConfigError(
                    f"timestep_bounds are static activation scales: w8a8 only, not {self.precision.value}"
                )
            try:
                object.__setattr__(self, "timestep_bounds", check_bounds(self.timestep_bounds))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def _check_weight_rounding(self) -> None:
        if self.weight_rounding not in ("nearest", "gptq"):
            raise ConfigError(
                f"weight_rounding must be 'nearest' or 'gptq', got {self.weight_rounding!r}"
            )
        if self.weight_rounding == "gptq" and self.precision == Precision.W4A16:
            raise ConfigError("gptq rounds int8 weights; w4a16 keeps round to nearest")
        if self.bias_correction and self.precision != Precision.W8A8:
            raise ConfigError(
                "bias_correction folds into the int32 quant_bias of static w8a8, "
                f"not {self.precision.value}"
            )

    def _check_attention(self) -> None:
        if self.k_mean and self.precision != Precision.A8:
            raise ConfigError(
                f"k_mean smooths an attention's key: a8 only, not {self.precision.value}"
            )
        if self.per_head and self.precision != Precision.A8:
            raise ConfigError(
                f"per_head scales an attention's heads: a8 only, not {self.precision.value}"
            )
        if self.precision != Precision.A8:
            return
        # an attention has no weights and one arithmetic: the fused op's static per-tensor scales
        if self.smoothquant_alpha is not None or self.observer != "minmax":
            raise ConfigError("a8 (int8 attention) takes min-max scales, without SmoothQuant")
        if not self.activation_symmetric:
            raise ConfigError("a8 (int8 attention) is symmetric: the fused op takes no offsets")

    @property
    def needs_moments(self) -> bool:
        """True when calibration collects the inputs' moments (GPTQ, bias correction)."""
        return self.weight_rounding == "gptq" or self.bias_correction

    def _check_engine(self) -> None:
        engine = get_engine(self.engine)  # unknown: an error naming the known ones
        if self.precision.is_attention:
            if not engine.int8_attention:
                raise ConfigError(f"{self.engine} has no int8 attention: {engine.attention_note}")
        elif not engine.runs(self.precision):
            raise ConfigError(f"{self.engine} has no {self.precision.value} Linear")
        if self.timestep_bounds is not None and not engine.step_scales:
            raise ConfigError(f"{self.engine} keeps one static scale (no per-step scales)")
        if (
            self.timestep_bounds is not None
            and self.smoothquant_alpha is not None
            and not engine.step_smoothing
        ):
            raise ConfigError(
                f"{self.engine}'s per-step Linear (W8A8_TIMESTEP) takes no SmoothQuant"
            )

    @property
    def engine_def(self) -> Engine:
        """The entry of the engine table (:mod:`opsnn_quant.quant.engines`) this spec's
        :attr:`engine` names: what its arithmetic does differently."""
        return get_engine(self.engine)

    @property
    def static_activations(self) -> bool:
        """True when activation scales are calibrated (``w8a8``, ``a8``)."""
        return self.precision in (Precision.W8A8, Precision.A8)

    @property
    def weight_only(self) -> bool:
        """True when only the weights are quantized (``w8a16``, ``w4a16``)."""
        return self.precision in WEIGHT_ONLY

    @property
    def smoothquant(self) -> bool:
        """True when SmoothQuant is on (a fixed alpha or a search)."""
        return self.smoothquant_alpha is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (precision as its string value; ``group_size`` only where set)."""
        d = asdict(self)
        d["precision"] = self.precision.value
        for optional in ("group_size", "timestep_bounds"):
            if d[optional] is None:
                del d[optional]
        # defaults of later fields are left out: earlier checkpoints keep their bytes
        for key, default in (("engine", "opsnn"), ("weight_rounding", "nearest"),
                             ("bias_correction", False), ("k_mean", False),
                             ("per_head", False)):  # fmt: skip
            if d[key] == default:
                del d[key]
        if "timestep_bounds" in d:
            d["timestep_bounds"] = list(d["timestep_bounds"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantSpec:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown quant spec field(s): {', '.join(sorted(unknown))}")
        if d.get("timestep_bounds") is not None:
            d = {**d, "timestep_bounds": tuple(d["timestep_bounds"])}
        return cls(**d)

    @classmethod
    def coerce(cls, value: QuantSpec | Precision | str) -> QuantSpec:
        """A spec from a spec, a Precision or its string name (defaults for the rest)."""
        if isinstance(value, QuantSpec):
            return value
        try:
            return cls(precision=Precision(value))
        except ValueError as exc:
            names = ", ".join(p.value for p in Precision)
            raise ConfigError(f"unknown precision {value!r}; choose one of {names}") from exc
