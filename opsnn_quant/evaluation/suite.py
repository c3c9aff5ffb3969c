"""Acceptance suites: what to generate, what to measure, and the thresholds a candidate must meet.

A suite is a YAML file validated by :class:`Suite` (``evaluate/*.yaml``). Its ``task`` is one
of the task table's (:mod:`.registry`: ``t2i``, ``t2v``, ``asr``, or a registered one).
Thresholds, all optional, compare the candidate (quantized) model with the baseline (fp32)
model run on the same data, prompts and seeds: each bounds one metric of the metric table
(:mod:`.metrics`), which says the tasks it applies to, its comparator, the values the bound may
take and what else the suite (or its records) must have for it. The built-in ones:

==========================  ===============================================================
``fid_vs_baseline_max``     FID/FD between candidate and baseline image sets  <= value
``fid_delta_max``           FID(candidate, reference) - FID(baseline, reference) <= value
                            (needs ``data.reference``)
``kid_delta_max``           KID(candidate, reference) - KID(baseline, reference) <= value,
                            in the FD's features (needs ``data.reference``; :mod:`.kid`)
``clip_score_delta_min``    CLIP score candidate - baseline >= value (e.g. -0.5)
``psnr_min``                median per-pair PSNR, dB >= value
``ssim_min``                mean per-pair SSIM >= value
``video_psnr_min``          t2v: median over videos of the mean per-frame PSNR, dB >= value
``video_ssim_min``          t2v: mean over videos of the mean per-frame SSIM >= value
``flicker_delta_max``       t2v: mean |frame t+1 - frame t| (grey levels), candidate -
                            baseline <= value
``temporal_psnr_min``       t2v: median PSNR of the candidate's frame differences vs the
                            baseline's, dB >= value
``clip_temp_delta_min``     t2v: CLIP-Temp (consecutive frames' cosine) candidate - baseline
                            >= value (``clip_score_delta_min`` applies too, over frames)
``motion_accuracy_delta_min``  t2v: motion found = the record's ``motion`` label, accuracy
                            candidate - baseline >= value (needs records with that label)
``wer_delta_max_points``    (WER candidate - WER baseline) x 100 <= value
``cer_delta_max_points``    (CER candidate - CER baseline) x 100 <= value
``agreement_wer_max_points``  WER of candidate vs baseline transcripts x 100 <= value
``agreement_cer_max_points``  CER of candidate vs baseline transcripts x 100 <= value
==========================  ===============================================================

A bound of a difference (candidate - baseline) that the float model itself fails is refused
(its own difference is 0): a ``_max`` of one is at least 0, a ``_min`` at most 0.

A speech suite's ``generation.language`` (a Whisper code) is the language the models decode
in and the one whose normaliser the transcripts go through before their errors are counted
(:func:`~.text_norm.normalizer_for`: English's for ``en`` or none). A language written without
spaces between words (Chinese, Japanese, Thai, ...) is judged by characters: its suite may set
only the CER thresholds (``cer_delta_max_points``, ``agreement_cer_max_points``).

==========================  ===============================================================
``latency_p99_ratio_max``   p99 candidate / p99 baseline <= value (judged only on the
                            policy target's own backend: ``npu`` for an Ascend target,
                            ``cpu-onnxruntime``/``cpu`` for ``cpu-reference``; reported as
                            NOT JUDGED elsewhere, see :mod:`.gate`)
``memory_ratio_max``        peak memory candidate / baseline <= value (same rule)
==========================  ===============================================================

Each quality figure but a Fréchet distance (KID included) has its paired bootstrap interval at
``metrics.confidence`` (0.95 by default): a criterion PASSES when the whole interval meets its
threshold, FAILS when none of it does, and is INCONCLUSIVE otherwise (more samples would
decide it). Quality criteria are judged wherever they are measured: the quantized candidate on a CPU runs
the bit-exact reference of the Ascend integer arithmetic (``cpu-reference``), so its outputs
are the NPU's.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError, field_validator, model_validator

from opsnn_quant.core.readers import read_text
from opsnn_quant.core.resources import builtin_dir
from opsnn_quant.core.user_config import yaml_error
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.registry import (
    requirements_problem,
    task,
    tasks,
    thresholds_problem,
)
from opsnn_quant.evaluation.suite_schema import (
    SCHEMA_VERSION,
    DataSpec,
    GenerationSpec,
    LatencySpec,
    MetricsSpec,
    SuiteSpec,
)
from opsnn_quant.sources import is_named

__all__ = [
    "SCHEMA_VERSION",
    "SUITES_DIR",
    "DataSpec",
    "GenerationSpec",
    "LatencySpec",
    "MetricsSpec",
    "Suite",
    "builtin_suites",
    "load_suite",
    "parse_suite",
    "suite_file",
    "suite_inputs",
]

SUITES_DIR = builtin_dir("suites")  # shipped in the package; the repository's evaluate/ points here


class Suite(SuiteSpec):
    """An acceptance suite (one YAML file in ``evaluate/``): its sections
    (:class:`~.suite_schema.SuiteSpec`) checked against the task and metric tables
    (:mod:`.registry`)."""

    @field_validator("task")
    @classmethod
    def _known_task(cls, name: str) -> str:
        known = [t.name for t in tasks()]
        if name not in known:
            raise ValueError(f"unknown task {name!r}; the tasks: {', '.join(known)}")
        return name

    @model_validator(mode="after")
    def _tables(self) -> Suite:
        problem = thresholds_problem(self.metrics.thresholds, "metrics.thresholds", self.task)
        problem = problem or requirements_problem(self)
        if problem:
            raise ValueError(problem)
        if self.data.reference is not None and not task(self.task).reference_images:
            kinds = ", ".join(t.name for t in tasks() if t.reference_images)
            raise ValueError(f"data.reference (reference images) applies to {kinds} suites only")
        return self


def _where(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def parse_suite(data: object, source: str = "<suite>") -> Suite:
    """Validate a suite from already-parsed YAML.

    Raises:
        ConfigError: The message names the file and the bad field.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a suite must be a YAML mapping")
    try:
        return Suite.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_where(err)}") from err


