"""Probe scheme names -> the QuantSpec of a rule, and first-order error arithmetic.

Scheme names in ``SensitivityReport.modules[i].w8a8`` (the probe's convention) and the QuantSpec
each stands for come from the one table, :data:`opsnn_quant.quant.schemes.SCHEMES`.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from opsnn_quant.probe.report import ModuleSensitivity
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


@dataclass(frozen=True)
class Choice:
    """The scheme picked for one module and what it is predicted to cost."""

    scheme: str
    spec: QuantSpec  # what the rule says (SmoothQuant with the probe's alpha)
    sqnr_db: float | None  # local SQNR (None = no error)
    contribution: float  # relative noise energy added to the modality output (first order)
    scaled: bool  # contribution rescaled from another scheme's estimate
    by_e2e: bool = False  # chosen by end-to-end estimate (else by local SQNR)
    reason: str = ""  # why, when not chosen by the probe's figures (a modality decided first)

    @property
    def precision(self) -> Precision:
        """The chosen int8 precision."""
        return self.spec.precision


def contribution_for(m: ModuleSensitivity, scheme: str) -> tuple[float, bool] | None:
    """Estimated end-to-end contribution of ``m`` under ``scheme``.

    When the probe scored ``scheme`` end to end (``e2e.schemes``), that estimate. Otherwise the
    probe measured ``e2e.contribution`` under ``e2e.scheme`` only; to first order a module's
    contribution scales with its local noise energy, so under another scheme ``s`` it is
    ``c * 10 ** ((sqnr[e2e.scheme] - sqnr[s]) / 10)`` (rescaled).

    Returns:
        ``(contribution, rescaled)`` or None when the probe gives no end-to-end estimate.
    """
    if m.e2e is None:
        return None
    if scheme in m.e2e.schemes:  # scored end to end by the probe itself
        return m.e2e.schemes[scheme], False
    base = m.e2e.contribution
    if scheme == m.e2e.scheme:
        return base, False
    ref, new = m.w8a8.get(m.e2e.scheme), m.w8a8.get(scheme)
    if ref is None or new is None:
        return None
    if new.sqnr_db is None:  # the other scheme adds no error at all
        return 0.0, True
    if ref.sqnr_db is None:  # measured scheme was lossless: nothing to scale from
        return None
    return base * 10.0 ** ((ref.sqnr_db - new.sqnr_db) / 10.0), True


def scheme_choices(
    m: ModuleSensitivity,
    allowed: set[Precision],
    per_step: bool = False,
    runs: Collection[str] | None = None,
) -> dict[str, Choice]:
    """Every scheme the probe measured on ``m`` whose precision is in ``allowed`` (per-step
    schemes only where ``per_step``; only those in ``runs`` when given: a target's schemes) and
    that has an end-to-end estimate, as a Choice, in ``SCHEMES`` order."""
    by_e2e = m.e2e is not None and bool(m.e2e.schemes)
    out = {}
    for name, scheme in SCHEMES.items():
        err = m.w8a8.get(name)
        if err is None or err.infeasible or scheme.precision not in allowed:
            continue
        if runs is not None and name not in runs:
            continue
        if scheme.per_step and not per_step:
            continue
        est = contribution_for(m, name)
        if est is None:
            continue
        # The probe records the alpha it searched; without one, search again at calibration.
        alpha: float | Literal["auto"] = (
            err.smoothquant_alpha if err.smoothquant_alpha is not None else "auto"
        )
        bounds = tuple(err.timestep_bounds) if err.timestep_bounds else None
        spec = SCHEMES[name].spec(alpha, bounds)
        out[name] = Choice(name, spec, err.sqnr_db, est[0], est[1], by_e2e)
    return out


def choice_key(choice: Choice) -> float:
    """What ranks schemes of one module (lower is better): the end-to-end contribution when the
    probe scored every scheme end to end, else minus the local SQNR; rounded, so that a
    last-bit difference between runs cannot change the choice."""
    if choice.by_e2e:
        return float(f"{choice.contribution:.6g}")
    return -round(math.inf if choice.sqnr_db is None else choice.sqnr_db, 4)


def best_choice(
    m: ModuleSensitivity,
    allowed: set[Precision],
    per_step: bool = False,
    runs: Collection[str] | None = None,
) -> Choice | None:
    """The best scheme among those whose precision is in ``allowed`` (per-step schemes only
    where ``per_step``: the target switches static scales per denoising step).

    Best = smallest end-to-end contribution when the probe scored every scheme end to end (local
    SQNR can rank schemes wrongly for the output: SmoothQuant or MSE clipping may lower a layer's
    own error while moving noise where the output is more sensitive); otherwise the best local
    SQNR. Ties go to the simpler scheme (``SCHEMES`` order).
    """
    ranked = list(scheme_choices(m, allowed, per_step, runs).values())
    if not ranked:
        return None
    return min(enumerate(ranked), key=lambda r: (choice_key(r[1]), r[0]))[1]


def noise_to_db(noise: float) -> float | None:
    """Predicted SQNR from relative noise energy (None when there is no noise)."""
    return None if noise <= 0 else -10.0 * math.log10(noise)


def describe_scheme(choice: Choice) -> str:
    """e.g. ``w8a8_smoothquant (alpha=0.5)``."""
    alpha = choice.spec.smoothquant_alpha
    return choice.scheme + (f" (alpha={alpha})" if alpha is not None else "")
