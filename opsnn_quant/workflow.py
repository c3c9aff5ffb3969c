"""The calibrate workflow: recipe -> probe -> policy -> quantize -> save -> export (one OUT dir).

:func:`run_calibrate` reads as its phases. Everything that can be checked before the model loads
is (output path, suite, latency mode, AMCT, data); then ``OUT/`` is built in a temporary sibling
and renamed into place (:func:`opsnn_quant.io.atomic_dir`), and a summary comes back for the CLI.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsnn_quant.amct.handoff import run_amct_roots
from opsnn_quant.amct.run import import_amct
from opsnn_quant.backends.devices import resolve_device
from opsnn_quant.calibrate_exports import (  # the export phases, in their order
    export_calls,
    model_export_plan,
    model_exports,
    stage_atc_float_graphs,
    write_policy_exports,
)
from opsnn_quant.determinism import set_reproducible
from opsnn_quant.evaluation.evaluate import evaluate, policy_summary
from opsnn_quant.evaluation.gate import check_latency_mode
from opsnn_quant.evaluation.render import write_report
from opsnn_quant.evaluation.suite import Suite, load_suite, suite_inputs
from opsnn_quant.io import atomic_dir, check_output_dir
from opsnn_quant.models import ModelAdapter, check_weights, load_adapter
from opsnn_quant.models.data import load_records
from opsnn_quant.models.settings import check_source_fits
from opsnn_quant.outputs import CalibrateOutput
from opsnn_quant.policy.baselines import naive_policy
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.summary import ModalitySummaryRow, summarize
from opsnn_quant.policy.targets import INT8_MODULE_TYPES, get_target
from opsnn_quant.probe.api import ProbeKeep, probe
from opsnn_quant.probe.measure import measure_modalities
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.checkpoint import save_quantized
from opsnn_quant.recipe import Recipe
from opsnn_quant.recording import RecordedRoots, record_roots
from opsnn_quant.sources import local_paths
from opsnn_quant.timings import write_timings
from opsnn_quant.types import Modality, Progress
from opsnn_quant.user_config import check_seed

log = logging.getLogger(__name__)
OUTPUT_KIND = "calibrate"
ENGINES = ("opsnn", "amct")


@dataclass
class CalibrateResult:
    """What ``calibrate`` produced, for the summary table and the closing report."""

    out: Path
    rows: list[ModalitySummaryRow]
    measured: dict[Modality, dict[str, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    int8_mac_share: float | None = None
    notes: list[str] = field(default_factory=list)
    verdict: str | None = None


@dataclass
class _Data:
    calibration: list[dict[str, Any]]
    probe: list[dict[str, Any]]
    holdout: list[dict[str, Any]] | None


def load_recipe_model(recipe: Recipe) -> ModelAdapter:
    """The recipe's model, through its adapter."""
    m = recipe.model
    return load_adapter(
        m.family,
        m.source,
        device=m.device,
        dtype=m.dtype,
        allow_pickle=m.allow_pickle,
        **recipe.settings_dict(),
    )


def recipe_inputs(recipe: Recipe) -> list[str]:
    """The local paths a recipe reads (the model's directory, resolved for a named source, and
    the data): an output may not replace them, contain them or lie inside them."""
    sources = [recipe.model.source, recipe.data.calibration, recipe.data.holdout]
    return [str(p) for s in sources if s is not None for p in local_paths(s)]