def load_suite(path_or_name: str | Path) -> Suite:
    """Load and validate a suite file, or a built-in suite by name (``shapes-t2i``).

    ``data.folder``, ``data.reference`` and ``data.tuning`` resolve against the suite file's
    directory.

    Raises:
        ConfigError: Missing file, bad YAML or a schema violation naming the field.
    """
    path = suite_file(path_or_name)
    try:
        data = yaml.safe_load(read_text(path))
    except yaml.YAMLError as err:
        raise yaml_error(path, err) from err
    suite = parse_suite(data, str(path))
    update: dict[str, object] = {}
    if suite.data.folder is not None and not suite.data.folder.is_absolute():
        update["folder"] = (path.parent / suite.data.folder).resolve()
    ref = suite.data.reference
    if ref is not None and ref != "dataset" and not Path(ref).is_absolute():
        update["reference"] = str((path.parent / ref).resolve())
    tuning = suite.data.tuning
    if tuning is not None and not is_named(tuning) and not Path(tuning).is_absolute():
        update["tuning"] = str((path.parent / tuning).resolve())
    if update:
        suite = suite.model_copy(update={"data": suite.data.model_copy(update=update)})
    return suite


def builtin_suites() -> list[str]:
    """Names of the built-in suites (``opsnn_quant/suites``, templates excluded)."""
    if not SUITES_DIR.is_dir():
        return []
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml") if not p.stem.endswith("-template"))


def suite_file(path_or_name: str | Path) -> Path:
    """The file of a suite path or built-in name (as :func:`load_suite` finds it).

    Raises:
        ConfigError: no such file or built-in suite.
    """
    path = Path(path_or_name)
    if not path.is_file() and not path.suffix and (SUITES_DIR / f"{path}.yaml").is_file():
        path = SUITES_DIR / f"{path}.yaml"
    if not path.is_file():
        known = ", ".join(builtin_suites()) or "none"
        raise ConfigError(f"suite {path_or_name} not found (built-in suites: {known})")
    return path


def suite_inputs(suite: Suite, path_or_name: str | Path) -> list[str]:
    """The local paths ``suite``, loaded from ``path_or_name``, reads (its file, data folder,
    reference images, tuning data): an output may not replace them.

    Raises:
        ConfigError: as :func:`suite_file`.
    """
    paths = [suite_file(path_or_name), suite.data.folder]
    if suite.data.reference not in (None, "dataset"):
        paths.append(Path(str(suite.data.reference)))
    if suite.data.tuning is not None and not is_named(suite.data.tuning):
        paths.append(Path(suite.data.tuning))
    return [str(p) for p in paths if p is not None]
