"""One ``calibrate`` run, its strings resolved once (:class:`CalibrateRun`).

The command line and the Python API both end in :func:`resolve_run`: every name becomes a value
there (the target, the acceptance suite, the ``budget.metric`` suite, the quantizer, the probe
configuration) and every check that needs no data or model runs there, once: the model source
and its weights, the output directory (:func:`~opsnn_quant.output.directories.check_output_dir`),
the device, the settings against the model's config files, the memory floor, the latency mode.
Each file is parsed once: the suites here, the recipe before (the caller's). The phases take the
resolved run and never look a name up again. Only the swap of the finished output checks ``OUT`` once more,
under its lock (:func:`~opsnn_quant.output.directories.atomic_dir`): the directory may change while a run works.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsnn_quant.backends.devices import resolve_device
from opsnn_quant.core.user_config import check_seed
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.evaluate import check_suite_fits
from opsnn_quant.evaluation.gate import check_latency_mode
from opsnn_quant.evaluation.registry import budget_problem
from opsnn_quant.evaluation.suite import Suite, load_suite, suite_inputs
from opsnn_quant.models import check_model_source, check_weights
from opsnn_quant.models.footprint import check_source_memory
from opsnn_quant.models.settings import check_source_fits
from opsnn_quant.output.directories import check_output_dir
from opsnn_quant.pipeline.quantizers import Quantizer, get_quantizer
from opsnn_quant.pipeline.recipe import Recipe, recipe_inputs
from opsnn_quant.pipeline.recipe_flags import recipe_yaml
from opsnn_quant.pipeline.resume import run_identity
from opsnn_quant.policy.baselines import baselines_first, probed_schemes
from opsnn_quant.policy.targets import Target, get_target
from opsnn_quant.probe.api import ProbeConfig, check_offloaded_estimators
from opsnn_quant.probe.moments import moments_memory
from opsnn_quant.sources import Source, resolve_source

OUTPUT_KIND = "calibrate"


OFFLOAD_REMEDY = (
    "leave out probe.exhaustive, give --strategy all-w8a8-minmax, all-w8a8-dynamic or "
    "all-fp16, or leave out --max-memory"
)


@dataclass(frozen=True)
class CalibrateRun:
    """One ``calibrate``, resolved: what every phase reads instead of names and flags.

    Attributes:
        recipe: the recipe, the command line's overrides applied (``max_memory`` included).
        out: the output directory (checked: see :func:`resolve_run`).
        seed: the run's seed (the recipe's unless overridden).
        source: the recipe's model source, resolved once.
        target: the recipe's deployment target.
        probe: the probe this run makes (:func:`probe_config`).
        quantizer: who quantizes (``--engine``: ``opsnn`` or ``amct``,
            :mod:`opsnn_quant.pipeline.quantizers`).
        suite: the acceptance suite of ``--evaluate`` (None: no acceptance run).
        suite_name: the name or path it was given as (for the run's identity).
        metric_suite: the suite ``budget.metric`` is measured with (None: no measured search).
        latency: what the acceptance run times (``none``, ``target``, ``all``).
        from_probe: an earlier probe to reuse (checked against this run's model and data once
            they are loaded).
        allow_broken_baseline: judge the candidate even when the float baseline is broken.
        resume: go on from an interrupted run's finished phases.
        force: replace ``out`` even when it is not a calibrate output.
        identity: what a resumed run must share with the interrupted one.
    """

    recipe: Recipe
    out: Path
    seed: int
    source: Source
    target: Target
    probe: ProbeConfig
    quantizer: Quantizer
    suite: Suite | None
    suite_name: str | None
    metric_suite: Suite | None
    latency: str
    from_probe: Path | None
    allow_broken_baseline: bool
    resume: bool
    force: bool
    identity: dict[str, Any]

    @property
    def effective(self) -> Recipe:
        """The recipe as it ran (its seed the run's): ``OUT/recipe.yaml``, to repeat the run."""
        return self.recipe.model_copy(update={"seed": self.seed})


def resolve_run(
    recipe: Recipe,
    out: Path,
    *,
    seed: int | None = None,
    engine: str = "opsnn",
    suite: str | None = None,
    force: bool = False,
    latency: str = "target",
    from_probe: Path | None = None,
    allow_broken_baseline: bool = False,
    resume: bool = False,
    inputs: Iterable[str] = (),
    distributed: bool = False,
    settings_where: str = "model.settings.",
) -> CalibrateRun:
    """Check everything checkable before data and model load, and resolve every name, once.

    Args:
        recipe: the calibration recipe (its ``model.max_memory``: the host memory, in bytes, a
            call of the model may take; None: what the machine has free).
        out: the output directory.
        seed: overrides the recipe's seed.
        engine: ``opsnn`` or ``amct`` (:data:`~opsnn_quant.pipeline.quantizers.QUANTIZERS`).
        suite: an acceptance suite (built-in name or path) to evaluate the result with.
        force: replace ``out`` even when it is not a calibrate output.
        latency: what the acceptance run times (``none``, ``target``, ``all``).
        from_probe: an earlier probe to reuse.
        allow_broken_baseline: judge the candidate even when the float baseline is broken.
        resume: go on from an interrupted run into ``out``.
        inputs: more paths the run reads (the recipe file): ``out`` may not replace them.
        distributed: the probe's statistics pass is shared among processes.
        settings_where: what a message about a model setting puts before its name, for the
            place the user gave it (``model.settings.``, or ``--set `` on the command line).

    Raises:
        OpsnnQuantError: bad input (the model source, its weights, the output path, seed,
            device, settings against the model's config files (the suites' generation
            settings included), memory, latency mode, suite, quantizer, what does not run
            offloaded).
    """
    check_seed(seed, "seed")  # the recipe's is checked by its schema
    moments_memory()  # OPSNN_QUANT_MOMENTS_MEMORY, read at pass 1: refused before any load
    check_offload_unshared(recipe.model.max_memory, distributed)
    source = resolve_source(recipe.model.source)  # split once, here
    check_model_source(source)
    check_weights(source, allow_pickle=recipe.model.allow_pickle)
    metric = recipe.budget.metric
    loaded = load_suite(suite) if suite is not None else None  # each suite file read once
    metric_suite = load_suite(metric.suite) if metric is not None else None
    read = [
        *recipe_inputs(recipe, source),
        *(suite_inputs(loaded, suite) if loaded is not None and suite is not None else []),
        *(suite_inputs(metric_suite, metric.suite) if metric_suite and metric else []),
        *inputs,
    ]
    check_output_dir(out, OUTPUT_KIND, force=force, inputs=read, keep_unfinished=resume)
    check_placement(recipe, source, engine, settings_where)
    check_latency_mode(latency)  # with or without a suite: a typo is never silently ignored
    if metric is not None and metric_suite is not None:  # the bounds against its task's metrics
        problem = budget_problem(metric.bounds(), metric_suite.task)
        if problem:
            raise ConfigError(f"{problem} (suite {metric_suite.name})")
    for used in (loaded, metric_suite):  # each runs the model at its generation settings
        if used is not None:
            check_suite_fits(
                used, source, family=recipe.model.family, settings=recipe.settings_dict()
            )
    # last: AMCT is imported only for a run otherwise good
    quantizer = check_quantizer(engine, measured=metric is not None)
    seed = recipe.seed if seed is None else seed
    identity = run_identity(
        recipe=recipe_yaml(recipe.model_copy(update={"seed": seed})), engine=quantizer.name,
        suite=suite, latency=latency, from_probe=from_probe,
        allow_broken_baseline=allow_broken_baseline,
    )  # fmt: skip
    target = get_target(recipe.target)  # the recipe checked the name when it was read
    return CalibrateRun(
        recipe, out, seed, source, target, probe_config(recipe, seed, target), quantizer,
        loaded, suite, metric_suite, latency, from_probe, allow_broken_baseline, resume, force,
        identity,
    )  # fmt: skip


def check_placement(recipe: Recipe, source: Source, engine: str, settings_where: str) -> None:
    """Where the model goes, before it loads: the device exists, the settings fit the model's
    config files, one call's activations fit the host memory (on the CPU), and an offloaded
    model (``model.max_memory``) runs what the run asks of it.

    Raises:
        OpsnnQuantError: one of them does not.
    """
    settings, budget = recipe.model.settings, recipe.model.max_memory
    resolve_device(recipe.model.device)  # an npu recipe on a machine without torch_npu: now
    check_source_fits(source, settings, settings_where)  # e.g. steps vs the scheduler
    if recipe.model.device.startswith("cpu"):  # the activations of one call, in host memory
        check_source_memory(
            source, settings, records=recipe.data.limit, where=settings_where,
            max_memory=budget, offload=budget is not None,
        )  # fmt: skip
    if budget is not None:
        check_offloadable(recipe, engine)


def probe_config(recipe: Recipe, seed: int, target: Target) -> ProbeConfig:
    """The probe a run makes (:meth:`~opsnn_quant.policy.targets.Target.probe_config`): the
    recipe's probe settings, measuring only the schemes the target runs (or the recipe's choice
    among them) that its strategy reads (:func:`~opsnn_quant.policy.baselines.probed_schemes`),
    on the module types the target runs them on, in its engine's arithmetic."""
    schemes = probed_schemes(recipe.strategy, recipe.probe.schemes or target.schemes())
    return target.probe_config(**{**recipe.probe_settings(), "schemes": schemes, "seed": seed})


def rank_probe_config(recipe: Recipe, seed: int | None = None) -> ProbeConfig:
    """The probe configuration of a rank but 0 of a distributed run (:func:`probe_config`),
    resolved from the recipe (rank 0 resolves the whole run)."""
    seed = recipe.seed if seed is None else seed
    cfg = probe_config(recipe, seed, get_target(recipe.target))
    return baselines_first(cfg) if stages_probe(recipe) else cfg


def stages_probe(recipe: Recipe) -> bool:
    """Whether the decision may be made on pass 1 alone, the estimators run only if it needs
    them (pass 1 then gathers the naive baselines' statistics only,
    :func:`~opsnn_quant.policy.baselines.baselines_first`): a naive baseline never reads the
    estimates; a search decides first (:mod:`~opsnn_quant.pipeline.first`, or the measured
    search of ``budget.metric``) unless the recipe says ``search: full`` without a metric."""
    return (
        recipe.strategy != "search" or recipe.search == "first" or recipe.budget.metric is not None
    )


def check_offload_unshared(max_memory: int | None, distributed: bool) -> None:
    """Refuse an offloaded model (``max_memory``) in a distributed run: every rank refuses it,
    before the ranks part ways (the command line calls this before the others start).

    Raises:
        ConfigError: both.
    """
    if max_memory is not None and distributed:
        raise ConfigError(
            "--max-memory: the probe's statistics pass is not shared among processes with an "
            "offloaded model yet; leave out --nproc (or torchrun) or --max-memory"
        )


def check_quantizer(engine: str, *, measured: bool = False) -> Quantizer:
    """The quantizer ``engine`` names, installed (AMCT importable for ``amct``); ``measured``:
    the run measures candidates (``budget.metric``), which only our quantizer makes.

    Raises:
        ConfigError: an unknown quantizer, or another's with ``measured``.
        MissingDependencyError: ``amct`` without CANN's AMCT installed.
    """
    quantizer = get_quantizer(engine)
    if measured and not quantizer.ours:
        raise ConfigError(
            f"budget.metric measures candidates quantized by opsnn-quant; with --engine {engine} "
            f"the written model is {quantizer.who}'s: leave budget.metric out"
        )
    quantizer.check_available()
    return quantizer


def check_offloadable(recipe: Recipe, quantizer: str) -> None:
    """Refuse, before any work, what does not run on an offloaded model (``--max-memory``):
    a search without ``budget.metric`` whose probe needs an estimator that does not run
    offloaded (it always reads the estimators: the exhaustive reference; see
    :func:`~opsnn_quant.probe.api.check_offloaded_estimators`) and AMCT (which runs the model
    itself). A measured search may decide on pass 1 alone (a naive baseline meets the budget);
    if it does not, the probe phase refuses then.

    Raises:
        ConfigError: the run needs what does not run offloaded.
    """
    why = get_quantizer(quantizer).offloaded
    if why is not None:
        raise ConfigError(
            f"--max-memory: --engine {quantizer} {why}; leave out --max-memory or use "
            "--engine opsnn"
        )
    if recipe.strategy == "search" and recipe.budget.metric is None:
        try:
            check_offloaded_estimators(recipe.probe_config())
        except ConfigError as e:
            raise ConfigError(f"{e}; {OFFLOAD_REMEDY}") from None
