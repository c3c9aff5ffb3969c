"""``evaluate``: what the candidate directory is, its float baseline, and the acceptance report.

:func:`check_evaluate` resolves and checks every option before a model loads (the candidate's
kind, its float source, the suite, the target, the output location); :func:`run_evaluate`
loads both models, runs :func:`opsnn_quant.evaluation.evaluate.evaluate` and writes the report.
The candidate may be our calibrate output (float source + ``quant/``), an AscendV1 directory
(ours or msModelSlim's, :mod:`opsnn_quant.formats.ascendv1.candidate`) or a model source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.pipeline.outputs import CalibrateOutput, DirectoryKind, classify
from opsnn_quant.types import Progress

if TYPE_CHECKING:
    import torch

    from opsnn_quant.evaluation.report import AcceptanceReport
    from opsnn_quant.evaluation.suite import Suite
    from opsnn_quant.policy.targets import Target
    from opsnn_quant.probe.report import SensitivityReport

CANDIDATE_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class EvaluateJob:
    """An ``evaluate`` run, resolved and checked before any model loads.

    Attributes:
        candidate: the candidate directory or model source.
        kind: what ``candidate`` is.
        source: the float model it is compared with (and, for AscendV1, loaded into).
        suite: the acceptance suite.
        out: the report directory.
        target: ``--target`` (None: the candidate's policy's, if any).
        device, dtype: where and in which dtype both models load.
        candidate_dtype: ``float16`` casts the candidate's float modules.
        latency: what to time (``none``, ``target``, ``all``).
        allow_pickle: pickle-only weights may be read (``weights_only``).
        force: replace ``out`` even when it is not a report.
        allow_broken_baseline: a broken float baseline is reported, not failed.
    """

    candidate: Path
    kind: DirectoryKind
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
    from opsnn_quant.evaluation.gate import check_latency_mode
    from opsnn_quant.evaluation.render import OUTPUT_KIND
    from opsnn_quant.evaluation.suite import load_suite, suite_inputs
    from opsnn_quant.io import check_output_dir
    from opsnn_quant.models import check_weights
    from opsnn_quant.policy.targets import get_target
    from opsnn_quant.sources import local_paths

    if candidate_dtype not in CANDIDATE_DTYPES:
        raise ConfigError(f"--candidate-dtype must be float32 or float16, got {candidate_dtype!r}")
    check_latency_mode(latency)
    resolve_device(device)
    resolve_dtype(dtype)
    resolved_target = get_target(target) if target is not None else None
    loaded = load_suite(suite)
    kind = classify(candidate)
    source = float_source(candidate, baseline, kind)
    inputs = [*candidate_inputs(candidate), *suite_inputs(suite)]
    inputs += [str(p) for p in local_paths(source)]
    check_weights(source, allow_pickle=allow_pickle)
    check_output_dir(out, OUTPUT_KIND, force=force, inputs=inputs)
    return EvaluateJob(
        candidate, kind, source, loaded, out, resolved_target, device, dtype, candidate_dtype,
        latency, allow_pickle, force, allow_broken_baseline,
    )  # fmt: skip


def run_evaluate(job: EvaluateJob, progress: Progress | None = None) -> AcceptanceReport:
    """Load the candidate and its float baseline, evaluate, write ``report.{json,md,html}``."""
    import torch

    from opsnn_quant.backends.devices import resolve_device
    from opsnn_quant.distributed import current_world
    from opsnn_quant.evaluation.evaluate import evaluate
    from opsnn_quant.models import load_adapter

    say = progress or (lambda m: None)
    say("loading models")
    engine_dir = job.kind in (DirectoryKind.ASCENDV1, DirectoryKind.MINDIE_SD)
    world = current_world()
    cand, sensitivity = world.agree(lambda: load_candidate(
        job.candidate, device=job.device, dtype=job.dtype,
        baseline=job.source if engine_dir else None, allow_pickle=job.allow_pickle,
    ))  # fmt: skip
    if job.candidate_dtype == "float16":
        cast_adapter(cand, torch.float16)
    base = world.agree(lambda: load_adapter(
        None, job.source, device=job.device, dtype=job.dtype, allow_pickle=job.allow_pickle
    ))  # fmt: skip
    report = evaluate(
        base,
        cand,
        job.suite,
        policy=candidate_policy(job.candidate, job.kind),
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
        report.save(job.out, force=job.force)
    return report


def float_source(candidate: Path, baseline: str | None, kind: DirectoryKind) -> str:
    """The float model the candidate is compared with (and, for AscendV1, loaded into).

    Raises:
        ConfigError: an AscendV1 directory without a known float model (pass ``baseline``).
        AscendV1Error: an AscendV1 directory that breaks the format's contract.
    """
    from opsnn_quant.formats.ascendv1.candidate import check_ascendv1_candidate, recorded_source
    from opsnn_quant.formats.checkpoint import read_description

    if kind is DirectoryKind.ASCENDV1:
        check_ascendv1_candidate(candidate)  # whole (every header, every tensor) before output
        source = baseline or recorded_source(candidate)
        if not source:
            raise ConfigError(
                f"{candidate} is an AscendV1 directory: pass --baseline, the float model "
                "it was quantized from"
            )
        return str(source)
    if kind is DirectoryKind.CALIBRATE_OUTPUT:
        return str(
            baseline or read_description(CalibrateOutput(candidate).quant).get("source_model")
        )
    if kind is DirectoryKind.MINDIE_SD:
        from opsnn_quant.formats.mindie_sd.reader import component_descriptions, read_mindie_sd

        for desc in component_descriptions(candidate).values():  # every file check, up front
            read_mindie_sd(desc)
        holder = CalibrateOutput.holding(candidate)
        recorded = read_description(holder.quant).get("source_model") if holder else None
        if not (baseline or recorded):
            raise ConfigError(
                f"{candidate} is a MindIE-SD directory: pass --baseline, the float model it was "
                "quantized from"
            )
        return str(baseline or recorded)
    return baseline or str(candidate)


def candidate_policy(candidate: Path, kind: DirectoryKind) -> dict[str, Any] | None:
    """The :func:`~opsnn_quant.policy.summary.policy_summary` of the candidate's policy: a
    calibrate output's, or that of the calibrate output our AscendV1 export sits in (its
    ``OUT/export/ascendv1``); None when there is none."""
    from opsnn_quant.policy.schema import PrecisionPolicy
    from opsnn_quant.policy.summary import policy_summary

    engine_dir = kind in (DirectoryKind.ASCENDV1, DirectoryKind.MINDIE_SD)
    holder = CalibrateOutput.holding(candidate) if engine_dir else None
    path = (holder or CalibrateOutput(candidate)).policy
    return policy_summary(PrecisionPolicy.load(path)) if path.is_file() else None


def load_candidate(
    out_dir: Path,
    family: str | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    baseline: str | None = None,
    allow_pickle: bool = False,
) -> tuple[ModelAdapter, SensitivityReport | None]:
    """The candidate: a calibrate output directory (float source + ``quant/``), a MindIE-SD
    directory (``export/mindie-sd``: each component through MindIE-SD's consumer, the pipeline
    in the engine's dtype: :func:`engine_dtype`), an
    AscendV1 directory (ours or msModelSlim's: :mod:`opsnn_quant.formats.ascendv1.candidate`), or a model
    source.

    A model source (``zoo:<name>`` or a model directory without ``quant/``) is loaded as is,
    e.g. to evaluate the float model cast to fp16. An AscendV1 directory is loaded into the float
    ``baseline`` (default: the source our export recorded), its quantized Linears running the
    engines' arithmetic. ``allow_pickle``: the float model may have pickle weights only (see
    :func:`~opsnn_quant.models.load_adapter`).

    Raises:
        ConfigError: an AscendV1 directory without a known float model (pass ``baseline``).
        AscendV1Error: an AscendV1 directory that breaks the format's contract.
        ModelLoadError: a float model that cannot be loaded (pickle-only weights without
            ``allow_pickle`` included).
    """
    from opsnn_quant.formats.ascendv1.candidate import load_ascendv1_candidate, recorded_source
    from opsnn_quant.formats.checkpoint import load_quantized, read_description
    from opsnn_quant.models import load_adapter
    from opsnn_quant.probe.report import SensitivityReport

    kind = classify(out_dir)
    dtype = engine_dtype(out_dir, kind, dtype)
    placement: dict[str, Any] = {"device": device, "dtype": dtype, "allow_pickle": allow_pickle}
    if kind is DirectoryKind.MINDIE_SD:
        import torch

        from opsnn_quant.formats.mindie_sd.reader import apply_mindie_sd_dir

        source = baseline or float_source(out_dir, None, kind)
        adapter = load_adapter(family, source, **placement)
        # mindiesd.quantize per component, in the dtype the pipeline runs
        apply_mindie_sd_dir(adapter.model, out_dir, dtype=getattr(torch, dtype))
        return adapter, None
    if kind is DirectoryKind.ASCENDV1:
        recorded = baseline or recorded_source(out_dir)
        if not recorded:
            raise ConfigError(
                f"{out_dir} is an AscendV1 directory: pass --baseline, the float model it was "
                "quantized from"
            )
        return load_ascendv1_candidate(out_dir, recorded, family, **placement), None
    if kind is DirectoryKind.MODEL:
        return load_adapter(family, str(out_dir), **placement), None
    calib = CalibrateOutput(out_dir)
    source = str(read_description(calib.quant).get("source_model") or "")
    if not source:
        raise ConfigError(f"{calib.quant}/description.json names no source model")
    adapter = load_adapter(family, source, **placement)
    load_quantized(adapter.model, calib.quant)
    sensitivity = SensitivityReport.load(calib.probe) if calib.probe.is_file() else None
    return adapter, sensitivity


def engine_dtype(candidate: Path, kind: DirectoryKind, dtype: str) -> str:
    """The dtype the candidate's pipeline runs in: ``dtype``, except where the engine that runs
    the candidate has a dtype of its own. MindIE-SD runs its Linears in ``float16`` or
    ``bfloat16`` and returns that dtype (mindiesd 3.1.0 ``quantization/layer.py`` 347-363,
    ``QuantConfig.dtype`` default bfloat16), so its whole pipeline runs so: a MindIE-SD
    directory, and a calibrate output for a MindIE-SD target, are judged in ``dtype`` when it is
    one of those, else in bfloat16."""
    if kind is DirectoryKind.CALIBRATE_OUTPUT:
        from opsnn_quant.policy.schema import PrecisionPolicy
        from opsnn_quant.policy.targets import get_target

        path = CalibrateOutput(candidate).policy
        target = get_target(PrecisionPolicy.load(path).target) if path.is_file() else None
        return run_dtype(target, dtype)
    return run_dtype("mindie-sd", dtype) if kind is DirectoryKind.MINDIE_SD else dtype


def run_dtype(target: Target | str | None, dtype: str) -> str:
    """The dtype a pipeline whose int8 modules ``target``'s engine runs (or the engine named)
    runs in: ``dtype``, or for MindIE-SD ``dtype`` when it is float16/bfloat16, else bfloat16
    (see :func:`engine_dtype`)."""
    engine = target if isinstance(target, str) or target is None else target.engine
    if engine != "mindie-sd" or dtype in ("float16", "bfloat16"):
        return dtype
    return "bfloat16"


def candidate_inputs(candidate: Path) -> list[str]:
    """The paths evaluating ``candidate`` reads (as :func:`load_candidate` and
    :func:`candidate_policy` do): of a calibrate output its ``quant/``, ``probe.json`` and
    ``policy.yaml``, so that a report may go beside them; otherwise the directory itself."""
    kind = classify(candidate)
    if kind in (DirectoryKind.ASCENDV1, DirectoryKind.MINDIE_SD):
        # ours sits in OUT/export/<fmt>, beside OUT's policy (and quant/: the float source)
        holder = CalibrateOutput.holding(candidate)
        extra = [str(holder.policy), str(holder.quant)] if holder else []
        return [str(candidate), *extra]
    if kind is DirectoryKind.CALIBRATE_OUTPUT:
        return [str(p) for p in CalibrateOutput(candidate).read_by_consumers()]
    return [str(candidate)]


def cast_adapter(adapter: ModelAdapter, dtype: torch.dtype) -> None:
    """Run the adapter's float modules in ``dtype`` (int8 buffers of quantized modules stay)."""
    from opsnn_quant.quant.modules import is_quant_module

    for module in adapter.model.modules():
        if is_quant_module(module):
            continue
        for _name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_floating_point():
                module._buffers[name] = b.to(dtype)
