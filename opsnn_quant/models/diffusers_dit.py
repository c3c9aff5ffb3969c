"""``diffusers-dit`` adapter: diffusers pipelines whose denoiser is a ``transformer``.

Supported: ``StableDiffusion3Pipeline`` (SD3Transformer2DModel, MMDiT; text encoders CLIP-L,
CLIP-G, T5), ``FluxPipeline`` (FluxTransformer2DModel; CLIP + T5; guidance embedding),
``PixArtAlphaPipeline`` / ``PixArtSigmaPipeline`` (PixArtTransformer2DModel; T5) and
``WanPipeline`` (WanTransformer3DModel; UMT5; text to video).

Modules keep the pipeline's names: ``text_encoder``, ``text_encoder_2``, ``text_encoder_3`` are
each a root of the ``text_encoder`` modality, ``transformer`` (and Wan 2.2's ``transformer_2``)
of ``denoiser``, ``vae.decoder`` of ``image_decoder``. The forward loop runs the pipeline's own
sampling loop (its scheduler: flow-matching Euler for SD3/FLUX, DPM-Solver for PixArt, UniPC for
Wan) over the calibration prompts; the sampling code is shared with ``diffusers-sd``
(:class:`~opsnn_quant.models.diffusers_base.DiffusersAdapter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from opsnn_quant.errors import ConfigError, ModelLoadError
from opsnn_quant.models.diffusers_base import (
    DiffusersAdapter,
    index_components,
    load_pipeline,
    pipeline_index,
)
from opsnn_quant.models.settings import DiTSettings
from opsnn_quant.types import Modality

COMPONENTS = (
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "transformer",
    "transformer_2",
    "vae",
)
# The latent sizes (transformer sample_size) PixArt's aspect-ratio bins exist for (256/512/1024
# px checkpoints, Sigma also 2048); the pipeline refuses binning for any other.
PIXART_BINNED_SIZES = {
    "PixArtAlphaPipeline": (32, 64, 128),
    "PixArtSigmaPipeline": (32, 64, 128, 256),
}


@dataclass(frozen=True)
class PipelineSpec:
    """What the adapter knows of one pipeline class.

    Attributes:
        task: ``t2i`` or ``t2v``.
        prediction: what the transformer predicts (words for reports).
        keep_float: submodules of each transformer that must stay floating point, mapped to
            ``other`` (no root, so no end-to-end estimate, so the policy never makes them
            int8). Wan's time embedding reads the dtype of its first parameter on every call
            (``WanTimeTextImageEmbedding.forward``), and a frozen int8 Linear holds its weight
            as a buffer: with both Linears int8 it has no parameter left and the call fails.
            It runs on one [batch, 256] vector per step: keeping it float costs nothing.
    """

    task: str
    prediction: str
    keep_float: tuple[str, ...] = ()


PIPELINES: dict[str, PipelineSpec] = {
    "StableDiffusion3Pipeline": PipelineSpec("t2i", "velocity"),
    "FluxPipeline": PipelineSpec("t2i", "velocity"),
    "PixArtAlphaPipeline": PipelineSpec("t2i", "noise"),
    "PixArtSigmaPipeline": PipelineSpec("t2i", "noise"),
    "WanPipeline": PipelineSpec("t2v", "velocity", ("condition_embedder.time_embedder",)),
}


def pipeline_spec(source: str, index: dict[str, Any]) -> tuple[str, PipelineSpec]:
    """The class name and spec of a pipeline from its ``model_index.json``.

    Raises:
        ModelLoadError: a UNet pipeline (the ``diffusers-sd`` family) or a class this family
            does not support (named, with the supported ones).
    """
    cls = str(index.get("_class_name", "?"))
    components = index_components(index)
    if "unet" in components and "transformer" not in components:
        raise ModelLoadError(
            f"{source} is a {cls} whose denoiser is a UNet, not a transformer: "
            "use family diffusers-sd"
        )
    return cls, _spec_of(source, cls)


def _spec_of(source: str, cls: str) -> PipelineSpec:
    spec = PIPELINES.get(cls)
    if spec is None:
        raise ModelLoadError(
            f"{source} is a {cls}, which the diffusers-dit family does not support; "
            f"supported: {', '.join(sorted(PIPELINES))}"
        )
    return spec


def _check_settings(source: str, cls: str, spec: PipelineSpec, settings: DiTSettings) -> None:
    if settings.num_frames is not None and spec.task != "t2v":
        raise ConfigError(
            f"diffusers-dit settings: num_frames applies to video pipelines only, and {source} "
            f"is a {cls} (text to image)"
        )


class DiffusersDiTAdapter(DiffusersAdapter):
    """Adapter for a loaded text-to-image transformer-denoiser pipeline."""

    family = "diffusers-dit"
    task = "t2i"
    components = COMPONENTS
    text_encoders = ("text_encoder", "text_encoder_2", "text_encoder_3")
    denoisers = ("transformer", "transformer_2")
    settings: DiTSettings

    def __init__(self, pipe: Any, model_id: str, settings: DiTSettings | None = None) -> None:
        super().__init__(pipe, model_id, settings or DiTSettings())
        self.pipeline_class = type(pipe).__name__
        spec = _spec_of(model_id, self.pipeline_class)
        if spec.task != self.task:
            raise ModelLoadError(
                f"{model_id} is a {spec.task} pipeline: build it with DiffusersDiTVideoAdapter "
                "(DiffusersDiTAdapter.load picks the class)"
            )
        self.spec = spec
        _check_settings(model_id, self.pipeline_class, spec, self.settings)
        if "transformer" not in self.children():
            raise ModelLoadError(f"{model_id} has no transformer: not a diffusers-dit pipeline")
        names = {n for n, _ in self.model.named_modules()}
        self._keep_float = [
            f"{d}.{sub}" for d in self.denoisers for sub in spec.keep_float if f"{d}.{sub}" in names
        ]

    @classmethod
    def load(
        cls,
        source: str,
        settings: DiTSettings | None = None,
        dtype: torch.dtype = torch.float32,
        *,
        allow_pickle: bool = False,
        skeletons: list[Any] | None = None,
    ) -> DiffusersDiTAdapter:
        """Load from ``zoo:<name>`` or a diffusers directory, in ``dtype``; a video pipeline
        comes back as a :class:`DiffusersDiTVideoAdapter`. Safetensors only unless
        ``allow_pickle`` (see :func:`~opsnn_quant.models.diffusers_base.load_pipeline`, which
        also says what ``skeletons`` does).

        Raises:
            ModelLoadError: not a supported transformer-denoiser pipeline, or pickle-only
                weights (said before any weight loads).
            ConfigError: a setting the pipeline does not take.
        """
        _, index = pipeline_index(source)
        cls_name, spec = pipeline_spec(source, index)
        if settings is not None:  # before the weights load (minutes for a real checkpoint)
            _check_settings(source, cls_name, spec, settings)
        adapter_cls = DiffusersDiTVideoAdapter if spec.task == "t2v" else DiffusersDiTAdapter
        # safety_checker: none to turn off
        pipe = load_pipeline(
            source, dtype, safety_checker_off=False, allow_pickle=allow_pickle, skeletons=skeletons
        )
        return adapter_cls(pipe, source, settings)

    def extra_call_kwargs(self) -> dict[str, Any]:
        """``max_sequence_length`` when set; PixArt: raw captions and, where the checkpoint
        has bins, its aspect-ratio binning."""
        out: dict[str, Any] = {}
        if self.settings.max_sequence_length is not None:
            out["max_sequence_length"] = self.settings.max_sequence_length
        if self.pipeline_class in PIXART_BINNED_SIZES:
            # Caption cleaning runs only where bs4 and ftfy are installed: the same recipe
            # would calibrate on different text from one host to the next.
            out["clean_caption"] = False
            sample_size = self.pipe.transformer.config.sample_size
            out["use_resolution_binning"] = sample_size in PIXART_BINNED_SIZES[self.pipeline_class]
        return out

    def modalities(self) -> dict[str, Modality]:
        """The shared ones, with the spec's ``keep_float`` submodules as ``other``."""
        out = super().modalities()
        out.update(dict.fromkeys(self._keep_float, Modality.OTHER))
        return out

    def stages(self) -> dict[str, str]:
        """Each text encoder, one denoising step (per transformer), VAE decoding."""
        children = self.children()
        out = {name: name for name in self.text_encoders if name in children}
        out["denoise_step"] = "transformer"
        if "transformer_2" in children:
            out["denoise_step_2"] = "transformer_2"
        out["vae_decode"] = "vae.decoder"
        return out

    def describe_output(self, modality: Modality) -> str:
        """Words for the root outputs."""
        return {
            Modality.DENOISER: f"transformer {self.spec.prediction} prediction",
            Modality.IMAGE_DECODER: "VAE decoder image",
            Modality.TEXT_ENCODER: "text encoder hidden states",
        }.get(modality, "")


class DiffusersDiTVideoAdapter(DiffusersDiTAdapter):
    """Adapter for a text-to-video transformer pipeline (Wan): :meth:`generate` gives uint8
    FxHxWx3 frames per prompt."""

    task = "t2v"
    output_field = "frames"

    def extra_call_kwargs(self) -> dict[str, Any]:
        """The shared ones plus ``num_frames`` when set."""
        out = super().extra_call_kwargs()
        if self.settings.num_frames is not None:
            out["num_frames"] = self.settings.num_frames
        return out

    def describe_output(self, modality: Modality) -> str:
        """Words for the root outputs (the VAE decodes one latent frame per call)."""
        if modality == Modality.IMAGE_DECODER:
            return "VAE decoder frames"
        return super().describe_output(modality)
