"""``diffusers-sd`` adapter: Stable-Diffusion-like diffusers pipelines (SD 1.x/2.x, SDXL, the zoo).

Names modules by the pipeline's own component names (``text_encoder.*``, ``unet.*``, ``vae.*``):
text encoders -> ``text_encoder``, UNet -> ``denoiser``, VAE decoder -> ``image_decoder``, VAE
encoder -> ``other`` (text-to-image never runs it). The forward loop runs the real sampling loop
(steps, guidance) over calibration prompts, so every timestep's activations are seen.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from opsnn_quant import progress
from opsnn_quant.errors import MissingDependencyError, ModelLoadError
from opsnn_quant.hub import quiet_progress_bars, set_offline_env
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.data import batched, prompts_from
from opsnn_quant.models.settings import SDSettings
from opsnn_quant.sources import model_path
from opsnn_quant.types import ForwardLoop, Modality

log = logging.getLogger(__name__)

COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae")


class PipelineModule(nn.Module):
    """The pipeline's modules as children, so ``named_modules`` gives ``unet.down_blocks...``.

    The pipeline itself (not an ``nn.Module``) stays reachable as ``.pipe``; both share the same
    component objects, so quantizing this module quantizes the pipeline.
    """

    def __init__(self, pipe: Any) -> None:
        super().__init__()
        for name in COMPONENTS:
            component = getattr(pipe, name, None)
            if isinstance(component, nn.Module):
                self.add_module(name, component)
        object.__setattr__(self, "pipe", pipe)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the whole pipeline (``pipe(*args, **kwargs)``)."""
        return self.__dict__["pipe"](*args, **kwargs)


def load_pipeline(source: str, torch_dtype: torch.dtype = torch.float32) -> Any:
    """A diffusers pipeline from ``zoo:<name>`` or a local diffusers directory (offline)."""
    try:
        import diffusers
    except ImportError as exc:
        raise MissingDependencyError(
            "diffusers is not installed: pip install 'opsnn-quant[models]'"
        ) from exc
    diffusers.utils.logging.disable_progress_bar()
    path = model_path(source)
    if not (path / "model_index.json").is_file() and (path / "config.json").is_file():
        raise ModelLoadError(
            f"{source} is a transformers model, not a diffusers pipeline; check the family"
        )
    if not (path / "model_index.json").is_file():
        raise ModelLoadError(
            f"{source} is not a diffusers pipeline directory (no model_index.json)"
        )
    set_offline_env()
    quiet_progress_bars()
    try:
        pipe = diffusers.DiffusionPipeline.from_pretrained(
            str(path), dtype=torch_dtype, local_files_only=True, safety_checker=None
        )
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(
            f"cannot load the pipeline in {source}: {str(exc).splitlines()[0]}"
        ) from exc
    return pipe


class DiffusersSDAdapter(ModelAdapter):
    """Adapter for a loaded Stable-Diffusion-like pipeline."""

    family = "diffusers-sd"
    task = "t2i"

    def __init__(self, pipe: Any, model_id: str, settings: SDSettings | None = None) -> None:
        self.pipe = pipe
        self.model = PipelineModule(pipe)
        self.model_id = model_id
        self.settings = settings or SDSettings()
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)
        if "unet" not in dict(self.model.named_children()):
            raise ModelLoadError(f"{model_id} has no unet: not a Stable-Diffusion-like pipeline")

    @classmethod
    def load(
        cls, source: str, settings: SDSettings | None = None, dtype: torch.dtype = torch.float32
    ) -> DiffusersSDAdapter:
        """Load from ``zoo:<name>`` or a diffusers directory, in ``dtype``."""
        return cls(load_pipeline(source, dtype), source, settings)

    def place(self, device: torch.device) -> None:
        """Move the whole pipeline (its components and execution device)."""
        self.pipe.to(device)

    def modalities(self) -> dict[str, Modality]:
        """text encoders, UNet, VAE decoder (+ post_quant_conv), VAE encoder as other."""
        children = dict(self.model.named_children())
        out: dict[str, Modality] = {}
        for name in ("text_encoder", "text_encoder_2"):
            if name in children:
                out[name] = Modality.TEXT_ENCODER
        out["unet"] = Modality.DENOISER
        if "vae" in children:
            out["vae"] = Modality.OTHER
            vae_children = dict(children["vae"].named_children())
            for sub in ("decoder", "post_quant_conv"):
                if sub in vae_children:
                    out[f"vae.{sub}"] = Modality.IMAGE_DECODER
        return out

    def roots(self) -> dict[str, Modality]:
        """UNet noise prediction, VAE decoder image, each text encoder's hidden states."""
        children = dict(self.model.named_children())
        out = {"unet": Modality.DENOISER}
        if "vae" in children:
            out["vae.decoder"] = Modality.IMAGE_DECODER
        for name in ("text_encoder", "text_encoder_2"):
            if name in children:
                out[name] = Modality.TEXT_ENCODER
        return out

    def evaluation_inputs(self, records: Sequence[Any]) -> list[Any]:
        """The prompts of the records."""
        return list(prompts_from(records))

    def stages(self) -> dict[str, str]:
        """Text encoding, one denoising step, VAE decoding."""
        return {"text_encoder": "text_encoder", "denoise_step": "unet", "vae_decode": "vae.decoder"}

    def primary_modality(self) -> Modality:
        """The denoiser (it runs every step)."""
        return Modality.DENOISER

    def describe_output(self, modality: Modality) -> str:
        """Words for the root outputs."""
        return {
            Modality.DENOISER: "UNet noise prediction",
            Modality.IMAGE_DECODER: "VAE decoder image",
            Modality.TEXT_ENCODER: "text encoder hidden states",
        }.get(modality, "")

    def _call(self, prompts: Sequence[str], seed: int) -> np.ndarray:
        s = self.settings
        generators = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
        kwargs: dict[str, Any] = {
            "prompt": list(prompts),
            "num_inference_steps": s.steps,
            "guidance_scale": s.guidance_scale,
            "generator": generators,
            "output_type": "np",
        }
        if s.height:
            kwargs["height"] = s.height
        if s.width:
            kwargs["width"] = s.width
        with torch.no_grad():
            out = self.pipe(**kwargs)
        return np.asarray(out.images)

    def forward_loop(self, data: Sequence[Any], limit: int | None = None) -> ForwardLoop:
        """Sample images for the calibration prompts (batches of ``settings.batch_size``)."""
        prompts = prompts_from(data)[:limit] if limit else prompts_from(data)

        def loop(model: nn.Module) -> None:
            batches = batched(prompts, self.settings.batch_size)
            for i, batch in enumerate(progress.iterate(batches, "batch")):
                self._call(batch, seed=10_000 + i * len(batch))

        return loop

    def generate(self, inputs: Sequence[Any], seed: int = 0) -> list[np.ndarray]:
        """uint8 HxWx3 images, one per prompt; prompt i uses seed ``seed + i``."""
        prompts = prompts_from(inputs)
        images: list[np.ndarray] = []
        starts = range(0, len(prompts), self.settings.batch_size)
        for start in progress.iterate(starts, "batch"):
            batch = prompts[start : start + self.settings.batch_size]
            arr = self._call(batch, seed + start)
            images.extend((np.clip(arr, 0, 1) * 255).round().astype(np.uint8))
        return images
