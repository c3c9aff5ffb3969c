"""``evaluate(baseline, candidate, suite)``: run both models on the same inputs and judge.

Thin orchestration of :mod:`opsnn_quant.evaluation.runner`: it loads the suite's data, applies
the suite's generation settings to both adapters, generates, measures quality, then the latency
figures :func:`~.gate.plan_latency` asks for (:mod:`.timing`), and assembles the
:class:`AcceptanceReport`. Backends are labelled on every figure: the fp32 baseline on CPU is
``cpu``; the quantized candidate on CPU is the exact Ascend reference (``cpu-reference``), not a
speed figure; latency is judged only on the policy target's own backend (:mod:`.gate`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from opsnn_quant.backends.devices import backend_label
from opsnn_quant.distributed import World, current_world, gather_in_order, gather_seconds
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.gate import check_latency_mode, plan_latency
from opsnn_quant.evaluation.registry import check_task, records_problem, task
from opsnn_quant.evaluation.report import AcceptanceReport
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.evaluation.tasks import TaskInputs
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.policy.targets import Target
from opsnn_quant.sources import Source, builtin_source
from opsnn_quant.types import Progress

if TYPE_CHECKING:
    import torch

    from opsnn_quant.evaluation.gate import LatencyPlan
    from opsnn_quant.evaluation.quality import QualityResult
    from opsnn_quant.evaluation.timing import LatencyFigures
    from opsnn_quant.probe.report import SensitivityReport

log = logging.getLogger(__name__)


def suite_records(suite: Suite, start: int = 0, count: int | None = None) -> list[dict[str, Any]]:
    """The suite's data records: its first ``samples`` by default, or ``count`` records from
    ``start`` (e.g. a slice after the suite's own samples, to tune on without touching them).

    Raises:
        ConfigError: the suite names no data, or its data ends before ``start + count``.
    """
    from opsnn_quant.models.data import load_records

    d = suite.data
    limit = d.samples if count is None else start + count
    if d.dataset is not None:
        source = builtin_source(f"{d.dataset}/{d.split}")
    elif d.folder is None:
        raise ConfigError(f"suite {suite.name}: data needs a dataset or a folder")
    else:
        folder = Path(d.folder)
        inputs_file = task(suite.task).inputs_file
        source = str(folder / inputs_file) if inputs_file else str(folder)
    records = load_records(source, limit)[start:]
    if count is not None and len(records) < count:
        raise ConfigError(
            f"suite {suite.name}: its data {source} has {start + len(records)} records, "
            f"fewer than the {start + count} needed for {count} from record {start}"
        )
    return records


@contextmanager
def generation_of(adapter: ModelAdapter, suite: Suite) -> Iterator[None]:
    """The suite's generation settings on ``adapter`` inside the block, its own restored after
    (a run that goes on with the model, e.g. calibrate's float model after its measured search,
    keeps its own batch size and decoding length)."""
    before = getattr(adapter, "settings", None)
    apply_generation(adapter, suite)
    try:
        yield
    finally:
        if before is not None:
            adapter.settings = before  # type: ignore[attr-defined]


def apply_generation(adapter: ModelAdapter, suite: Suite) -> None:
    """Give ``adapter`` the suite's generation settings (those its family has)."""
    g = suite.generation
    settings = getattr(adapter, "settings", None)
    if not isinstance(settings, BaseModel):
        return
    fields = set(type(settings).model_fields)
    wanted = {k: v for k, v in g.model_dump().items() if k in fields and v is not None}
    # Validated as a recipe's settings are: a suite cannot give a family a value it refuses.
    adapter.settings = type(settings).model_validate({**settings.model_dump(), **wanted})  # type: ignore[attr-defined]


def generation_settings(suite: Suite, family: str) -> dict[str, Any]:
    """The suite's generation values that ``family``'s settings have: what
    :func:`apply_generation` gives its models, and what they are loaded and checked with."""
    from opsnn_quant.models.family import find_family

    entry = find_family(family)
    fields = set(entry.settings.model_fields) if entry is not None else set()
    return {k: v for k, v in suite.generation.model_dump().items() if k in fields and v is not None}


def check_suite_fits(
    suite: Suite,
    source: Source,
    *,
    family: str | None = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Refuse, before any model loads, a suite whose generation settings the model at
    ``source`` cannot run: its values over ``settings`` (the model's own, e.g. a recipe's;
    None: the family's defaults), validated as a recipe's and checked against the model's
    config files (:func:`~opsnn_quant.models.settings.check_source_fits`: a Whisper
    ``max_new_tokens`` past its decoder's positions).

    Raises:
        ConfigError: a value the family refuses or the model cannot run, named with the suite.
    """
    from opsnn_quant.models import guess_family
    from opsnn_quant.models.settings import check_source_fits, settings_for

    family = family or guess_family(source)
    where = f"suite {suite.name}: generation."
    try:
        checked = settings_for(family, {**(settings or {}), **generation_settings(suite, family)})
    except ConfigError as exc:
        raise ConfigError(f"suite {suite.name}: generation: {exc}") from None
    check_source_fits(source, checked, where)


@dataclass
class _Generated:
    """Both models' outputs on the suite's inputs, their quality, and the latency workload."""

    quality: Any
    baseline: list[Any]
    candidate: list[Any]
    work: Callable[[ModelAdapter], Callable[[], Any]]
    items: int


def evaluate(
    baseline: ModelAdapter,
    candidate: ModelAdapter,
    suite: Suite,
    *,
    candidate_backend: str | None = None,
    policy: dict[str, Any] | None = None,
    sensitivity: SensitivityReport | None = None,
    progress: Progress | None = None,
    created: str | None = None,
    latency: str = "target",
    target: Target | None = None,
    baseline_backend: str | None = None,
    allow_pickle: bool = False,
    allow_broken_baseline: bool = False,
) -> AcceptanceReport:
    """Evaluate ``candidate`` against ``baseline`` with ``suite``.

    What to generate and how comes from the adapters (:meth:`ModelAdapter.evaluation_inputs`,
    :meth:`~ModelAdapter.generate`, :meth:`~ModelAdapter.stages`); the metrics from the suite's
    task, which must be the adapters' task.

    Args:
        baseline: The float model.
        candidate: The quantized (or cast) model.
        suite: What to generate, measure and judge.
        candidate_backend: Label of the candidate's figures; default for a model with int8
            modules ``npu`` on an NPU (torch_npu's kernels), else ``<device>-reference`` (the
            exact Ascend arithmetic, e.g. ``cpu-reference``); for a float model its device.
        policy: :func:`~opsnn_quant.policy.summary.policy_summary` of the candidate, shown in
            the report.
        sensitivity: The probe's :class:`~opsnn_quant.probe.report.SensitivityReport`.
        progress: Called with a short phrase as each phase starts.
        created: Report timestamp (default now; ``""`` for reproducible output).
        latency: ``target`` (default): time only the figure the suite's latency criteria
            read; ``all``: every measurement the suite configures (eager timing of both
            models, one profile each, stability run, ONNX Runtime figure); ``none``: nothing.
            See :func:`~.gate.plan_latency`.
        target: The deployment target latency is judged for (the candidate's policy's, as a
            command resolves it; None: unknown, so no latency criterion is judged).
        baseline_backend: Label of the baseline's eager timing (default: its device, ``cpu``).
        allow_pickle: Read a suite CLIP directory that has pickle weights only (with
            ``torch.load(weights_only=True)``); False: refused before anything is generated.
        allow_broken_baseline: A baseline whose outputs are mostly empty, flat or one token
            repeated, or of silent inputs, whose error rate is above 100 %, or with outputs
            computed from NaN (a broken or random float model; :data:`~.runner.OUTPUT_CHECKS`)
            is reported instead of failing the verdict. A candidate with outputs computed
            from NaN fails whatever this says.

    Returns:
        The :class:`AcceptanceReport`; the outputs of both models (images or transcripts, in
        input order) ride along in :attr:`AcceptanceReport.outputs` for the report's grids.

    Raises:
        ConfigError: ``latency`` is not none/target/all, or the suite's task is not the
            models' task.
        ModelLoadError: the suite's CLIP has pickle weights only and ``allow_pickle`` is False.
    """
    from opsnn_quant.evaluation.runner import build_report

    say = progress or (lambda m: log.info("%s", m))
    mode = check_latency_mode(latency)
    for adapter in (baseline, candidate):
        check_task(suite, adapter)
    backends = _Backends.of(baseline, candidate, baseline_backend, candidate_backend)
    for adapter in (baseline, candidate):
        apply_generation(adapter, suite)
    _check_clip_weights(suite, allow_pickle)
    records = suite_records(suite)
    times: dict[str, float] = {}
    gathered_before = gather_seconds()
    out = _generate(baseline, candidate, suite, records, say, times, allow_pickle=allow_pickle)
    notes: list[str] = []
    plan = plan_latency(
        suite, mode, target=target, baseline_backend=backends.baseline,
        candidate_backend=backends.candidate, onnx_possible=backends.int8,
    )  # fmt: skip
    figures = _time(plan, suite, baseline, candidate, out, records, backends, notes, say, times)
    report = build_report(
        suite,
        out.quality,
        baseline_latency=figures.baseline,
        candidate_latency=figures.candidate,
        quality_backend=backends.candidate,
        stages=figures.stages or None,
        top_modules=figures.top_modules or None,
        stability=figures.stability or None,
        onnxruntime=figures.onnxruntime,
        policy=policy,
        sensitivity=sensitivity,
        notes=notes,
        created=created,
        target=target,
        latency_plan=plan,
        allow_broken_baseline=allow_broken_baseline,
        baseline_backend=backends.baseline,
    )
    _stamp_run(report, times, gather_seconds() - gathered_before, candidate)
    return report.with_outputs(out.baseline, out.candidate)


BATCH_DEPENDENT_NOTE = (
    "float GEMMs in this process round by the batch's row count (MKL's strict reproducibility "
    "is not in effect: set MKL_CBWR=AUTO,STRICT, or call opsnn_quant.set_reproducible(), before "
    "the process's first matmul; the CLI does): an output may change with the batch it was "
    "generated in, so a rerun with another batch size or sample count may differ"
)


def output_conditions(adapter: ModelAdapter) -> dict[str, Any]:
    """What both models' outputs depend on beside their inputs (see
    ``ReportSchema.outputs_depend_on``): the batch size they were generated in (the suite's,
    applied to both models), the threads, the device, torch's CPU capability and version, and
    on a CPU whether a float GEMM's row is independent of the rows batched with it, batches
    padded to the CPU's floor of rows as the adapters pad them
    (:func:`~opsnn_quant.core.determinism.gemm_rows_invariant`)."""
    import torch

    settings = getattr(adapter, "settings", None)
    conditions: dict[str, Any] = {
        "batch_size": int(getattr(settings, "batch_size", None) or 1),
        "threads": torch.get_num_threads(),
        "device": adapter.device.type,
    }
    if adapter.device.type == "cpu":
        from opsnn_quant.core.determinism import gemm_rows_invariant

        conditions["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        conditions["float_gemm_rows_invariant"] = gemm_rows_invariant()
    conditions["torch"] = torch.__version__
    return conditions


def _stamp_run(
    report: AcceptanceReport, times: dict[str, float], gathered: float, adapter: ModelAdapter
) -> None:
    """The run's own lines: its phases' seconds and, distributed, the world and rank 0's time
    in collectives (sending, receiving and waiting for slower ranks); what the outputs depend
    on (:func:`output_conditions`), with a note where the process's GEMM rows are not
    invariant."""
    world = current_world()
    if world.distributed:
        times["gather (rank 0)"] = gathered
        report.world = world.describe()
    report.timings = {k: round(v, 3) for k, v in times.items()}
    report.outputs_depend_on = output_conditions(adapter)
    if report.outputs_depend_on.get("float_gemm_rows_invariant") is False:
        report.notes.append(BATCH_DEPENDENT_NOTE)


def rank_latency_notes(world: World, figures: LatencyFigures) -> list[str]:
    """In a distributed run, each rank's eager latency (every rank times its own device: a
    slow card shows) and the percentiles over every rank's samples; the criteria read rank 0's
    figures. One process: none."""
    if world.size == 1:
        return []
    from opsnn_quant.evaluation.latency import summarize_ms

    every = world.gather(lambda: [(world.rank, world.device, figures)])
    notes = []
    for label in ("baseline", "candidate"):
        results = [(r, d, res) for r, d, f in every if (res := getattr(f, label)) is not None]
        if not results:
            continue
        pooled = summarize_ms([x for _, _, res in results for x in res.samples_ms])
        per_rank = "; ".join(
            f"rank {r} ({d}) p50 {res.p50_ms:.1f} / p99 {res.p99_ms:.1f} ms"
            for r, d, res in results
        )
        notes.append(
            f"{label} latency over {world.size} ranks: p50 {pooled['p50_ms']:.1f} ms, "
            f"p99 {pooled['p99_ms']:.1f} ms; per rank: {per_rank}"
        )
    return notes


@dataclass(frozen=True)
class _Backends:
    """The labels of both models' figures, and whether the candidate holds int8 modules."""

    baseline: str
    candidate: str
    int8: bool

    @classmethod
    def of(
        cls,
        baseline: ModelAdapter,
        candidate: ModelAdapter,
        baseline_backend: str | None,
        candidate_backend: str | None,
    ) -> _Backends:
        from opsnn_quant.quant.modules import is_quant_module

        int8 = any(is_quant_module(m) for m in candidate.model.modules())
        if candidate_backend is None:
            # A float candidate (e.g. the model cast to fp16) runs plain PyTorch eager.
            device = candidate.device
            candidate_backend = backend_label(device) if int8 else device.type
        return cls(baseline_backend or baseline.device.type, candidate_backend, int8)


def _time(
    plan: LatencyPlan,
    suite: Suite,
    baseline: ModelAdapter,
    candidate: ModelAdapter,
    out: _Generated,
    records: list[dict[str, Any]],
    backends: _Backends,
    notes: list[str],
    say: Progress,
    times: dict[str, float],
) -> LatencyFigures:
    """The latency figures ``plan`` asks for (a note on what the CPU timings mean added, and
    in a distributed run each rank's figures); ``times`` gets the seconds spent."""
    from opsnn_quant.evaluation.ort_figure import onnx_speed
    from opsnn_quant.evaluation.timing import run_latency

    started = time.perf_counter()
    figures = run_latency(
        plan, suite, baseline, candidate, work=out.work, items=out.items,
        baseline_backend=backends.baseline, candidate_backend=backends.candidate,
        onnx=lambda: onnx_speed(candidate, records, suite, notes), say=say,
    )  # fmt: skip
    if figures.candidate is not None:
        notes.append(_timing_note(backends.int8, backends.baseline, backends.candidate))
    if plan.eager or plan.onnx or plan.profile or plan.stability:
        times["latency"] = time.perf_counter() - started
        notes += rank_latency_notes(current_world(), figures)
    return figures


def generate_outputs(adapter: ModelAdapter, suite: Suite, inputs: list[Any]) -> list[Any]:
    """``adapter``'s outputs on the suite's ``inputs``: one image per prompt and seed of the
    suite (seed ``s`` for the first prompt, ``s + i`` for the i-th), or one transcript per
    utterance. In a distributed run each rank generates its whole batches of the inputs (with
    the seeds the single process gives them) and every rank gets all outputs, in order."""
    world = current_world()
    settings = getattr(adapter, "settings", None)
    batch = int(getattr(settings, "batch_size", None) or 1)
    if not task(suite.task).seeded:
        return gather_in_order(world, inputs, batch, lambda part, _: list(adapter.generate(part)))
    out: list[Any] = []
    for seed in suite.seeds:
        run = partial(_generate_from, adapter, seed)
        out += gather_in_order(world, inputs, batch, run)
    return out


def _generate_from(adapter: ModelAdapter, seed: int, part: Sequence[Any], first: int) -> list[Any]:
    """``part`` of a seeded task's inputs starting at index ``first``: its seeds are ``seed +
    first + i``, as in one call on all inputs."""
    return list(adapter.generate(part, seed=seed + first))


@dataclass(frozen=True)
class QualityInputs(TaskInputs):
    """What the quality metrics of a suite read beside both models' outputs
    (:class:`~.tasks.TaskInputs`), loaded by the suite's task, and its quality figures."""

    @classmethod
    def load(
        cls, suite: Suite, adapter: ModelAdapter, records: list[dict[str, Any]],
        allow_pickle: bool = False,
    ) -> QualityInputs:  # fmt: skip
        """The suite's inputs for ``adapter``'s family, and what its task's metrics read
        beside the outputs, loaded once (:attr:`~.tasks.Task.prepare`: e.g. the CLIP).

        Raises:
            ConfigError: the records lack what a metric the suite bounds reads (e.g. a motion
                label, :func:`~.registry.records_problem`): refused before anything is
                generated.
        """
        problem = records_problem(suite, records)
        if problem:
            raise ConfigError(f"suite {suite.name}: {problem}")
        inputs = cls(suite, records, adapter.evaluation_inputs(records), [], None, None)
        prepared = task(suite.task).prepare(inputs, adapter, allow_pickle)
        return cls(**{f.name: getattr(prepared, f.name) for f in fields(prepared)})

    def quality(
        self,
        baseline: list[Any],
        candidate: list[Any],
        extracted: tuple[torch.Tensor, torch.Tensor] | None = None,
        confidence: float | None = None,
    ) -> QualityResult:
        """The suite's quality metrics of ``candidate``'s outputs against ``baseline``'s
        (``extracted``: both sets' FD features, when the ranks extracted them already;
        ``confidence``: with their paired bootstrap intervals at this level, by utterance or
        prompt, see :mod:`.intervals`)."""
        return task(self.suite.task).compare(self, baseline, candidate, extracted, confidence)

    def shared_features(
        self, world: World, baseline: list[Any], candidate: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Several ranks, an FD metric: both sets' features, each rank extracting its share
        (whole feature batches: the single process's batches, so the same bits) and every
        rank getting them all in order; None otherwise (rank 0 extracts them itself)."""
        if world.size == 1 or self.features is None:
            return None
        import torch

        from opsnn_quant.evaluation.fid import extract_features
        from opsnn_quant.evaluation.quality import FEATURE_BATCH, feature_module

        module = feature_module(self.features)

        def share() -> list[tuple[torch.Tensor, torch.Tensor]]:
            part = world.shard(len(baseline), FEATURE_BATCH)
            if not part:
                return []
            mine = [images[part.start : part.stop] for images in (baseline, candidate)]
            fb, fc = (extract_features(m, module, FEATURE_BATCH) for m in mine)
            return [(fb, fc)]

        parts = world.gather(share)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _generate(
    baseline: ModelAdapter,
    candidate: ModelAdapter,
    suite: Suite,
    records: list[dict[str, Any]],
    say: Progress,
    times: dict[str, float],
    *,
    allow_pickle: bool = False,
) -> _Generated:
    """Both models' outputs and the quality metrics; ``times`` gets each step's seconds."""
    t0 = time.perf_counter()
    metrics = current_world().agree(
        lambda: QualityInputs.load(suite, candidate, records, allow_pickle)
    )
    kind = task(suite.task)
    what = kind.doing.format(count=kind.outputs_of(len(metrics.inputs), len(suite.seeds)))
    say(f"{what} with the baseline (float)")
    baseline.nan_outputs = candidate.nan_outputs = 0
    t1 = time.perf_counter()
    base_out = generate_outputs(baseline, suite, metrics.inputs)
    say(f"{what} with the candidate")
    t2 = time.perf_counter()
    cand_out = generate_outputs(candidate, suite, metrics.inputs)
    say("quality metrics")
    t3 = time.perf_counter()
    # FD features: each rank its share; the metrics once, on rank 0, over every rank's outputs
    # and features (FD over all features, not a mean of ranks')
    world = current_world()
    extracted = metrics.shared_features(world, base_out, cand_out)
    level = suite.metrics.confidence
    quality = world.from_main(lambda: metrics.quality(base_out, cand_out, extracted, level))
    quality.measured.update(nan_shares(world, baseline, candidate, len(base_out)))
    times["baseline outputs"], times["candidate outputs"] = t2 - t1, t3 - t2
    times["quality metrics"] = (t1 - t0) + (time.perf_counter() - t3)  # with loading them
    batch = metrics.inputs[: suite.generation.batch_size]
    kwargs = {"seed": 0} if kind.seeded else {}
    return _Generated(quality, base_out, cand_out, _workload(batch, **kwargs), len(batch))


def nan_shares(
    world: World, baseline: ModelAdapter, candidate: ModelAdapter, outputs: int
) -> dict[str, float]:
    """The share of each model's ``outputs`` that generate computed from NaN
    (:attr:`~opsnn_quant.models.base.ModelAdapter.nan_outputs`, summed over the ranks, each of
    which generated its share): ``baseline_nan_share`` and ``candidate_nan_share``."""
    counts = world.gather(lambda: [(baseline.nan_outputs, candidate.nan_outputs)])
    base, cand = (sum(c[i] for c in counts) for i in (0, 1))
    n = max(outputs, 1)
    return {"baseline_nan_share": base / n, "candidate_nan_share": cand / n}


def _workload(batch: list[Any], **kwargs: Any) -> Callable[[ModelAdapter], Callable[[], Any]]:
    """What one latency measurement runs: ``generate`` on one batch of the suite's inputs."""

    def work(adapter: ModelAdapter) -> Callable[[], Any]:
        return partial(adapter.generate, batch, **kwargs)

    return work


def _check_clip_weights(suite: Suite, allow_pickle: bool) -> None:
    """Refuse a suite's local CLIP directory with pickle weights only before any generation
    (:func:`~opsnn_quant.core.hub.check_pickle_weights`; the zoo's CLIP is safetensors)."""
    name = suite.metrics.clip
    if name is None or not Path(name).is_dir():
        return
    from opsnn_quant.core.hub import check_pickle_weights

    check_pickle_weights(
        name,
        Path(name),
        [Path(name)],
        allow_pickle=allow_pickle,
        convert=f'python -c "from transformers import CLIPModel as M; '
        f"M.from_pretrained('{name}').save_pretrained('{name}')\"",
    )


def _timing_note(has_int8: bool, baseline_backend: str, candidate_backend: str) -> str:
    if has_int8:
        return (
            f"CPU timings: the fp32 baseline runs PyTorch eager ({baseline_backend}); the quantized "
            f"candidate runs the exact Ascend int8 reference ({candidate_backend}), which is not a "
            "deployment speed figure"
        )
    return (
        "CPU timings: baseline and candidate both run PyTorch eager (cpu); CPUs have no fast "
        "fp16 GEMM, so an fp16 candidate's CPU time says nothing about an NPU's"
    )
