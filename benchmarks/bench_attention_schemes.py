"""Issue 60: the int8 attention schemes side by side on the demos.

For each demo (built-in recipe, target ``ascend910b-eager``): one probe measuring the attention
schemes only (``a8``: static per-tensor query/key/value scales; ``a8_kmean``: the key less its
mean over the keys; ``a8_step``: per-tensor scales per group of denoising steps, chosen by the
probe; ``a8_head``: below), then per scheme a candidate with **every attention module the op can run** in that scheme
and everything else float (so the row is the attention's own cost), judged against the float
model by the demo's built-in suite on its first ``--limit`` samples: the suite's quality figures
with their paired bootstrap intervals, and the attention's share of all the model's MACs that
the candidate puts in int8. The probe's own prediction (its end-to-end estimate summed over the
attention modules, as output SQNR) stands beside each.

``a8_head``: scales per key/value head; A2's fused op takes one ``deq_scale1`` per call
(``ascend/attention_quant.py``), so the op runs once per key/value head.

Backend: cpu (PyTorch eager fp32 and the exact Ascend int8 reference of the fused attention).

Run: ``python benchmarks/bench_attention_schemes.py [--demos shapes-dit,shapes-t2i]
[--limit 64]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from opsnn_quant.evaluation.evaluate import evaluate
from opsnn_quant.evaluation.suite import load_suite
from opsnn_quant.pipeline.context import load_recipe_model
from opsnn_quant.pipeline.recipe import load_recipe
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.api import run_probe
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.schemes import get_scheme
from opsnn_quant.quant.spec import ATTENTION_TYPE

TARGET = "ascend910b-eager"
SCHEMES = ("a8", "a8_kmean", "a8_step", "a8_head")
DEMOS = ("shapes-dit", "shapes-t2i", "whisper-tiny-en")


def _limited(suite: Any, limit: int) -> Any:
    data = suite.data.model_copy(update={"samples": limit})
    return suite.model_copy(update={"data": data})


def _figures(report: Any) -> str:
    """The judged quality criteria: value [interval] (threshold)."""
    rows = []
    for c in report.criteria:
        if c.ci_low is None or c.value is None:
            continue
        rows.append(f"{c.label} {c.value:.4g} [{c.ci_low:.4g}, {c.ci_high:.4g}] "
                    f"({c.comparator} {c.threshold:g})")  # fmt: skip
    return "; ".join(rows)


def demo_rows(name: str, limit: int, schemes: tuple[str, ...] = SCHEMES) -> list[str]:
    """The table rows of one demo."""
    recipe = load_recipe(name)
    adapter = load_recipe_model(recipe)
    records = recipe.data.load(recipe.data.calibration, recipe.data.limit)
    probed = records[: recipe.probe.data_limit] if recipe.probe.data_limit else records
    target = get_target(TARGET)
    runnable = [s for s in SCHEMES if s in target.schemes(ATTENTION_TYPE)]
    asked = [s for s in runnable if s in schemes]
    cfg = target.probe_config(
        **{**recipe.probe_settings(), "schemes": tuple(runnable), "fp16": False,
           "seed": recipe.seed}
    )  # fmt: skip
    t0 = time.perf_counter()
    result = run_probe(adapter, adapter.forward_loop(probed), cfg)
    probe_s = time.perf_counter() - t0
    entries = [
        e for e in result.report.modules
        if e.type == ATTENTION_TYPE and e.quantizable and not e.refused
    ]  # fmt: skip
    all_macs = sum(
        (r.pass_macs or 0) + (r.other_macs or 0) for r in result.report.modalities.values()
    )
    attn_macs = sum(e.macs * e.calls for e in entries)
    share = attn_macs / all_macs if all_macs else 0.0
    suite = _limited(load_suite(name), limit)
    baseline = load_recipe_model(recipe)
    out = []
    for scheme in asked:
        specs, taken = {}, {}
        for e in entries:
            # a per-step scheme exists only for calls inside the sampling loop (the denoiser):
            # the other attention modules (text encoders) take the per-tensor a8
            used = scheme if scheme in e.w8a8 else "a8"
            err = e.w8a8.get(used)
            if err is None or err.infeasible is not None:
                continue
            bounds = tuple(err.timestep_bounds) if err.timestep_bounds else None
            specs[e.name] = get_scheme(used).spec(None, bounds)
            taken[e.name] = used
        if scheme not in taken.values():
            out.append(f"| {name} | {scheme} | not offered (no sampling loop) | | | | | |")
            continue
        contributions = sum(
            (e.e2e.schemes or {}).get(taken[e.name], 0.0)
            for e in entries
            if e.e2e is not None and e.name in taken
        )
        counts = {
            u: sum(1 for t in taken.values() if t == u) for u in dict.fromkeys(taken.values())
        }
        covered = " + ".join(f"{c} {u}" for u, c in counts.items())
        predicted = -10 * math.log10(contributions) if contributions > 0 else math.inf
        cand = load_recipe_model(recipe)
        quantize(cand.model, specs, cand.forward_loop(probed), statistics=result.statistics)
        t1 = time.perf_counter()
        report = evaluate(baseline, cand, suite, latency="none", created="")
        out.append(
            f"| {name} | {scheme} | {covered} of {len(entries)} | {_figures(report)} | "
            f"{report.verdict} | {predicted:.1f} dB | {share:.1%} | "
            f"{time.perf_counter() - t1:.0f} s |"
        )
        print(out[-1], file=sys.stderr, flush=True)
    print(f"{name}: probe {probe_s:.0f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    """Run the demos and print one markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demos", default=",".join(DEMOS))
    ap.add_argument("--limit", type=int, default=64, help="suite samples per candidate")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="the rows to judge")
    args = ap.parse_args()
    demos = [d for d in args.demos.split(",") if d]
    schemes = tuple(s for s in args.schemes.split(",") if s)
    unknown = [d for d in demos if d not in DEMOS] + [s for s in schemes if s not in SCHEMES]
    if unknown or not demos or not schemes:
        raise SystemExit(f"error: unknown or missing demo/scheme {unknown}; demos {list(DEMOS)}, "
                         f"schemes {list(SCHEMES)}")  # fmt: skip
    rows = [
        "| demo | scheme | attention int8 | quality delta [95% interval] | verdict | "
        "probe's predicted output SQNR | attention share of all MACs | eval time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in demos:
        rows += demo_rows(name, args.limit, schemes)
    print("\n".join(rows))
    print(f"\nbackend: cpu (exact Ascend int8 reference), target {TARGET}, limit {args.limit}")


if __name__ == "__main__":
    main()
