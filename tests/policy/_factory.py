"""Hand-built probe reports with known numbers, so the expected decisions can be worked out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opsnn_quant.probe.report import (
    EndToEnd,
    Fp16Stats,
    ModuleSensitivity,
    SchemeError,
    SensitivityReport,
)


def linear(
    name: str,
    contribution: float,
    *,
    macs: int = 1_000_000,
    modality: str = "denoiser",
    type_: str = "Linear",
    sqnr: Mapping[str, float | None] | None = None,
    alpha: float | None = 0.5,
    e2e_scheme: str = "w8a8",
    fp16: Fp16Stats | None = None,
) -> ModuleSensitivity:
    """A Linear/Conv2d whose ``e2e_scheme`` estimate is ``contribution``.

    ``sqnr`` gives local SQNRs per scheme (default: only ``w8a8`` at 30 dB).
    """
    sqnr = {"w8a8": 30.0} if sqnr is None else sqnr
    w8a8 = {
        k: SchemeError(
            sqnr_db=v, cosine=0.999, smoothquant_alpha=alpha if "smoothquant" in k else None
        )
        for k, v in sqnr.items()
    }
    return ModuleSensitivity(
        name=name,
        type=type_,
        modality=modality,  # type: ignore[arg-type]
        macs=macs,
        params=1000,
        calls=1,
        fp16=fp16,
        w8a8=w8a8,
        e2e=EndToEnd(scheme=e2e_scheme, contribution=contribution, rank=0),
    )


def other(
    name: str, type_: str, *, macs: int = 0, modality: str = "denoiser", **fp16: Any
) -> ModuleSensitivity:
    """A non-quantizable module; keyword arguments become its Fp16Stats."""
    return ModuleSensitivity(
        name=name,
        type=type_,
        modality=modality,  # type: ignore[arg-type]
        macs=macs,
        fp16=Fp16Stats(**fp16) if fp16 else None,
    )


def report(*modules: ModuleSensitivity, model: str = "tiny") -> SensitivityReport:
    """A report of ``modules`` in the given (model) order."""
    return SensitivityReport(model=model, modules=list(modules))


def overflow_stats(rel_error_bf16: float | None = 3e-3) -> dict[str, Any]:
    """Fp16Stats of a module that overflows fp16: absmax 8.1e4, headroom 0.81, 12 inf/nan."""
    return {
        "output_absmax": 8.1e4,
        "headroom_out": 0.81,
        "inf_nan_count": 12,
        "overflow": True,
        "rel_error_bf16": rel_error_bf16,
    }
