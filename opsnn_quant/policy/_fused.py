"""Fused layers: sibling Linears an engine loads as one layer take one scheme, or stay float
together (vLLM-Ascend's ``qkv_proj`` / ``gate_up_proj``: ``modelslim_config.py``
``get_linear_quant_type`` refuses shards of different types and ``is_layer_skipped_ascend``
shards that are only partly FLOAT; the fused layer holds one ``input_scale``)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from opsnn_quant.policy._schemes import Choice, scheme_choices
from opsnn_quant.policy.targets import Target
from opsnn_quant.probe.report import ModuleSensitivity
from opsnn_quant.quant.schemes import SCHEMES
from opsnn_quant.types import Precision


def fuse_candidates(
    cands: dict[str, tuple[ModuleSensitivity, Choice]],
    groups: list[list[str]],
    fallback: dict[str, str],
    allowed: Callable[[ModuleSensitivity], set[Precision]],
    target: Target,
    runs: Callable[[ModuleSensitivity], Collection[str]],
) -> None:
    """In place: every fused group's members take the scheme with the smallest summed
    contribution among those measured on all of them (of ``runs``: what each may take); a group with a member that cannot be
    int8 (or no common scheme) stays float as a whole, each member's reason in ``fallback``."""
    for members in groups:
        floats = [n for n in members if n not in cands]
        common: set[str] = set()
        per: dict[str, dict[str, Choice]] = {}
        if not floats:
            per = {
                n: scheme_choices(
                    cands[n][0],
                    allowed(cands[n][0]),
                    target.timestep_scales,
                    runs(cands[n][0]),
                )
                for n in members
            }
            common = set.intersection(*(set(c) for c in per.values()))
        if floats or not common:
            why = f"{floats[0]} stays float" if floats else "no scheme measured on every member"
            for n in members:
                if n in cands:
                    del cands[n]
                    fallback[n] = f"stays float: fused with {', '.join(members)} ({why})"
            continue
        order = list(SCHEMES)
        scheme = min(
            common, key=lambda s: (sum(per[n][s].contribution for n in members), order.index(s))
        )
        for n in members:
            ch = per[n][scheme]
            cands[n] = (cands[n][0], Choice(ch.scheme, target.spec_for(ch.spec), ch.sqnr_db,
                                            ch.contribution, ch.scaled, ch.by_e2e))  # fmt: skip


def unfuse_fallbacks(
    keep: list[str], removed: list[str], groups: list[list[str]]
) -> tuple[list[str], list[str]]:
    """(keep, removed) with every fused group that lost a member to the budget removed whole."""
    gone = set(removed)
    drop = {n for members in groups if gone.intersection(members) for n in members}
    return [n for n in keep if n not in drop], [*removed, *(n for n in keep if n in drop)]
