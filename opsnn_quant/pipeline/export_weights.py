"""``export-weights``: the model exports of a calibrate output, redone from its ``quant/``.

``-f ascendv1`` writes ``OUT/export/ascendv1/`` (AscendV1 weights for vLLM-Ascend / SGLang);
``-f mindie-sd`` ``OUT/export/mindie-sd/`` (per component, what ``mindiesd.quantize`` loads);
``-f atc`` ``OUT/export/atc/`` (ONNX graphs + ATC/AOE commands): what ``calibrate`` writes,
through the same handlers (:mod:`opsnn_quant.pipeline.model_exports`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.calibrate_output import CalibrateOutput
from opsnn_quant.types import Progress


@dataclass(frozen=True)
class ExportWeightsJob:
    """An ``export-weights`` run, checked before any model loads.

    Attributes:
        out: the calibrate output.
        export_dir: where the exports go (default ``OUT/export``).
        formats: the model export formats, in the order given.
        data: the data one call per root is recorded on (None: no calls).
        limit: records of ``data`` to use.
        force: replace outputs that are not ours.
        allow_pickle: the float model may have pickle weights only.
    """

    out: Path
    export_dir: Path
    formats: list[str]
    data: str | None
    limit: int
    force: bool
    allow_pickle: bool


def check_export_weights(
    out: Path,
    formats: list[str] | None,
    dest: Path | None = None,
    *,
    data: str | None = None,
    limit: int = 1,
    force: bool = False,
    allow_pickle: bool = False,
) -> ExportWeightsJob:
    """Every option checked before a model loads: the formats (model exports of the exporter
    table), the calibrate output, the data the exports need, the output locations.

    Raises:
        ConfigError: an unknown format, not a calibrate output, or ``data`` missing where a
            format reads one call per root (ATC's graphs, AscendV1's SmoothQuant folding).
        OutputError: an output that must not be replaced.
    """
    from opsnn_quant.core.user_config import check_limit
    from opsnn_quant.formats.checkpoint import read_description
    from opsnn_quant.formats.registry import exporters
    from opsnn_quant.models import check_weights
    from opsnn_quant.output.directories import check_output_dir
    from opsnn_quant.output.loose import check_output_file
    from opsnn_quant.pipeline.model_exports import notes_file
    from opsnn_quant.sources import local_paths, resolve_source

    check_limit(limit)
    model_formats = [e.name for e in exporters("model")]
    wanted = list(dict.fromkeys(formats or model_formats[:1]))  # default: the table's first
    bad = [f for f in wanted if f not in model_formats]
    if bad:
        raise ConfigError(f"--format must be one of {', '.join(model_formats)}, got {bad[0]!r}")
    calib = CalibrateOutput(out)
    desc = read_description(calib.quant)  # a calibrate output, before any model loads
    if not calib.policy.is_file():
        raise ConfigError(f"{out} has no policy.yaml; give a calibrate output directory")
    smoothed = any(m.get("smoothquant_alpha") is not None for m in desc["modules"].values())
    need = [e.root_calls_for for e in exporters("model")
            if e.name in wanted and e.needs_root_calls(smoothed)]  # fmt: skip
    if data is None and need:
        why = " and ".join(need)
        raise ConfigError(f"{why} need one call per root: pass --data (e.g. the recipe's data)")
    source = resolve_source(str(desc.get("source_model") or ""))
    check_weights(source, allow_pickle=allow_pickle)
    export_dir = dest or calib.export
    read = calib.read_by_consumers()
    read += local_paths(source) if source.text else []
    read += local_paths(resolve_source(data)) if data is not None else []
    for f in wanted:
        check_output_dir(export_dir / f, f, force=force, inputs=read)
        path, kind = notes_file(export_dir, f)
        check_output_file(path, kind, force=force, inputs=read)
    return ExportWeightsJob(out, export_dir, wanted, data, limit, force, allow_pickle)


def run_export_weights(job: ExportWeightsJob, progress: Progress | None = None) -> list[str]:
    """Load the quantized model, record one call per root, write the exports; their notes.

    Holds the lock of ``job.out`` throughout (:func:`opsnn_quant.output.locks.output_lock`).

    Raises:
        OutputError: another run is writing ``job.out``.
    """
    from opsnn_quant.output.locks import output_lock

    with output_lock(job.out):  # a calibrate replacing OUT meanwhile would mix the two
        return _export_weights(job, progress)


def _export_weights(job: ExportWeightsJob, progress: Progress | None) -> list[str]:
    from opsnn_quant.formats.candidates import load_candidate
    from opsnn_quant.formats.registry import exporters
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.pipeline.model_exports import write_model_exports
    from opsnn_quant.policy.schema import PrecisionPolicy
    from opsnn_quant.recording import record_roots

    say = progress or (lambda m: None)
    records = load_records(job.data, job.limit) if job.data is not None else []
    say("loading the quantized model")
    adapter, report = load_candidate(job.out, allow_pickle=job.allow_pickle)
    if report is None:
        raise ConfigError(
            f"{job.out} has no probe.json (the module inventory); give a calibrate output"
        )
    policy = PrecisionPolicy.load(CalibrateOutput(job.out).policy)
    resolved = policy.resolved(report.inventory(), report.weight_shapes(), tied=report.tied())
    calls = {}
    if records:
        say("recording one call per root")
        calls = record_roots(adapter, adapter.forward_loop(records), 1).calls
    float_model = None
    reads_float = [e.name for e in exporters("model") if e.name in job.formats and e.float_model]
    if reads_float:
        say(f"loading the float model for {', '.join(reads_float)}")
        settings = getattr(adapter, "settings", None)  # the calibrated model's, not defaults
        ran_with = settings.model_dump() if settings is not None else {}
        float_model = load_adapter(
            None, adapter.model_id, allow_pickle=job.allow_pickle, **ran_with
        ).model
    return write_model_exports(
        adapter, resolved, calls, job.export_dir, job.formats,
        float_model=float_model, force=job.force, say=say,
    ).notes  # fmt: skip