def check_calibrate_output(
    recipe: Recipe,
    out: Path,
    *,
    force: bool = False,
    suite: str | None = None,
    inputs: Iterable[str] = (),
) -> None:
    """Refuse an output ``calibrate`` must not replace, before any work (see
    :func:`opsnn_quant.io.check_output_dir`): the recipe's inputs, the ``suite``'s and
    ``inputs`` (such as the recipe file) are never replaced."""
    read = [*recipe_inputs(recipe), *(suite_inputs(suite) if suite else []), *inputs]
    check_output_dir(out, OUTPUT_KIND, force=force, inputs=read)


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
            path, seed, device, settings against the model's config files, latency mode,
            suite, AMCT, data), or a failure of a phase.
    """
    say = progress or (lambda m: log.info("%s", m))
    check_seed(seed, "seed")  # the recipe's is checked by its schema
    acceptance = _check_before_work(recipe, out, engine, suite, latency, force)
    seed = recipe.seed if seed is None else seed
    set_reproducible(seed=seed)
    t_all = time.perf_counter()
    data = _load_data(recipe, say)
    say(f"loading {recipe.model.source}")
    adapter = load_recipe_model(recipe)
    times: dict[str, float] = {}
    with atomic_dir(out, OUTPUT_KIND, force=force) as tmp:
        keep = ProbeKeep()
        report = _probe_phase(adapter, recipe, data, seed, tmp, times, say, keep)
        policy = _policy_phase(report, recipe, tmp, say)
        recorded = _record_holdout(adapter, recipe, data, seed, say)
        notes = write_policy_exports(policy, report, recipe, tmp, say)
        exports = model_export_plan(policy, recipe, engine)
        calls = export_calls(adapter, recipe, data.calibration, recorded, keep, exports, say)
        staged = stage_atc_float_graphs(adapter, policy, report, calls, exports, tmp, say)
        _quantize_phase(adapter, policy, data, engine, seed, tmp, times, say, keep)
        measured = _measure_phase(adapter, recorded, say) if engine == "opsnn" else {}
        if engine == "opsnn":
            notes += exports.notes + model_exports(
                adapter, policy, report, exports, calls, staged, tmp, say
            )
        rows = summarize(policy, report)
        verdict = None
        if acceptance is not None and engine == "opsnn":
            verdict = _evaluate_into(
                CalibrateOutput(tmp).report, recipe, adapter, acceptance, report, say, latency
            )
        # The run's wall-clock times, apart: every other file is the same bytes on a rerun.
        times["total"] = time.perf_counter() - t_all
        write_timings(tmp, probe=report.costs, phases=times)
    return CalibrateResult(
        out, rows, measured, times, _int8_mac_share(report, rows), notes, verdict
    )


def _check_before_work(
    recipe: Recipe, out: Path, engine: str, suite: str | None, latency: str, force: bool
) -> Suite | None:
    """Everything checkable before data and model load; returns the loaded suite."""
    check_weights(recipe.model.source, allow_pickle=recipe.model.allow_pickle)
    check_calibrate_output(recipe, out, force=force, suite=suite)
    resolve_device(recipe.model.device)  # an npu recipe on a machine without torch_npu: now
    check_source_fits(recipe.model.source, recipe.model.settings)  # e.g. steps vs the scheduler
    check_latency_mode(latency)  # with or without a suite: a typo is never silently ignored
    loaded = None
    if suite is not None:
        loaded = load_suite(suite)
    if engine not in ENGINES:
        from opsnn_quant.errors import ConfigError

        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "amct":
        import_amct()  # AMCT ships with CANN and may simply not be here
    return loaded


def _load_data(recipe: Recipe, say: Progress) -> _Data:
    say("loading the calibration data")
    calib = load_records(recipe.data.calibration, recipe.data.limit)
    limit = recipe.probe.data_limit
    holdout = None
    if recipe.data.holdout:
        holdout = load_records(recipe.data.holdout, recipe.data.holdout_limit)
    return _Data(calib, calib[:limit] if limit else calib, holdout)


def _probe_phase(
    adapter: ModelAdapter,
    recipe: Recipe,
    data: _Data,
    seed: int,
    tmp: Path,
    times: dict[str, float],
    say: Progress,
    keep: ProbeKeep,
) -> SensitivityReport:
    t0 = time.perf_counter()
    # Only the schemes the target runs (or the recipe's choice among them), on the module types
    # it runs them on: the others' errors and scores would never be used.
    target = get_target(recipe.target)
    schemes = recipe.probe.schemes or target.schemes()
    type_schemes = {t: target.schemes(t) for t in sorted(INT8_MODULE_TYPES)}
    cfg = recipe.probe_config(seed, schemes=tuple(schemes), type_schemes=type_schemes)
    report = probe(adapter, adapter.forward_loop(data.probe), cfg, progress=say, keep=keep)
    report.save(CalibrateOutput(tmp).probe)
    times["probe"] = time.perf_counter() - t0
    return report


def _policy_phase(
    report: SensitivityReport, recipe: Recipe, tmp: Path, say: Progress
) -> PrecisionPolicy:
    say("deciding the precision policy")
    if recipe.strategy == "search":
        policy = build_policy(report, recipe.budget, recipe.target)
    else:
        policy = naive_policy(report, recipe.target, recipe.strategy)
    policy.save(CalibrateOutput(tmp).policy)
    return policy


def _record_holdout(
    adapter: ModelAdapter, recipe: Recipe, data: _Data, seed: int, say: Progress
) -> RecordedRoots | None:
    """The float model's root outputs on held-out data, to measure the quantized one against."""
    if data.holdout is None:
        return None
    say("recording float outputs on held-out data")
    max_calls = recipe.probe_config(seed).max_root_calls
    return record_roots(adapter, adapter.forward_loop(data.holdout), max_calls, seed=seed + 1)


