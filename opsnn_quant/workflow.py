"""The calibrate workflow: recipe -> probe -> policy -> quantize -> save -> export (one OUT dir).

``run_calibrate`` writes ``OUT/`` as DESIGN.md lays it out, atomically (a temporary sibling
renamed into place), and returns a summary the CLI prints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.determinism import set_reproducible
from opsnn_quant.io import atomic_dir, check_output_dir
from opsnn_quant.models import ModelAdapter, load_adapter
from opsnn_quant.models.data import load_records
from opsnn_quant.recipe import Recipe
from opsnn_quant.types import Modality

if TYPE_CHECKING:
    from opsnn_quant.probe.report import SensitivityReport

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
OUTPUT_KIND = "calibrate"


def load_recipe_model(recipe: Recipe) -> ModelAdapter:
    """The recipe's model, through its adapter."""
    return load_adapter(recipe.model.family, recipe.model.source, **recipe.settings_dict())


def recipe_inputs(recipe: Recipe) -> list[str]:
    """The local paths a recipe reads (model directory, data): an output may not replace them."""
    paths = [recipe.model.source, recipe.data.calibration, recipe.data.holdout]
    return [p for p in paths if p is not None and not p.startswith("zoo:")]


def check_calibrate_output(
    recipe: Recipe, out: Path, *, force: bool = False, inputs: Iterable[str] = ()
) -> None:
    """Refuse an output ``calibrate`` must not replace, before any work (see
    :func:`opsnn_quant.io.check_output_dir`); ``inputs`` adds paths such as the recipe file."""
    check_output_dir(out, OUTPUT_KIND, force=force, inputs=[*recipe_inputs(recipe), *inputs])


