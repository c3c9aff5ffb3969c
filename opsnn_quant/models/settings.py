"""The settings models of the built-in families (recipe ``model.settings``), validated strictly: a
typo or a wrong type is an error that names the field, never a silently ignored key. Each checks
itself against a model's config files (``check_fits``).

Kept free of torch so that recipes validate before any model library loads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from opsnn_quant.core.user_config import keys_hint
from opsnn_quant.errors import ConfigError
from opsnn_quant.models.family import FamilySettings, get_family
from opsnn_quant.sources import Source

log = logging.getLogger(__name__)


# Bounds of the counts no model file states. Each is far above what any supported pipeline or
# model is run with, and each refuses a typo before it reaches an allocation of its size (a
# batch, an image side, a frame count, a beam width multiply the tensors a call allocates).
MAX_BATCH = 1024
MAX_SIDE = 8192  # px: four times the largest native size of a supported pipeline (FLUX, 2048)
MAX_FRAMES = 1024  # Wan 2.1 generates 81
MAX_BEAMS = 64  # transformers keeps batch x beams sequences and their KV caches
# SD3's and FLUX's pipelines refuse more than 512 T5 tokens; Wan's umT5 takes 512, PixArt's T5
# 300 (Sigma) or 120 (alpha) by default.
MAX_SEQUENCE_LENGTH = 512


class SDSettings(FamilySettings):
    """Sampling settings of a diffusion pipeline, used for calibration and generation."""

    steps: int = Field(default=20, gt=0, description="denoising steps per image")
    guidance_scale: float = Field(default=5.0, ge=0.0, description="classifier-free guidance")
    batch_size: int = Field(default=8, gt=0, le=MAX_BATCH, description="prompts per pipeline call")
    height: int | None = Field(
        default=None, gt=0, le=MAX_SIDE, multiple_of=8, description="image height, px"
    )
    width: int | None = Field(
        default=None, gt=0, le=MAX_SIDE, multiple_of=8, description="image width, px"
    )

    def check_fits(self, model_dir: Path, where: str) -> None:
        """``steps`` up to the scheduler's ``num_train_timesteps`` (see :func:`check_fits`)."""
        _check_diffusion(model_dir, self, where)


class DiTSettings(FamilySettings):
    """Sampling settings of a transformer-denoiser pipeline (SD3, FLUX, PixArt, Wan).

    A field left None takes the pipeline's own default (``guidance_scale``: SD3 7.0, FLUX 3.5,
    PixArt 4.5, Wan 5.0; ``max_sequence_length``: SD3 256, FLUX 512, PixArt-alpha 120, PixArt-Sigma
    300, Wan 512; the size: the checkpoint's native one).
    """

    steps: int = Field(default=20, gt=0, description="denoising steps per sample")
    guidance_scale: float | None = Field(
        default=None,
        ge=0.0,
        description="classifier-free guidance (FLUX: the distilled guidance it embeds, no "
        "unconditional pass); None: the pipeline's default",
    )
    batch_size: int = Field(default=2, gt=0, le=MAX_BATCH, description="prompts per pipeline call")
    # Every supported pipeline needs the size a multiple of VAE factor 8 x patch 2.
    height: int | None = Field(
        default=None, gt=0, le=MAX_SIDE, multiple_of=16, description="height, px"
    )
    width: int | None = Field(
        default=None, gt=0, le=MAX_SIDE, multiple_of=16, description="width, px"
    )
    max_sequence_length: int | None = Field(
        default=None,
        gt=0,
        le=MAX_SEQUENCE_LENGTH,
        description="T5 tokens per prompt; None: the pipeline's default",
    )
    num_frames: int | None = Field(
        default=None,
        gt=0,
        le=MAX_FRAMES,
        description="frames per video (text-to-video pipelines only)",
    )

    def check_fits(self, model_dir: Path, where: str) -> None:
        """``steps`` up to the scheduler's ``num_train_timesteps``, the size up to an SD3
        transformer's ``pos_embed_max_size`` (see :func:`check_fits`)."""
        _check_diffusion(model_dir, self, where)