def _quantize_phase(
    adapter: ModelAdapter,
    policy: PrecisionPolicy,
    data: _Data,
    engine: str,
    seed: int,
    tmp: Path,
    times: dict[str, float],
    say: Progress,
    keep: ProbeKeep,
) -> None:
    """Quantize with the calibration data: from the probe's pass-1 statistics when the probe
    ran on all of it (the same float model on the same data: the same observers, no pass)."""
    t0 = time.perf_counter()
    loop = adapter.forward_loop(data.calibration)
    same_data = data.probe is data.calibration
    if engine == "amct":
        say("handing the policy to AMCT")
        run_amct_roots(adapter, policy, loop, tmp / "amct")
    else:
        say("quantizing")
        set_reproducible(seed=seed)
        stats = keep.statistics if same_data else None
        quantize(adapter.model, policy, loop, progress=say, statistics=stats)
        save_quantized(
            adapter.model,
            CalibrateOutput(tmp).quant,
            source_model=adapter.model_id,
            extra={"policy_model": policy.model},
            allow_empty=True,
        )
    keep.statistics.clear()
    times["quantize"] = time.perf_counter() - t0


def _measure_phase(
    adapter: ModelAdapter, recorded: RecordedRoots | None, say: Progress
) -> dict[Modality, dict[str, float]]:
    if recorded is None:
        return {}
    say("measuring the quantized model on held-out data")
    return measure_modalities(adapter, recorded)


def _evaluate_into(
    path: Path,
    recipe: Recipe,
    candidate: ModelAdapter,
    suite: Suite,
    report: SensitivityReport,
    say: Progress,
    latency: str,
) -> str:
    """Acceptance of the freshly quantized model against a fresh float copy; returns the verdict.

    The policy is already in ``path.parent`` (the output being built): its target decides where
    latency is judged.
    """
    say("loading the float baseline for the acceptance run")
    baseline = load_recipe_model(recipe)
    acc = evaluate(
        baseline,
        candidate,
        suite,
        policy=policy_summary(path.parent),
        sensitivity=report,
        progress=say,
        latency=latency,
        allow_pickle=recipe.model.allow_pickle,  # the suite's CLIP too
    )
    write_report(acc, path)
    return str(acc.verdict)


def _int8_mac_share(report: SensitivityReport, rows: list[ModalitySummaryRow]) -> float | None:
    """Share of all MACs in int8, the modalities weighted by their MACs."""

    def macs(modality: Modality) -> float:
        summary = report.modalities.get(modality.value)
        return float(summary.macs) if summary is not None else 0.0

    int8 = sum(r.int8_mac_share * macs(r.modality) for r in rows)
    total = sum(macs(r.modality) for r in rows)
    return int8 / total if total else None
