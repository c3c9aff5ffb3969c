"""``calibrate --engine amct``: hand the decided policy to AMCT, one modality root at a time.

AMCT quantizes one ``nn.Module`` traced from example inputs, so each modality root of the model
(e.g. ``unet``, ``text_encoder``, ``model.encoder``) that the policy makes int8 is handed over on
its own: the policy is re-scoped to the root's own module names, the root's recorded calibration
calls are the example input and the calibration forward loop, and AMCT writes its deploy model
into ``OUT/amct/<root>/``. See :func:`opsnn_quant.amct.run.run_amct` for the AMCT calls.
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import Any

from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.types import ForwardLoop, match_prefix

log = logging.getLogger(__name__)


def scope_policy(policy: PrecisionPolicy, root: str, names: list[str]) -> PrecisionPolicy:
    """The policy as seen from inside module ``root`` (names relative to it).

    Rules that match none of the root's modules are dropped; the others keep their order with
    the ``root.`` prefix removed from their glob.
    """
    if not root:
        return policy
    prefix = root + "."
    inner = [n[len(prefix) :] for n in names if n.startswith(prefix)]
    rules = []
    for rule in policy.rules:
        if not any(fnmatch.fnmatchcase(prefix + n, rule.match) for n in inner):
            continue
        match = rule.match[len(prefix) :] if rule.match.startswith(prefix) else rule.match
        rules.append(rule.model_copy(update={"match": match}))
    modalities = {}
    for p, m in policy.modalities.items():
        if p == root or p == "":
            modalities[""] = m
        elif p.startswith(prefix):
            modalities[p[len(prefix) :]] = m
    return policy.model_copy(update={"rules": rules, "modalities": modalities})


def run_amct_roots(
    adapter: ModelAdapter, policy: PrecisionPolicy, loop: ForwardLoop, out: Path, batch_num: int = 4
) -> dict[str, Any]:
    """Run AMCT on every root the policy quantizes; returns ``{root: AmctRun}``."""
    from opsnn_quant.amct.run import import_amct, run_amct
    from opsnn_quant.recording import detached_copy, record_roots

    import_amct()  # fail fast, before any calibration work, when AMCT is not installed
    named = dict(adapter.model.named_modules())
    names = list(named)
    types = {n: type(m).__name__ for n, m in named.items()}
    resolved = policy.resolve(names, types)
    recorded = record_roots(adapter, loop, max_calls=batch_num)
    runs = {}
    for root in adapter.roots():
        inside = [
            n
            for n in names
            if match_prefix(n, (root,)) is not None and resolved[n].precision.is_int8
        ]
        calls = recorded.calls.get(root)
        if not inside or not calls:
            continue
        module = named[root]
        scoped = scope_policy(policy, root, names)

        def replay(m: Any, calls: list = calls) -> None:
            for call in calls:
                args, kwargs = detached_copy(call)
                m(*args, **kwargs)

        args, _ = calls[0]
        runs[root or "model"] = run_amct(
            module,
            scoped,
            args,
            out / (root or "model"),
            forward_loop=replay,
            batch_num=len(calls),
            name=root.replace(".", "_") or "model",
        )
        log.info("AMCT quantized %s (%d int8 modules)", root or "the model", len(inside))
    return runs
