"""``evaluate``: what the candidate directory is, its float baseline, and the acceptance report.

:func:`check_evaluate` resolves and checks every option before a model loads (the candidate's
format, its float source, the suite, the target, the output location); :func:`run_evaluate`
loads both models, runs :func:`opsnn_quant.evaluation.evaluate.evaluate` and writes the report.
What the candidate is, and how it loads, is its format's (the format table, :mod:`opsnn_quant.formats.registry`):
our calibrate output, a MindIE-SD or AscendV1 directory (ours or msModelSlim's), or a model
source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.registry import Format, recognise
from opsnn_quant.types import Progress

if TYPE_CHECKING:
    from opsnn_quant.evaluation.report import AcceptanceReport
    from opsnn_quant.evaluation.suite import Suite
    from opsnn_quant.policy.schema import PrecisionPolicy
    from opsnn_quant.policy.targets import Target

CANDIDATE_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class EvaluateJob:
    """An ``evaluate`` run, resolved and checked before any model loads.

    Attributes:
        candidate: the candidate directory or model source.
        fmt: what ``candidate`` is (its format).
        source: the float model it is compared with (and, for AscendV1, loaded into).
        suite: the acceptance suite.
        out: the report directory.
        target: ``--target``, else the candidate's policy's (None: neither).
        device, dtype: where and in which dtype both models load.
        candidate_dtype: ``float16`` casts the candidate's float modules.
        latency: what to time (``none``, ``target``, ``all``).
        allow_pickle: pickle-only weights may be read (``weights_only``).
        force: replace ``out`` even when it is not a report.
        allow_broken_baseline: a broken float baseline is reported, not failed.
        settings: the suite's generation settings both models run with (those their family
            has): they load with them, so that their config files are checked at these values.
        policy: the candidate's policy, if it has one (read once, here; shown in the report).
    """

    candidate: Path
    fmt: Format
    source: str
    suite: Suite
    out: Path
    target: Target | None
    device: str
    dtype: str
    candidate_dtype: str
    latency: str
    allow_pickle: bool
    force: bool
    allow_broken_baseline: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    policy: PrecisionPolicy | None = None


def check_evaluate(
    candidate: Path,
    suite: str,
    out: Path,
    *,
    baseline: str | None = None,
    target: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    candidate_dtype: str = "float32",
    latency: str = "target",
    allow_pickle: bool = False,
    force: bool = False,
    allow_broken_baseline: bool = False,
) -> EvaluateJob:
    """Every option checked before a model loads; the output location last.

    Raises:
        ConfigError: a bad option, suite, target or candidate (an AscendV1 directory without a
            known float model, one that breaks the format's contract).
        ModelLoadError: pickle-only float weights without ``allow_pickle``.
        OutputError: ``out`` must not be replaced (or would replace an input).
    """
    from opsnn_quant.backends.devices import resolve_device, resolve_dtype
    from opsnn_quant.evaluation.evaluate import check_suite_fits, generation_settings
    from opsnn_quant.evaluation.gate import check_latency_mode
    from opsnn_quant.evaluation.render import OUTPUT_KIND
    from opsnn_quant.evaluation.suite import load_suite, suite_inputs
    from opsnn_quant.models import check_weights, guess_family
    from opsnn_quant.output.directories import check_output_dir
    from opsnn_quant.policy.schema import PrecisionPolicy
    from opsnn_quant.policy.targets import get_target
    from opsnn_quant.sources import local_paths, resolve_source

    if candidate_dtype not in CANDIDATE_DTYPES:
        raise ConfigError(f"--candidate-dtype must be float32 or float16, got {candidate_dtype!r}")
    check_latency_mode(latency)
    resolve_device(device)
    resolve_dtype(dtype)
    resolved_target = get_target(target) if target is not None else None
    loaded = load_suite(suite)
    fmt = recognise(candidate)
    source = fmt.float_source(candidate, baseline)
    model = resolve_source(source)
    inputs = [*fmt.inputs(candidate), *suite_inputs(loaded, suite)]
    inputs += [str(p) for p in local_paths(model)]
    check_weights(model, allow_pickle=allow_pickle)
    family = guess_family(model)
    # the suite's generation settings, not the family's defaults, against each model's configs
    own = fmt.own_model(candidate)  # a model of its own, loaded as it is
    for each in dict.fromkeys([source, *([own] if own is not None else [])]):
        check_suite_fits(loaded, model if each == source else resolve_source(each), family=family)
    policy_file = fmt.policy_file(candidate)
    policy = PrecisionPolicy.load(policy_file) if policy_file and policy_file.is_file() else None
    if resolved_target is None and policy is not None:
        resolved_target = policy.target_def  # latency is judged for the policy's target
    check_output_dir(out, OUTPUT_KIND, force=force, inputs=inputs)
    return EvaluateJob(
        candidate, fmt, source, loaded, out, resolved_target, device, dtype, candidate_dtype,
        latency, allow_pickle, force, allow_broken_baseline,
        generation_settings(loaded, family), policy,
    )  # fmt: skip


def run_evaluate(job: EvaluateJob, progress: Progress | None = None) -> AcceptanceReport:
    """Load the candidate and its float baseline, evaluate, write ``report.{json,md,html}``.

    The rank that writes holds the lock of ``job.out`` (and of the outputs it lies in:
    ``-o OUT/report``) throughout (:func:`opsnn_quant.output.locks.output_lock`).

    Raises:
        OutputError: another run writes ``job.out`` or an output it lies in.
    """
    from opsnn_quant.distributed import current_world
    from opsnn_quant.output.locks import output_lock

    if not current_world().is_main:
        return _run_evaluate(job, progress)
    with output_lock(job.out):  # a calibrate -o OUT meanwhile would swap the report away
        return _run_evaluate(job, progress)


def _run_evaluate(job: EvaluateJob, progress: Progress | None) -> AcceptanceReport:
    import torch

    from opsnn_quant.backends.devices import resolve_device
    from opsnn_quant.distributed import current_world
    from opsnn_quant.evaluation.evaluate import evaluate
    from opsnn_quant.evaluation.render import OUTPUT_KIND
    from opsnn_quant.formats.candidates import cast_adapter, load_candidate
    from opsnn_quant.models import load_adapter
    from opsnn_quant.output.directories import atomic_dir
    from opsnn_quant.policy.summary import policy_summary, report_rows

    say = progress or (lambda m: None)
    say("loading models")
    engine_dir = job.fmt.engine
    world = current_world()
    cand, sensitivity = world.agree(lambda: load_candidate(
        job.candidate, device=job.device, dtype=job.dtype,
        baseline=job.source if engine_dir else None, allow_pickle=job.allow_pickle, fmt=job.fmt,
        settings=job.settings,
    ))  # fmt: skip
    if job.candidate_dtype == "float16":
        cast_adapter(cand, torch.float16)
    base = world.agree(lambda: load_adapter(
        None, job.source, device=job.device, dtype=job.dtype, allow_pickle=job.allow_pickle,
        **job.settings,
    ))  # fmt: skip
    report = evaluate(
        base,
        cand,
        job.suite,
        policy=(
            policy_summary(job.policy, report_rows(job.policy, sensitivity))
            if job.policy is not None
            else None
        ),
        sensitivity=sensitivity,
        progress=say,
        latency=job.latency,
        target=job.target,
        # an engine's directory runs the engine's int8 arithmetic, not plain eager float
        candidate_backend=f"{resolve_device(job.device).type}-reference" if engine_dir else None,
        allow_pickle=job.allow_pickle,
        allow_broken_baseline=job.allow_broken_baseline,
    )
    if world.is_main:  # one writer; every rank holds the same report
        with atomic_dir(job.out, OUTPUT_KIND, force=job.force) as tmp:
            report.save(tmp)
    return report
