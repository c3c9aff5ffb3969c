"""``probe``: a recipe's or a model's probe job, checked before any load, run into OUT.

OUT holds ``probe.json`` and ``timings.json``, built in a temporary sibling and renamed into
place like every output (:func:`opsnn_quant.output.directories.atomic_dir`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.formats.calibrate_output import PROBE_FILE
from opsnn_quant.output.directories import atomic_dir, check_output_dir
from opsnn_quant.output.locks import output_lock
from opsnn_quant.pipeline.recipe import Recipe, recipe_inputs
from opsnn_quant.probe.api import ProbeConfig
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.types import Progress

if TYPE_CHECKING:
    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.pipeline.sharing import Sharing
    from opsnn_quant.sources import Source

PROBE_KIND = "probe"


@dataclass(frozen=True)
class ProbeJob:
    """What ``probe`` runs, resolved from a recipe or a model and checked before any load.

    Attributes:
        family, source, settings: the model (its source resolved once) and its checked
            settings.
        data, limit: the calibration data and how many records of it.
        config: the probe configuration.
        device, dtype, allow_pickle: how the model loads.
        inputs: the local paths the run reads (an output may not replace them).
        out: the output directory; force: replace it even when it is not a probe output.
        column, split: the column and split of a ``datasets`` source.
        max_memory: host memory (bytes) the model may take: its blocks beyond it are
            offloaded (:mod:`opsnn_quant.models.offload`); None: all in memory.
    """

    family: str
    source: Source
    settings: dict[str, Any]
    data: str
    limit: int | None
    config: ProbeConfig
    device: str
    dtype: str
    allow_pickle: bool
    inputs: list[str]
    out: Path
    force: bool
    column: str | None = None
    split: str | None = None
    max_memory: int | None = None  # --max-memory: the blocks beyond it offloaded


def probe_recipe(target: str) -> Recipe | None:
    """The recipe ``probe TARGET`` names (a path or a built-in name), read once; None when
    ``TARGET`` is a model.

    Raises:
        ConfigError: a bad recipe.
    """
    from opsnn_quant.pipeline.recipe import builtin_recipes, load_recipe

    is_recipe = target.endswith((".yaml", ".yml")) or target in builtin_recipes()
    return load_recipe(target) if is_recipe else None


def check_probe(
    target: str,
    recipe: Recipe | None,
    out: Path,
    data: str | None,
    family: str | None,
    limit: int | None,
    sets: list[str],
    exhaustive: bool,
    device: str | None,
    dtype: str | None,
    allow_pickle: bool,
    force: bool = False,
    *,
    column: str | None = None,
    split: str | None = None,
    max_memory: int | None = None,
) -> ProbeJob:
    """Resolve ``probe TARGET``'s options (``recipe``'s fields, :func:`probe_recipe`, or the
    model ``target`` with ``--data``) and check them: limit, family, settings, the model's files (weights, classes, configs,
    safetensors headers), settings against its config files, device, the host memory a call
    takes against ``max_memory`` (None: what is free), and last the output location."""
    from opsnn_quant.backends.devices import resolve_device
    from opsnn_quant.core.user_config import check_limit
    from opsnn_quant.errors import ConfigError
    from opsnn_quant.models import check_weights, family_names, guess_family
    from opsnn_quant.models.footprint import check_source_memory
    from opsnn_quant.models.settings import check_source_fits, parse_set_options, settings_for
    from opsnn_quant.pipeline.recipe import resolve_recipe
    from opsnn_quant.probe.api import check_offloaded_estimators
    from opsnn_quant.probe.moments import moments_memory
    from opsnn_quant.sources import local_paths, resolve_source

    check_limit(limit)
    moments_memory()  # OPSNN_QUANT_MOMENTS_MEMORY, read at pass 1: refused before any load
    is_recipe = recipe is not None
    if recipe is not None:
        r = recipe.with_placement(device, dtype)
        source = resolve_source(r.model.source)  # split once, here
        inputs = [*recipe_inputs(r, source), str(resolve_recipe(target))]
        inputs += [str(p) for p in (local_paths(resolve_source(data)) if data else [])]
        family, settings = r.model.family, r.settings_dict()
        device, dtype = r.model.device, r.model.dtype
        source_data = data or r.data.calibration
        n = limit or r.probe.data_limit or r.data.limit
        cfg = r.probe_config(**({"exhaustive": True} if exhaustive else {}))
        allow_pickle = allow_pickle or r.model.allow_pickle
        column, split = column or r.data.column, split or r.data.split
    else:
        if data is None:
            raise ConfigError("probing a model needs --data (e.g. zoo:shapes/calibration)")
        if family is not None and family not in family_names():
            known = ", ".join(family_names())
            raise ConfigError(f"--family must be one of {known}, got {family!r}")
        source = resolve_source(target)  # split once, here
        family, settings = family or guess_family(source), {}
        source_data, n = data, limit
        inputs = [str(p) for s in (source, resolve_source(data)) for p in local_paths(s)]
        cfg = ProbeConfig(exhaustive=exhaustive)
    checked = settings_for(family, {**settings, **parse_set_options(sets)})
    check_weights(source, allow_pickle=allow_pickle)  # the model's configs before their limits
    where = "--set " if sets or not is_recipe else "model.settings."
    check_source_fits(source, checked, where)
    resolve_device(device or "cpu")
    if (device or "cpu").startswith("cpu"):  # the activations of one call, in host memory
        check_source_memory(
            source, checked, records=n, where=where, max_memory=max_memory,
            offload=max_memory is not None,  # the blocks beyond it offloaded: activations alone
        )  # fmt: skip
    if max_memory is not None:
        check_offloaded_estimators(cfg)  # --exhaustive does not run offloaded
    check_output_dir(out, PROBE_KIND, force=force, inputs=inputs)
    return ProbeJob(
        family, source, checked.model_dump(), source_data, n, cfg, device or "cpu",
        dtype or "float32", allow_pickle, inputs, out, force, column, split, max_memory,
    )  # fmt: skip


def run_probe_job(
    job: ProbeJob, progress: Progress | None = None, sharing: Sharing | None = None
) -> SensitivityReport:
    """Load the data and the model, probe, write ``OUT/probe.json`` and ``OUT/timings.json``
    (rank 0 of a distributed run: pass 1 over its share, the others' merged, see
    :mod:`opsnn_quant.pipeline.sharing`). Holds the lock of ``OUT`` (and of the outputs it lies
    in) from the start (:func:`opsnn_quant.output.locks.output_lock`)."""
    with output_lock(job.out):  # a writer into OUT meanwhile would be swapped away
        return _run_probe_job(job, say=progress or (lambda m: None), sharing=sharing)


def _run_probe_job(job: ProbeJob, say: Progress, sharing: Sharing | None) -> SensitivityReport:
    from opsnn_quant.core.fingerprint import probe_inputs
    from opsnn_quant.models.offload import offload_of
    from opsnn_quant.pipeline.timings import write_timings
    from opsnn_quant.probe.api import run_probe

    records, adapter = _load(job, say, sharing)
    shard = sharing.shard(adapter, records) if sharing is not None else None
    try:
        with atomic_dir(job.out, PROBE_KIND, force=job.force) as tmp:
            loop = adapter.forward_loop(records)
            report = run_probe(adapter, loop, job.config, progress=say, shard=shard).report
            report = report.model_copy(update={"inputs": probe_inputs(job.source, records)})
            report.save(tmp / PROBE_FILE)
            write_timings(tmp, probe=report.costs)
    finally:
        offloaded = offload_of(adapter.model)
        if offloaded is not None:
            offloaded.release()  # its temporary files
    return report


def contribute_probe(job: ProbeJob, sharing: Sharing, progress: Progress | None = None) -> None:
    """A rank but 0 of a distributed probe: pass 1 over this rank's share of the data, its
    statistics sent to rank 0; then wait for rank 0 to finish."""
    from opsnn_quant.probe.api import statistics

    say = progress or (lambda m: None)
    records, adapter = _load(job, say, sharing)
    say("probe pass 1 over this rank's share of the calibration data")
    sharing.send(statistics(adapter, sharing.loop(adapter, records), job.config))
    sharing.done()


def _load(job: ProbeJob, say: Progress, sharing: Sharing | None) -> tuple[list[Any], ModelAdapter]:
    """The job's records and float model (and, shared, the ``ready`` meeting)."""
    from opsnn_quant.core.determinism import set_reproducible
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import check_records, load_records

    set_reproducible(seed=job.config.seed)
    say("loading the calibration data")
    records = load_records(job.data, job.limit, column=job.column, split=job.split)
    say(f"loading {job.source}")
    adapter = load_adapter(
        job.family, job.source, device=job.device, dtype=job.dtype,
        allow_pickle=job.allow_pickle, max_memory=job.max_memory, **job.settings,
    )  # fmt: skip
    # after the load, which says first when --family is not the model's; before any pass
    check_records(job.family, records, f"the calibration data {job.data}")
    if sharing is not None:
        sharing.ready(adapter, records)
    return records, adapter
