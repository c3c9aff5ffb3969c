"""The schema of an acceptance suite's YAML file: its sections and their own checks.

What the task and metric tables say of a suite (its task is one of theirs, its thresholds bound
metrics of that task, with what those need) is :class:`~.suite.Suite`'s check
(:mod:`.suite`): the tables' entries read a suite through this schema, below them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.core.user_config import MAX_SAMPLES, Seed, StrictModel
from opsnn_quant.evaluation.intervals import DEFAULT_CONFIDENCE
from opsnn_quant.evaluation.text_norm import TextNorm, normalizer_for

SCHEMA_VERSION = 1


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
        height, width: Image size (t2i, t2v); None: the pipeline's default.
        num_frames: Frames of each video (t2v); None: the model's settings (a recipe's), else
            the pipeline's default (Wan: 81).
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
    num_frames: int | None = Field(default=None, ge=1)
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
        video_features: the video encoder KVD is taken in (t2v): a zoo model name
            (``shapes-video-encoder``) or a local directory (:mod:`.video_features`).
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
    video_features: str | None = None
    thresholds: Thresholds = Field(default_factory=Thresholds)
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


class SuiteSpec(StrictModel):
    """An acceptance suite's sections (one YAML file in ``evaluate/``), each checked on its
    own; :class:`~.suite.Suite` checks them against the task and metric tables."""

    schema_version: int = SCHEMA_VERSION
    name: str
    task: str
    description: str = ""
    data: DataSpec
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1)
    generation: GenerationSpec = GenerationSpec()
    metrics: MetricsSpec = MetricsSpec()
    latency: LatencySpec = LatencySpec()

    @model_validator(mode="after")
    def _version(self) -> SuiteSpec:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is not supported (expected {SCHEMA_VERSION})"
            )
        return self

    def text_norm(self) -> TextNorm:
        """How a speech suite's transcripts are normalised before their errors are counted
        (its ``generation.language``'s normaliser)."""
        return normalizer_for(self.generation.language)