class WhisperSettings(FamilySettings):
    """Decoding settings of a Whisper model, used for calibration and generation."""

    batch_size: int = Field(
        default=8, gt=0, le=MAX_BATCH, description="utterances per generate call"
    )
    # Bounded by the model's max_target_positions: see check_fits.
    max_new_tokens: int = Field(default=64, gt=0, description="tokens decoded per utterance")
    num_beams: int = Field(default=1, gt=0, le=MAX_BEAMS, description="beam width (1: greedy)")
    # Checked against the checkpoint's generation_config.json (lang_to_id, task_to_id,
    # is_multilingual) by check_fits: a code the model has no token for is refused before it loads.
    language: str | None = Field(
        default=None,
        pattern=r"^[a-z]{2,3}$",
        description="spoken language, a Whisper code (en, zh, de, ...): a multilingual model "
        "decodes in it; None: it detects the language (an English-only model: en or None)",
    )
    task: Literal["transcribe", "translate"] | None = Field(
        default=None,
        description="transcribe (the spoken language) or translate (into English); None: "
        "transcribe",
    )

    def check_fits(self, model_dir: Path, where: str) -> None:
        """``language`` and ``task`` against ``generation_config.json``, ``max_new_tokens`` plus
        the decoder prompt up to ``config.json``'s ``max_target_positions`` (see
        :func:`check_fits`)."""
        generation = _json(model_dir / "generation_config.json")
        _check_language(model_dir, self, generation, where)
        config = _json(model_dir / "config.json")
        limit = (config or {}).get("max_target_positions")
        if not isinstance(limit, int):
            return
        prompt = whisper_prompt_tokens(generation)
        if self.max_new_tokens + prompt > limit:
            raise ConfigError(
                f"{where}max_new_tokens: {self.max_new_tokens} does not fit {model_dir}: "
                f"its decoder takes {limit} positions (config.json max_target_positions), "
                f"{prompt} of them the prompt; use at most {limit - prompt}"
            )


def settings_for(family: str, values: dict[str, Any]) -> FamilySettings:
    """The validated settings of ``family`` (a function's form of the recipe check).

    Raises:
        ConfigError: an unknown family, an unknown field or a wrong value (named).
    """
    cls = get_family(family).settings
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg += keys_hint(where, list(cls.model_fields), "the keys")
        raise ConfigError(f"{family} settings: {where}: {msg}") from exc


def parse_set_options(items: Iterable[str], option: str = "--set") -> dict[str, Any]:
    """``KEY=VALUE`` strings as settings, each value read as a YAML scalar (``32`` an int,
    ``7.5`` a float, ``true`` a bool, anything else a string), as a recipe would give it.

    Raises:
        ConfigError: an item without ``KEY=``, or a value that is not a YAML scalar.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{option} takes KEY=VALUE (e.g. max_new_tokens=32), got {item!r}")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{option} {key}: {text!r} is not a YAML scalar") from exc
        if isinstance(value, dict | list) or value is None:
            raise ConfigError(f"{option} {key}: {text!r} is not a single value")
        out[key] = value
    return out


def _json(path: Path) -> dict[str, Any] | None:
    """A JSON object file's contents; None when it is missing or not one (the loader says why)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def whisper_prompt_tokens(generation_config: dict[str, Any] | None) -> int:
    """Tokens transformers' Whisper ``generate`` puts before the first decoded one.

    ``<|startoftranscript|>``, then for a multilingual model the language and the task, then
    ``<|notimestamps|>`` when the model has that token (timestamps are never asked for here).
    """
    cfg = generation_config or {}
    multilingual = 2 if cfg.get("is_multilingual") else 0
    return 1 + multilingual + (1 if cfg.get("no_timestamps_token_id") is not None else 0)


def check_fits(model_dir: Path, settings: FamilySettings, where: str = "model.settings.") -> None:
    """Refuse settings that the model's own config files say it cannot run, before it loads
    (each family's settings model says how: its ``check_fits``).

    Reads JSON only: a diffusion pipeline's ``scheduler/scheduler_config.json`` (``steps`` up to
    its ``num_train_timesteps``), an SD3 transformer's ``pos_embed_max_size`` (the largest
    image), a Whisper model's ``config.json`` and ``generation_config.json`` (``max_new_tokens``
    plus the decoder prompt up to ``max_target_positions``). Files that are missing or not JSON
    are skipped: loading the model then says what is wrong with it.

    Args:
        model_dir: the model's local directory.
        settings: the validated settings of its family.
        where: what the message puts before a setting's name (``model.settings.``, ``--set ``).

    Raises:
        ConfigError: a setting beyond the model's limit, named with the limit and its file.
    """
    settings.check_fits(model_dir, where)


def whisper_is_multilingual(generation_config: dict[str, Any] | None) -> bool | None:
    """Whether a Whisper checkpoint is multilingual, from its ``generation_config.json``
    (``is_multilingual``, else whether it lists languages); None: the file does not say."""
    cfg = generation_config or {}
    if isinstance(cfg.get("is_multilingual"), bool):
        return bool(cfg["is_multilingual"])
    langs = cfg.get("lang_to_id")
    return len(langs) > 1 if isinstance(langs, dict) else None


