"""SmoothQuant folded into the producer: the Linears one norm feeds share one factor.

An engine without run-time smoothing (vLLM-Ascend: ``w8a8_static.py`` quantizes ``x`` as it
comes) deploys SmoothQuant only by dividing the factor into the norm before the Linears
(msModelSlim's ``norm-linear`` smoothing). Then every Linear that norm feeds sees ``x / s``: the
smoothed int8 members of the group share one factor (one alpha, measured so by the probe:
``SensitivityReport.smoothing_groups``), and an int8 member cannot stay unsmoothed; a float
member keeps its output (its weight columns absorb ``s``). So a group either smooths all of its
int8 members with one scheme or smooths none of them; each member may still stay float.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping

from opsnn_quant.policy._schemes import Choice, choice_key, scheme_choices
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.report import ModuleSensitivity
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.types import Precision

Candidates = dict[str, tuple[ModuleSensitivity, Choice]]


def plain_schemes(schemes: Collection[str]) -> tuple[str, ...]:
    """``schemes`` without the SmoothQuant ones."""
    return tuple(s for s in schemes if not SCHEMES[s].smoothquant)


def share_smoothing(
    cands: Candidates,
    groups: Mapping[str, list[str]],
    allowed: Callable[[ModuleSensitivity], set[Precision]],
    runs: Callable[[ModuleSensitivity], Collection[str]],
    target: Target,
    fallback: dict[str, str],
    fused: list[list[str]],
) -> dict[str, tuple[str, ...]]:
    """In place: the int8 candidates of each group take either one SmoothQuant scheme (measured
    on all of them with one alpha) or each its best unsmoothed scheme, whichever adds the
    smaller summed contribution (ties: unsmoothed); a group with neither stays float, each
    member's reason in ``fallback``. A group with a member of a ``fused`` layer that reaches
    outside the group (Whisper's cross-attention q_proj, fused with k/v_proj that the encoder
    feeds) is not smoothed: the fused layer takes one type, and its other members no factor.

    Returns:
        member -> the schemes it may still take (the fused layers' common scheme is chosen
        among them): its group's SmoothQuant scheme, or the unsmoothed ones.
    """
    restrict: dict[str, tuple[str, ...]] = {}
    for producer, members in groups.items():
        int8 = [n for n in members if n in cands]
        if not int8:
            continue
        per = {
            n: scheme_choices(
                cands[n][0], allowed(cands[n][0]), target.timestep_scales, runs(cands[n][0])
            )
            for n in int8
        }
        inside = set(members)
        whole = all(inside.issuperset(f) for f in fused if inside.intersection(f))
        picked = _pick(per, smoothing=whole)
        if picked is None:
            for n in int8:
                del cands[n]
                fallback[n] = (
                    f"stays float: fed by {producer} with {', '.join(members)}, which share one "
                    "SmoothQuant factor or none, and no choice is measured on all of them"
                )
            continue
        for n, choice in picked.items():
            cands[n] = (cands[n][0], dataclasses.replace(choice, spec=target.spec_for(choice.spec)))
            smoothed = choice.spec.smoothquant
            restrict[n] = (choice.scheme,) if smoothed else plain_schemes(runs(cands[n][0]))
    return restrict


def _pick(per: Mapping[str, dict[str, Choice]], smoothing: bool) -> dict[str, Choice] | None:
    """Each member's choice under the cheapest option: unsmoothed (each its best) or, where
    ``smoothing``, one SmoothQuant scheme for all (with one alpha); None when no option is
    measured on all."""
    options: list[tuple[float, int, dict[str, Choice]]] = []
    plain = {
        n: _best({s: c for s, c in ch.items() if not c.spec.smoothquant}) for n, ch in per.items()
    }
    if all(c is not None for c in plain.values()):
        options.append((_total(plain), -1, plain))  # type: ignore[arg-type]
    order = list(SCHEMES)
    common = set.intersection(*(set(ch) for ch in per.values()))
    for scheme in sorted(common, key=order.index):
        if not (smoothing and SCHEMES[scheme].smoothquant):
            continue
        chosen = {n: ch[scheme] for n, ch in per.items()}
        alphas = {c.spec.smoothquant_alpha for c in chosen.values()}
        if len(alphas) == 1 and isinstance(next(iter(alphas)), float):  # one factor, measured
            options.append((_total(chosen), order.index(scheme), chosen))
    if not options:
        return None
    return min(options, key=lambda o: (float(f"{o[0]:.6g}"), o[1]))[2]


def _best(choices: dict[str, Choice]) -> Choice | None:
    """The best of one module's choices, as :func:`~opsnn_quant.policy._schemes.best_choice`
    ranks them (ties: the simpler scheme, listed first)."""
    ranked = list(choices.values())
    if not ranked:
        return None
    return min(enumerate(ranked), key=lambda r: (choice_key(r[1]), r[0]))[1]


def _total(chosen: Mapping[str, Choice]) -> float:
    return math.fsum(c.contribution for _, c in sorted(chosen.items()))
