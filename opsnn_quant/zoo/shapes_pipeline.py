"""The shapes text-to-image model: a small diffusers ``StableDiffusionPipeline``.

Parts (all channel counts multiples of 32 so that Ascend int8 matmuls apply):

- ``vae``: ``AutoencoderKL``, 32×32 RGB <-> 8×8×4 latents, blocks (32, 64, 64).
- ``unet``: ``UNet2DConditionModel`` on 8×8×4 latents, CrossAttn down/up blocks (64, 64),
  cross-attention dim 128, epsilon prediction.
- ``text_encoder``: ``CLIPTextModel`` (hidden 128, 3 layers), the frozen text tower of the
  shapes CLIP (:mod:`opsnn_quant.zoo.shapes_clip`), with the shared shapes tokenizer.
- ``scheduler``: ``DDIMScheduler`` (linear betas 1e-4..0.02, 1000 training steps).

Trained by ``python -m opsnn_quant.zoo.training.train_shapes``; weights live in ``weights/shapes-t2i``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from opsnn_quant.errors import ModelLoadError

if TYPE_CHECKING:
    import numpy as np
    from diffusers import StableDiffusionPipeline

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights" / "shapes-t2i"
LATENT_SIZE = 8
NUM_TRAIN_TIMESTEPS = 1000


def vae_config() -> dict[str, Any]:
    """``AutoencoderKL`` config: three levels, so 32×32 pixels map to 8×8 latents."""
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ["DownEncoderBlock2D"] * 3,
        "up_block_types": ["UpDecoderBlock2D"] * 3,
        "block_out_channels": [32, 64, 64],
        "layers_per_block": 1,
        "latent_channels": 4,
        "norm_num_groups": 32,
        "sample_size": 32,
    }


def unet_config() -> dict[str, Any]:
    """``UNet2DConditionModel`` config (heads of width 32 at both levels)."""
    return {
        "sample_size": LATENT_SIZE,
        "in_channels": 4,
        "out_channels": 4,
        "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
        "block_out_channels": [64, 64],
        "layers_per_block": 1,
        "cross_attention_dim": 128,
        # diffusers reads attention_head_dim as the number of heads here: 64 / 2 = 32 per head.
        "attention_head_dim": [2, 2],
        "norm_num_groups": 32,
    }


def scheduler_config() -> dict[str, Any]:
    """Noise schedule shared by training (DDPM) and sampling (DDIM).

    Linear betas reach alpha_bar ~ 4e-5 at the last step, so training ends close to the pure
    noise that sampling starts from; with 8×8 latents SD's milder schedule leaves the
    low-frequency layout visible at t=999.
    """
    return {
        "num_train_timesteps": NUM_TRAIN_TIMESTEPS,
        "beta_start": 0.0001,
        "beta_end": 0.02,
        "beta_schedule": "linear",
        "prediction_type": "epsilon",
        "clip_sample": False,
        "set_alpha_to_one": False,
        "steps_offset": 1,
        "timestep_spacing": "leading",
    }


def diffusers_dtype_kw() -> str:
    """The dtype keyword of ``from_pretrained`` in the installed diffusers."""
    try:
        import diffusers.utils.deprecation_utils as dep

        # diffusers renamed torch_dtype to dtype (0.36+); older releases only know torch_dtype.
        return "dtype" if hasattr(dep, "_resolve_dtype") else "torch_dtype"
    except ImportError:
        return "torch_dtype"


def load_shapes_t2i(
    torch_dtype: torch.dtype = torch.float32, path: str | Path | None = None
) -> StableDiffusionPipeline:
    """Load the shapes text-to-image pipeline offline.

    Args:
        torch_dtype: Dtype of every component.
        path: Pipeline directory; defaults to the committed ``weights/shapes-t2i``.

    Returns:
        A ``StableDiffusionPipeline`` without safety checker, generating 32×32 images.

    Raises:
        ModelLoadError: The directory is missing or incomplete.
    """
    from diffusers import StableDiffusionPipeline

    directory = Path(path) if path is not None else WEIGHTS_DIR
    return load_zoo_pipeline(
        StableDiffusionPipeline, directory, "shapes-t2i",
        "run python -m opsnn_quant.zoo.training.train_shapes all", torch_dtype,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip


def load_zoo_pipeline(
    cls: Any, directory: Path, name: str, how: str, torch_dtype: torch.dtype, **kwargs: Any
) -> Any:
    """A zoo diffusers pipeline of class ``cls`` from ``directory``, offline, quietly (the
    per-component progress bar is noise for a model of a few MB), its progress bar off.

    Raises:
        ModelLoadError: the directory holds no pipeline (``how`` says how to make one), or
            diffusers cannot load it.
    """
    from diffusers.utils import logging as dlogging

    if not (directory / "model_index.json").is_file():
        raise ModelLoadError(f"no {name} pipeline at {directory}; {how}")
    verbosity = dlogging.get_verbosity()
    dlogging.set_verbosity_error()
    try:
        pipe = cls.from_pretrained(
            str(directory), **{diffusers_dtype_kw(): torch_dtype}, local_files_only=True, **kwargs
        )
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load {name} from {directory}: {err}") from err
    finally:
        dlogging.set_verbosity(verbosity)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(
    pipe: Any,
    prompts: list[str],
    seed: int = 0,
    num_inference_steps: int = 20,
    guidance_scale: float = 5.0,
    batch_size: int = 64,
    denoiser: str = "unet",
    **pipe_kwargs: Any,
) -> np.ndarray:
    """Generate one image per prompt, reproducibly.

    Args:
        pipe: A pipeline from :func:`load_shapes_t2i` (or a quantized copy of one; or the
            shapes-dit pipeline, see :func:`opsnn_quant.zoo.shapes_dit.generate`).
        prompts: Captions.
        seed: Seed of the initial latents (one generator for the whole call).
        num_inference_steps: Scheduler steps.
        guidance_scale: Classifier-free guidance scale.
        batch_size: Prompts per pipeline call.
        denoiser: The pipeline's denoiser component (its config and dtype shape the latents).
        **pipe_kwargs: Further pipeline arguments.

    Returns:
        uint8 array ``[len(prompts), 32, 32, 3]``.
    """
    import numpy as np

    generator = torch.Generator("cpu").manual_seed(seed)
    out = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        # Latents drawn on CPU and moved, so the images do not depend on the device's RNG.
        model = getattr(pipe, denoiser)
        shape = (len(chunk), model.config.in_channels, LATENT_SIZE, LATENT_SIZE)
        latents = torch.randn(shape, generator=generator, dtype=torch.float32)
        latents = latents.to(device=pipe.device, dtype=model.dtype)
        with torch.no_grad():
            images = pipe(
                chunk,
                num_inference_steps=num_inference_steps,
                guidance_scale=guidance_scale,
                latents=latents,
                output_type="np",
                **pipe_kwargs,
            ).images
        out.append(np.clip(np.rint(images * 255.0), 0, 255).astype(np.uint8))
    return np.concatenate(out, axis=0)


def weights_dir() -> Path:
    """The committed pipeline directory.

    Raises:
        ModelLoadError: It holds no pipeline (the weights were not trained or not shipped).
    """
    if not (WEIGHTS_DIR / "model_index.json").is_file():
        raise ModelLoadError(
            f"no shapes-t2i pipeline at {WEIGHTS_DIR}; run python -m opsnn_quant.zoo.training.train_shapes all"
        )
    return WEIGHTS_DIR
