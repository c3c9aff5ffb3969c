"""``diffusers-sd`` adapter: Stable-Diffusion-like diffusers pipelines (SD 1.x/2.x, SDXL, the zoo).

Names modules by the pipeline's own component names (``text_encoder.*``, ``unet.*``, ``vae.*``):
text encoders -> ``text_encoder``, UNet -> ``denoiser``, VAE decoder -> ``image_decoder``, VAE
encoder -> ``other`` (text-to-image never runs it). The forward loop runs the real sampling loop
(steps, guidance) over calibration prompts, so every timestep's activations are seen. The shared
machinery is :mod:`opsnn_quant.models.diffusers_base`; transformer-denoiser pipelines (SD3, FLUX,
PixArt, Wan) are the ``diffusers-dit`` family.
"""

from __future__ import annotations

from typing import Any

import torch

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.models.diffusers_base import (
    DiffusersAdapter,
    PipelineModule,
    index_components,
    load_pipeline,
    pipeline_index,
)
from opsnn_quant.models.settings import SDSettings
from opsnn_quant.types import Modality

COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae")

__all__ = ["COMPONENTS", "DiffusersSDAdapter", "PipelineModule", "load_pipeline"]


class DiffusersSDAdapter(DiffusersAdapter):
    """Adapter for a loaded Stable-Diffusion-like pipeline."""

    family = "diffusers-sd"
    task = "t2i"
    components = COMPONENTS
    text_encoders = ("text_encoder", "text_encoder_2")
    denoisers = ("unet",)
    settings: SDSettings

    def __init__(self, pipe: object, model_id: str, settings: SDSettings | None = None) -> None:
        super().__init__(pipe, model_id, settings or SDSettings())
        if "unet" not in self.children():
            raise ModelLoadError(f"{model_id} has no unet: not a Stable-Diffusion-like pipeline")

    @classmethod
    def load(
        cls,
        source: str,
        settings: SDSettings | None = None,
        dtype: torch.dtype = torch.float32,
        *,
        allow_pickle: bool = False,
        skeletons: list[Any] | None = None,
    ) -> DiffusersSDAdapter:
        """Load from ``zoo:<name>`` or a diffusers directory, in ``dtype`` (safetensors only
        unless ``allow_pickle``: see :func:`~opsnn_quant.models.diffusers_base.load_pipeline`,
        which also says what ``skeletons`` does).

        Raises:
            ModelLoadError: not a diffusers pipeline, one whose denoiser is a transformer
                (the ``diffusers-dit`` family), or pickle-only weights, said before any weight
                loads.
        """
        _, index = pipeline_index(source)
        if "unet" not in index_components(index) and "transformer" in index_components(index):
            raise ModelLoadError(
                f"{source} is a {index.get('_class_name', 'diffusers pipeline')} whose denoiser "
                "is a transformer, not a UNet: use family diffusers-dit"
            )
        pipe = load_pipeline(source, dtype, allow_pickle=allow_pickle, skeletons=skeletons)
        return cls(pipe, source, settings)

    def stages(self) -> dict[str, str]:
        """Text encoding, one denoising step, VAE decoding."""
        return {"text_encoder": "text_encoder", "denoise_step": "unet", "vae_decode": "vae.decoder"}

    def describe_output(self, modality: Modality) -> str:
        """Words for the root outputs."""
        return {
            Modality.DENOISER: "UNet noise prediction",
            Modality.IMAGE_DECODER: "VAE decoder image",
            Modality.TEXT_ENCODER: "text encoder hidden states",
        }.get(modality, "")