def _check_language(
    model_dir: Path, settings: WhisperSettings, generation: dict[str, Any] | None, where: str
) -> None:
    """Refuse a ``language`` or ``task`` the checkpoint has no token for (transformers would
    refuse it at the first ``generate``, after the model loaded and the data was read)."""
    language, task = settings.language, settings.task
    if language is None and task is None:
        return
    file = f"{model_dir}/generation_config.json"
    multilingual = whisper_is_multilingual(generation)
    if multilingual is False:
        if language not in (None, "en"):
            raise ConfigError(
                f"{where}language: {language} is not English, and {model_dir} is an "
                f"English-only Whisper model ({file}: is_multilingual false); leave language "
                "out, give en, or use a multilingual checkpoint"
            )
        if task == "translate":
            raise ConfigError(
                f"{where}task: translate needs a multilingual Whisper model; {model_dir} is "
                f"English-only ({file}: is_multilingual false)"
            )
        return
    cfg = generation or {}
    langs = cfg.get("lang_to_id")
    if language is not None and isinstance(langs, dict) and f"<|{language}|>" not in langs:
        codes = sorted(str(k).strip("<|>") for k in langs)
        shown = ", ".join(codes[:20]) + (", ..." if len(codes) > 20 else "")
        raise ConfigError(
            f"{where}language: {language} is not one of the {len(codes)} languages of "
            f"{model_dir} ({file} lang_to_id: {shown})"
        )
    tasks = cfg.get("task_to_id")
    if task is not None and isinstance(tasks, dict) and task not in tasks:
        raise ConfigError(
            f"{where}task: {task} is not a task of {model_dir} ({file} task_to_id: "
            f"{', '.join(sorted(tasks))})"
        )


def _check_diffusion(model_dir: Path, settings: SDSettings | DiTSettings, where: str) -> None:
    scheduler = _json(model_dir / "scheduler" / "scheduler_config.json")
    trained = (scheduler or {}).get("num_train_timesteps")
    if isinstance(trained, int) and settings.steps > trained:
        raise ConfigError(
            f"{where}steps: {settings.steps} is more than the {trained} timesteps the scheduler "
            f"of {model_dir} was trained with (scheduler/scheduler_config.json "
            "num_train_timesteps)"
        )
    # SD3 crops a fixed grid of position embeddings: a larger image has no embedding.
    transformer = _json(model_dir / "transformer" / "config.json") or {}
    vae = _json(model_dir / "vae" / "config.json") or {}
    _check_frames(model_dir, vae, getattr(settings, "num_frames", None), where)
    grid, patch = transformer.get("pos_embed_max_size"), transformer.get("patch_size")
    blocks = vae.get("block_out_channels")
    if not (isinstance(grid, int) and isinstance(patch, int) and isinstance(blocks, list)):
        return
    scale = 2 ** (len(blocks) - 1)
    largest = grid * patch * scale
    for name in ("height", "width"):
        side = getattr(settings, name)
        if side is not None and side > largest:
            raise ConfigError(
                f"{where}{name}: {side} px is more than the transformer of {model_dir} has "
                f"position embeddings for: at most {largest} px (transformer/config.json "
                f"pos_embed_max_size {grid} x patch_size {patch} x the VAE's scale {scale})"
            )


def _check_frames(model_dir: Path, vae: dict[str, Any], frames: int | None, where: str) -> None:
    """A video VAE encodes the first frame alone, then ``scale_factor_temporal`` frames per
    latent frame: WanPipeline silently rounds any other count to the nearest fitting one (a
    calibration of other clips than asked for), so such a count is refused here."""
    factor = vae.get("scale_factor_temporal")
    if frames is None or not isinstance(factor, int) or factor < 1 or (frames - 1) % factor == 0:
        return
    below = (frames - 1) // factor * factor + 1
    raise ConfigError(
        f"{where}num_frames: {frames} frames do not fit the video VAE of {model_dir}: it takes "
        f"1 + {factor} x k frames (vae/config.json scale_factor_temporal {factor}), e.g. "
        f"{below} or {below + factor}"
    )


def check_source_fits(
    source: Source, settings: FamilySettings, where: str = "model.settings."
) -> None:
    """:func:`check_fits` on a model source (``zoo:<name>`` or a directory), before it loads.

    A source that does not resolve to a local directory is left to the loader to refuse.

    Raises:
        ConfigError: a setting beyond the model's limit.
    """
    path = source.path
    if path.is_dir():
        check_fits(path, settings, where)
