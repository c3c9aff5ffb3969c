"""The probe's candidate schemes: one table for the probe and the policy.

A scheme name (``SensitivityReport.modules[i].w8a8`` keys) stands for a QuantSpec template, says
whether SmoothQuant runs on top of it (its alpha is searched per module, so it is not part of
the template) and which module types the probe measures it on. The probe builds its candidates
from this table, the policy turns a measured scheme back into the QuantSpec of a rule.

Order is preference on ties: plain static first (cheapest at run time, simplest to deploy),
dynamic last.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from opsnn_quant.errors import ConfigError
from opsnn_quant.quant.spec import ATTENTION_TYPE, QuantSpec
from opsnn_quant.types import Precision


@dataclass(frozen=True)
class Scheme:
    """One candidate scheme of the probe.

    Attributes:
        name: the name in probe reports, e.g. ``w8a8_smoothquant``.
        template: its QuantSpec without SmoothQuant's alpha.
        smoothquant: True when SmoothQuant runs on top of ``template``.
        module_types: class names of the float modules the probe measures it on.
        k_multiple: the input channels a module needs a multiple of (int4 packs eight per word).
    """

    name: str
    template: QuantSpec
    smoothquant: bool
    module_types: tuple[str, ...]
    k_multiple: int = 1
    per_step: bool = False  # static scales per group of denoising steps (diffusion models)
    k_max: int | None = None  # the most input channels the probe measures it on

    def fits(self, module_type: str, in_features: int) -> bool:
        """Whether the probe can measure this scheme on such a module."""
        return (
            module_type in self.module_types
            and in_features % self.k_multiple == 0
            and (self.k_max is None or in_features <= self.k_max)
        )

    def spec(
        self,
        alpha: float | Literal["auto"] | None = None,
        timestep_bounds: tuple[int, ...] | None = None,
    ) -> QuantSpec:
        """The QuantSpec for SmoothQuant strength ``alpha`` (and, for a per-step scheme, its
        groups of steps).

        ``alpha`` is ignored by a scheme without SmoothQuant; None (the search turned smoothing
        off) gives the template itself.
        """
        spec = self.template
        if self.smoothquant and alpha is not None:
            spec = dataclasses.replace(spec, smoothquant_alpha=alpha)
        if self.per_step and timestep_bounds is not None:
            spec = dataclasses.replace(spec, timestep_bounds=tuple(timestep_bounds))
        return spec

    @property
    def precision(self) -> Precision:
        """The template's precision."""
        return self.template.precision


_LINEAR_AND_CONV = ("Linear", "Conv2d")
# GPTQ's candidates need each module's K x K input Hessian through the probe's pass 1 (float32:
# 64 MiB at K = 4096); wider modules are not offered them.
GPTQ_K_MAX = 4096
_STATIC_GPTQ = QuantSpec(Precision.W8A8, weight_rounding="gptq", bias_correction=True)
_DYNAMIC_GPTQ = QuantSpec(Precision.W8A8_DYNAMIC, weight_rounding="gptq")
# SmoothQuant only on Linear: its per-column factors would not map onto a per-channel quantize
# before an ATC conv (see QuantConv2d).
SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme("w8a8", QuantSpec(Precision.W8A8, observer="minmax"), False, _LINEAR_AND_CONV),
        Scheme("w8a8_mse", QuantSpec(Precision.W8A8, observer="mse"), False, _LINEAR_AND_CONV),
        Scheme("w8a8_smoothquant", QuantSpec(Precision.W8A8), True, ("Linear",)),
        Scheme("w8a8_dynamic", QuantSpec(Precision.W8A8_DYNAMIC), False, _LINEAR_AND_CONV),
        Scheme("w8a8_dynamic_smoothquant", QuantSpec(Precision.W8A8_DYNAMIC), True, ("Linear",)),
        # GPTQ-rounded weights (same scales and layout; static ones with bias correction in
        # quant_bias), for Linear and (static, on its im2col rows: K = C * KH * KW) Conv2d;
        # after their round-to-nearest twins, which win ties.
        Scheme("w8a8_gptq", _STATIC_GPTQ, False, _LINEAR_AND_CONV, k_max=GPTQ_K_MAX),
        Scheme(
            "w8a8_smoothquant_gptq",
            _STATIC_GPTQ,
            True,
            ("Linear",),
            k_max=GPTQ_K_MAX,
        ),
        Scheme(
            "w8a8_dynamic_gptq",
            _DYNAMIC_GPTQ,
            False,
            ("Linear",),
            k_max=GPTQ_K_MAX,
        ),
        # Weight-only int4 per group of 128 input channels (WeightQuantBatchMatmul, A2/A3).
        Scheme("w4a16", QuantSpec(Precision.W4A16), False, ("Linear",), k_multiple=8),
        # Static per-tensor scales per group of denoising steps (groups chosen by the probe).
        Scheme("w8a8_timestep", QuantSpec(Precision.W8A8), False, ("Linear",), per_step=True),
        # The same on SmoothQuant-smoothed inputs (the static search's alpha): on shapes-dit
        # SmoothQuant wins every denoiser Linear, so per-step scales only compete smoothed.
        Scheme(
            "w8a8_timestep_smoothquant",
            QuantSpec(Precision.W8A8),
            True,
            ("Linear",),
            per_step=True,
        ),
        # An attention module's SDPA as the fused int8 attention (quant/attention.py): static
        # per-tensor query/key/value scales, the key as it is or less its mean over the keys.
        Scheme("a8", QuantSpec(Precision.A8), False, (ATTENTION_TYPE,)),
        Scheme("a8_kmean", QuantSpec(Precision.A8, k_mean=True), False, (ATTENTION_TYPE,)),
        # The same scales per group of denoising steps (groups chosen by the probe on the
        # query/key/value ranges of each step): where the target switches scales per step.
        Scheme("a8_step", QuantSpec(Precision.A8), False, (ATTENTION_TYPE,), per_step=True),
        # Scales per key/value head (msModelSlim's FA3 granularity): one op call per head.
        Scheme("a8_head", QuantSpec(Precision.A8, per_head=True), False, (ATTENTION_TYPE,)),
    )
}


def schemes_for(module_type: str, in_features: int | None = None) -> tuple[str, ...]:
    """Names of the schemes the probe measures on a module of class ``module_type`` (with
    ``in_features`` inputs per output, when given: a conv's C * KH * KW), in order."""
    return tuple(
        name
        for name, s in SCHEMES.items()
        if module_type in s.module_types
        and (in_features is None or s.fits(module_type, in_features))
    )


def get_scheme(name: str) -> Scheme:
    """The scheme called ``name``.

    Raises:
        ConfigError: an unknown name (the known ones are listed).
    """
    try:
        return SCHEMES[name]
    except KeyError:
        raise ConfigError(f"unknown scheme {name!r}; choose one of {', '.join(SCHEMES)}") from None


def scheme_spec(name: str, alpha: float | Literal["auto"] | None = None) -> QuantSpec:
    """The QuantSpec scheme ``name`` stands for, with SmoothQuant strength ``alpha``."""
    return get_scheme(name).spec(alpha)
