"""Per-family run settings (recipe ``model.settings``), validated strictly: a typo or a wrong type
is an error that names the field, never a silently ignored key.

Kept free of torch so that recipes validate before any model library loads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opsnn_quant.errors import ConfigError


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SDSettings(_Settings):
    """Sampling settings of a diffusion pipeline, used for calibration and generation."""

    steps: int = Field(default=20, gt=0, description="denoising steps per image")
    guidance_scale: float = Field(default=5.0, ge=0.0, description="classifier-free guidance")
    batch_size: int = Field(default=8, gt=0, description="prompts per pipeline call")
    height: int | None = Field(default=None, gt=0, multiple_of=8, description="image height, px")
    width: int | None = Field(default=None, gt=0, multiple_of=8, description="image width, px")


class DiTSettings(_Settings):
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
    batch_size: int = Field(default=2, gt=0, description="prompts per pipeline call")
    # Every supported pipeline needs the size a multiple of VAE factor 8 x patch 2.
    height: int | None = Field(default=None, gt=0, multiple_of=16, description="height, px")
    width: int | None = Field(default=None, gt=0, multiple_of=16, description="width, px")
    max_sequence_length: int | None = Field(
        default=None, gt=0, description="T5 tokens per prompt; None: the pipeline's default"
    )
    num_frames: int | None = Field(
        default=None, gt=0, description="frames per video (text-to-video pipelines only)"
    )


class WhisperSettings(_Settings):
    """Decoding settings of a Whisper model, used for calibration and generation."""

    batch_size: int = Field(default=8, gt=0, description="utterances per generate call")
    max_new_tokens: int = Field(default=64, gt=0, description="tokens decoded per utterance")
    num_beams: int = Field(default=1, gt=0, description="beam width (1: greedy)")


SETTINGS: dict[str, type[_Settings]] = {
    "diffusers-sd": SDSettings,
    "whisper": WhisperSettings,
    "diffusers-dit": DiTSettings,
}


def settings_for(family: str, values: dict[str, Any]) -> _Settings:
    """The validated settings of ``family`` (a function's form of the recipe check).

    Raises:
        ConfigError: an unknown family, an unknown field or a wrong value (named).
    """
    cls = SETTINGS.get(family)
    if cls is None:
        raise ConfigError(f"unknown model family {family!r}; known: {', '.join(SETTINGS)}")
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{family} settings: {where}: {err['msg']}") from exc