@dataclass
class CalibrateResult:
    """What ``calibrate`` produced, for the summary table and the closing report."""

    out: Path
    rows: list[Any]
    measured: dict[Modality, dict[str, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    int8_mac_share: float | None = None
    notes: list[str] = field(default_factory=list)
    verdict: str | None = None


def run_calibrate(
    recipe: Recipe,
    out: Path,
    *,
    seed: int | None = None,
    progress: Progress | None = None,
    engine: str = "opsnn",
    suite: str | None = None,
    force: bool = False,
    latency: str = "target",
) -> CalibrateResult:
    """Probe, decide, quantize, save and export, all into ``out`` (atomically).

    Args:
        recipe: the calibration recipe.
        out: output directory (replaced as a whole when the run succeeds).
        seed: overrides the recipe's seed.
        progress: callback told about each phase.
        engine: ``opsnn`` (our exact-Ascend engine) or ``amct`` (hand the policy to AMCT,
            writing ``out/amct/`` instead of ``out/quant/``).
        suite: an acceptance suite to evaluate the result with (report in ``out/report``).
        force: replace ``out`` even when it is not a calibrate output.
        latency: what the acceptance run times (``none``, ``target``, ``all``; see
            :func:`opsnn_quant.evaluation.evaluate.evaluate`).

    Raises:
        OpsnnQuantError: bad input (checked before the model loads where it can be: output
            path, suite, AMCT, data), or a failure of a phase.
    """
    from opsnn_quant.policy.export import (
        EXPORT_FILES,
        export_policy,
        modules_from_report,
        write_export,
    )
    from opsnn_quant.policy.search import build_policy
    from opsnn_quant.policy.summary import summarize
    from opsnn_quant.probe.api import ProbeConfig, probe
    from opsnn_quant.probe.measure import measure_modalities
    from opsnn_quant.quant.api import quantize
    from opsnn_quant.quant.checkpoint import save_quantized
    from opsnn_quant.recording import record_roots

    say = progress or (lambda m: log.info("%s", m))
    check_calibrate_output(recipe, out, force=force)
    if suite is not None:
        from opsnn_quant.evaluation.gate import check_latency_mode
        from opsnn_quant.evaluation.suite import load_suite

        load_suite(suite)  # before any work: a bad suite fails now, not after the probe
        check_latency_mode(latency)
    if engine == "amct":
        from opsnn_quant.amct.run import import_amct

        import_amct()  # before any work: AMCT ships with CANN and may simply not be here
    seed = recipe.seed if seed is None else seed
    set_reproducible(seed=seed)
    times: dict[str, float] = {}
    t_all = time.perf_counter()

    say("loading the calibration data")
    calib = load_records(recipe.data.calibration, recipe.data.limit)
    probe_data = calib[: recipe.probe.data_limit] if recipe.probe.data_limit else calib
    holdout = (
        load_records(recipe.data.holdout, recipe.data.holdout_limit)
        if recipe.data.holdout
        else None
    )
    say(f"loading {recipe.model.source}")
    adapter = load_recipe_model(recipe)

    with atomic_dir(out, OUTPUT_KIND, force=force) as tmp:
        t0 = time.perf_counter()
        cfg = ProbeConfig(
            min_headroom=recipe.probe.min_headroom,
            max_root_calls=recipe.probe.max_root_calls,
            estimator_batch=recipe.probe.estimator_batch,
            estimator=recipe.probe.estimator,
            exhaustive=recipe.probe.exhaustive,
            seed=seed,
        )
        report = probe(adapter, adapter.forward_loop(probe_data), cfg, progress=say)
        report.save(tmp / "probe.json")
        times["probe"] = time.perf_counter() - t0

        say("deciding the precision policy")
        if recipe.strategy == "search":
            policy = build_policy(report, recipe.budget, recipe.target)
        else:
            from opsnn_quant.policy.baselines import naive_policy

            policy = naive_policy(report, recipe.target, recipe.strategy)
        policy.save(tmp / "policy.yaml")

        recorded = None
        if holdout is not None:
            say("recording float outputs on held-out data")
            recorded = record_roots(
                adapter,
                adapter.forward_loop(holdout),
                max_calls=recipe.probe.max_root_calls,
                seed=seed + 1,
            )

        t0 = time.perf_counter()
        return_early = engine == "amct"
        if return_early:
            from opsnn_quant.amct.handoff import run_amct_roots

            say("handing the policy to AMCT")
            run_amct_roots(adapter, policy, adapter.forward_loop(calib), tmp / "amct")
        else:
            say("quantizing (calibration passes)")
            set_reproducible(seed=seed)
            quantize(adapter.model, policy, adapter.forward_loop(calib), progress=say)
            save_quantized(
                adapter.model,
                tmp / "quant",
                source_model=adapter.model_id,
                extra={"policy_model": policy.model},
                allow_empty=True,
            )
        times["quantize"] = time.perf_counter() - t0

        measured = {}
        if recorded is not None and not return_early:
            say("measuring the quantized model on held-out data")
            measured = measure_modalities(adapter, recorded)

        say("exporting AMCT/ATC configs")
        modules = modules_from_report(report)
        notes: list[str] = []
        for fmt in recipe.exports:
            result = export_policy(policy, fmt, modules)
            write_export(result, tmp / "export" / EXPORT_FILES[fmt])
            notes.extend(f"{fmt}: {n}" for n in result.notes)
        rows = summarize(policy, report)
        verdict = None
        if suite is not None and not return_early:
            verdict = _evaluate_into(tmp / "report", recipe, adapter, suite, report, say, latency)
    times["total"] = time.perf_counter() - t_all
    macs_total = sum(
        r.int8_mac_share * _modality_macs(report, r.modality)
        for r in rows
        if r.int8_mac_share is not None
    )
    all_macs = sum(_modality_macs(report, r.modality) for r in rows)
    share = macs_total / all_macs if all_macs else None
    return CalibrateResult(out, rows, measured, times, share, notes, verdict)


def _evaluate_into(
    path: Path,
    recipe: Recipe,
    candidate: ModelAdapter,
    suite: str,
    report: SensitivityReport,
    say: Progress,
    latency: str,
) -> str:
    """Acceptance of the freshly quantized model against a fresh float copy; returns the verdict.

    The policy is already in ``path.parent`` (the output being built): its target decides where
    latency is judged.
    """
    from opsnn_quant.evaluation.evaluate import evaluate, images_for_report, policy_summary
    from opsnn_quant.evaluation.render import write_report
    from opsnn_quant.evaluation.suite import load_suite

    s = load_suite(suite)
    say("loading the float baseline for the acceptance run")
    baseline = load_recipe_model(recipe)
    acc, base_out, cand_out = evaluate(
        baseline,
        candidate,
        s,
        policy=policy_summary(path.parent),
        sensitivity=report,
        progress=say,
        latency=latency,
    )
    write_report(
        acc,
        path,
        baseline_images=images_for_report(base_out),
        candidate_images=images_for_report(cand_out),
    )
    return str(acc.verdict)


def _modality_macs(report: Any, modality: Any) -> float:
    key = getattr(modality, "value", modality)
    summary = report.modalities.get(key)
    return float(summary.macs) if summary is not None else 0.0
