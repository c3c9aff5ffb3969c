"""Acceptance suites: what to generate, what to measure, and the thresholds a candidate must meet.

A suite is a YAML file validated by :class:`Suite` (``evaluate/*.yaml``). Thresholds, all
optional, compare the candidate (quantized) model with the baseline (fp32) model run on the
same data, prompts and seeds:

==========================  ===============================================================
``fid_vs_baseline_max``     FID/FD between candidate and baseline image sets  <= value
``fid_delta_max``           FID(candidate, reference) - FID(baseline, reference) <= value
                            (needs ``data.reference``)
``kid_delta_max``           KID(candidate, reference) - KID(baseline, reference) <= value,
                            in the FD's features (needs ``data.reference``; :mod:`.kid`)
``clip_score_delta_min``    CLIP score candidate - baseline >= value (e.g. -0.5)
``psnr_min``                median per-pair PSNR, dB >= value
``ssim_min``                mean per-pair SSIM >= value
``wer_delta_max_points``    (WER candidate - WER baseline) x 100 <= value
``cer_delta_max_points``    (CER candidate - CER baseline) x 100 <= value
``agreement_wer_max_points``  WER of candidate vs baseline transcripts x 100 <= value
``agreement_cer_max_points``  CER of candidate vs baseline transcripts x 100 <= value
==========================  ===============================================================

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
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from opsnn_quant.core.readers import read_text
from opsnn_quant.core.resources import builtin_dir
from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.core.user_config import MAX_SAMPLES, Seed, StrictModel, yaml_error
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.text_norm import TextNorm, normalizer_for
from opsnn_quant.sources import is_named

SCHEMA_VERSION = 1
DEFAULT_CONFIDENCE = 0.95  # metrics.confidence: level of each quality figure's interval
SUITES_DIR = builtin_dir("suites")  # shipped in the package; the repository's evaluate/ points here

T2I_THRESHOLDS = frozenset(
    {
        "fid_vs_baseline_max",
        "fid_delta_max",
        "kid_delta_max",
        "clip_score_delta_min",
        "psnr_min",
        "ssim_min",
    }
)
ASR_THRESHOLDS = frozenset(
    {
        "wer_delta_max_points",
        "cer_delta_max_points",
        "agreement_wer_max_points",
        "agreement_cer_max_points",
    }
)
WORD_THRESHOLDS = frozenset({"wer_delta_max_points", "agreement_wer_max_points"})
SHARED_THRESHOLDS = frozenset({"latency_p99_ratio_max", "memory_ratio_max"})


class DataSpec(StrictModel):
    """Where the evaluation inputs come from: a zoo dataset split or a folder.

    Attributes:
        dataset: Zoo dataset name (``shapes``, ``speech``) or None when ``folder`` is given.
        split: Split of the zoo dataset.
        folder: A folder with ``prompts.txt`` (t2i) or audio files (``.wav``, ``.flac``, ``.mp3``,
            ``.ogg``, ``.opus``) + ``transcripts.tsv``
            or ``transcripts.txt`` (asr); relative paths resolve against the suite file.
        samples: How many prompts / utterances to evaluate (the first N).
        reference: Real images for FID against a reference set: ``"dataset"`` (the images of
            the same dataset split) or a folder of images (relative paths resolve against the
            suite file); None: no reference FID.
        tuning: The data a measured search tunes on when ``budget.metric`` names this suite
            and no data of its own: a data source (``zoo:<name>/<split>``, or a path relative
            to the suite file), read from its first record; None: this suite's data after its
            ``samples`` (a split with no records past them needs one).
    """

    dataset: str | None = None
    split: str = "eval"
    folder: Path | None = None
    samples: int = Field(default=64, ge=2, le=MAX_SAMPLES)
    reference: str | None = None
    tuning: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if (self.dataset is None) == (self.folder is None):
            raise ValueError("give exactly one of data.dataset or data.folder")
        return self


class GenerationSpec(StrictModel):
    """Generation settings shared by baseline and candidate.

    Attributes:
        steps: Denoising steps (t2i).
        guidance_scale: Classifier-free guidance scale (t2i).
        height, width: Image size (t2i); None: the pipeline's default.
        max_new_tokens: Decoder length limit (asr).
        num_beams: Beam size (asr); 1 is greedy.
        language: The spoken language (asr), a Whisper code: the models decode in it and the
            transcripts are normalised for it; None: English-only models (or detection).
        task: ``transcribe`` or ``translate`` (asr); None: transcribe.
        batch_size: Inputs per generation call.
    """

    steps: int = Field(default=20, ge=1)
    guidance_scale: float = Field(default=7.5, ge=0.0)
    height: int | None = Field(default=None, ge=8)
    width: int | None = Field(default=None, ge=8)
    max_new_tokens: int = Field(default=128, ge=1)
    num_beams: int = Field(default=1, ge=1)
    language: str | None = Field(default=None, pattern=r"^[a-z]{2,3}$")
    task: Literal["transcribe", "translate"] | None = None
    batch_size: int = Field(default=8, ge=1)


class MetricsSpec(StrictModel):
    """What to measure and the thresholds.

    Attributes:
        fid_features: ``inception`` (FID, TF-Inception) or ``clip`` (FD in the CLIP image space
            named by ``clip``; never called FID); KID is computed in the same features;
            None: no Fréchet distance, no KID.
        clip: CLIP for CLIP score / FD: a zoo model name (``shapes-clip``) or a local Hugging
            Face CLIP directory; None: no CLIP score.
        thresholds: Acceptance thresholds.
        confidence: Level of the paired bootstrap interval on each quality figure (by
            utterance or prompt, :mod:`.intervals`); a criterion passes when its whole
            interval meets the threshold, fails when none of it does, and is INCONCLUSIVE
            otherwise. Between 0.5 and 0.999.
    """

    fid_features: Literal["inception", "clip"] | None = "inception"
    clip: str | None = None
    thresholds: Thresholds = Thresholds()
    confidence: float = Field(default=DEFAULT_CONFIDENCE, ge=0.5, le=0.999)

    @model_validator(mode="after")
    def _clip_named(self) -> MetricsSpec:
        if self.fid_features == "clip" and self.clip is None:
            raise ValueError("fid_features 'clip' needs metrics.clip (a CLIP model name or dir)")
        return self


class LatencySpec(StrictModel):
    """Latency settings.

    Attributes:
        warmup: Untimed calls before timing.
        runs: Timed calls.
        stability_k: Consecutive calls of the stability run; 0 skips it.
        profile_top: Rows of the top-modules profile; 0 skips profiling.
        onnx_speed: Export the candidate's main root module (UNet / audio encoder) as ONNX QDQ
            and fp32 and time both with ONNX Runtime: the CPU speed figure
            (``cpu-onnxruntime``). The latency criteria read it unless the eager timing is on
            a judged backend; it is judged only for a ``cpu-reference`` target.
        enforce_backends: Narrows the backends whose latency/memory ratios are pass/fail
            criteria; None (the default): the policy target's own (:func:`.gate.judged_backends`).
            It never widens them: a backend that is not the target's is never judged.
            ``cpu-reference`` (the Ascend arithmetic emulated on a CPU) is never a speed figure.
    """

    warmup: int = Field(default=1, ge=0)
    runs: int = Field(default=5, ge=1)
    stability_k: int = Field(default=0, ge=0)
    profile_top: int = Field(default=10, ge=0)
    onnx_speed: bool = False
    enforce_backends: list[str] | None = None

    @model_validator(mode="after")
    def _k(self) -> LatencySpec:
        if self.stability_k == 1:
            raise ValueError("stability_k must be 0 (off) or at least 2")
        return self


class Suite(StrictModel):
    """An acceptance suite (one YAML file in ``evaluate/``)."""

    schema_version: int = SCHEMA_VERSION
    name: str
    task: Literal["t2i", "asr"]
    description: str = ""
    data: DataSpec
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1)
    generation: GenerationSpec = GenerationSpec()
    metrics: MetricsSpec = MetricsSpec()
    latency: LatencySpec = LatencySpec()

    @model_validator(mode="after")
    def _consistent(self) -> Suite:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is not supported (expected {SCHEMA_VERSION})"
            )
        allowed = (T2I_THRESHOLDS if self.task == "t2i" else ASR_THRESHOLDS) | SHARED_THRESHOLDS
        wrong = sorted(self.metrics.thresholds.set_names() - allowed)
        if wrong:
            raise ValueError(f"thresholds {wrong} do not apply to task {self.task!r}")
        t = self.metrics.thresholds
        for name in ("fid_delta_max", "kid_delta_max"):
            if getattr(t, name) is not None and self.data.reference is None:
                raise ValueError(f"metrics.thresholds.{name} needs data.reference (real images)")
        distribution = (t.fid_delta_max, t.fid_vs_baseline_max, t.kid_delta_max)
        if any(x is not None for x in distribution) and self.metrics.fid_features is None:
            raise ValueError("FID and KID thresholds need metrics.fid_features")
        if t.clip_score_delta_min is not None and self.metrics.clip is None:
            raise ValueError("clip_score_delta_min needs metrics.clip")
        if self.task == "asr" and self.data.reference is not None:
            raise ValueError("data.reference (reference images) applies to t2i suites only")
        words = sorted(WORD_THRESHOLDS & t.set_names())
        if words and not self.text_norm().words:
            raise ValueError(
                f"generation.language {self.generation.language} is written without spaces "
                f"between words, so it is judged by characters: {', '.join(words)} would count "
                "whole sentences; use cer_delta_max_points and agreement_cer_max_points"
            )
        return self

    def text_norm(self) -> TextNorm:
        """How a speech suite's transcripts are normalised before their errors are counted
        (its ``generation.language``'s normaliser)."""
        return normalizer_for(self.generation.language)


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
