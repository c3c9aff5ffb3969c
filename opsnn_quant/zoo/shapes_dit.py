"""The shapes diffusion-transformer model: a small diffusers ``StableDiffusion3Pipeline``.

Parts (every Linear has K % 16 == 0 and N % 8 == 0, so Ascend int8 matmuls apply):

- ``transformer``: ``SD3Transformer2DModel`` (MMDiT) on 8×8×4 latents, patch 2 (16 image
  tokens), width 96 (3 heads of 32), 4 joint blocks, RMS q/k norm; rectified-flow velocity
  prediction.
- ``vae``: the shapes-t2i ``AutoencoderKL`` (same weights), with the latent ``shift_factor``
  and ``scaling_factor`` that SD3's pipeline expects measured on the training images.
- ``text_encoder`` and ``text_encoder_2``: ``CLIPTextModelWithProjection``, both the frozen
  text tower + text projection of the shapes CLIP (:mod:`opsnn_quant.zoo.shapes_clip`). SD3 wants
  two CLIPs; the zoo has one trained text tower, so both slots hold it. ``tokenizer`` and
  ``tokenizer_2`` are the shared shapes tokenizer (24 positions). No T5 (``text_encoder_3`` and
  ``tokenizer_3`` are ``None``): the pipeline then appends ``max_sequence_length`` zero tokens;
  the transformer is trained for any count from 0 to 256, the demo passes 0.
- ``scheduler``: ``FlowMatchEulerDiscreteScheduler`` (1000 training steps, shift
  :data:`SCHEDULER_SHIFT`).

Trained by ``python -m opsnn_quant.zoo.training.train_shapes_dit``; weights live in ``weights/shapes-dit``
(committed: ``--out opsnn_quant/zoo/weights --steps 6000 --seed 0`` on 1 CPU thread). Gate:
``python -m opsnn_quant.zoo.training.shapes_report --model shapes-dit``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.zoo import shapes_pipeline
from opsnn_quant.zoo.shapes_pipeline import LATENT_SIZE

if TYPE_CHECKING:
    import numpy as np
    from diffusers import StableDiffusion3Pipeline

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights" / "shapes-dit"
NUM_TRAIN_TIMESTEPS = 1000
SCHEDULER_SHIFT = 1.0
# Width of one CLIP's features; SD3 concatenates the two CLIPs' hidden states and pooled outputs.
CLIP_DIM = 128
# Demo sampling settings (the gate, the sample grid and the tests use them).
DEMO_STEPS = 8
DEMO_GUIDANCE = 4.0
# Zero "T5" tokens that the pipeline appends without a T5 encoder; 0 keeps sampling cheap.
DEMO_T5_TOKENS = 0


def transformer_config() -> dict[str, Any]:
    """``SD3Transformer2DModel`` config: 4 joint blocks of width 96 on a 4×4 grid of 2×2 patches."""
    return {
        "sample_size": LATENT_SIZE,
        "patch_size": 2,
        "in_channels": 4,
        "out_channels": 4,
        "num_layers": 4,
        "attention_head_dim": 32,
        "num_attention_heads": 3,
        # The two CLIPs' hidden states side by side: SD3 pads them to this width (no padding here).
        "joint_attention_dim": 2 * CLIP_DIM,
        "caption_projection_dim": 96,  # must equal the width (heads × head dim)
        "pooled_projection_dim": 2 * CLIP_DIM,
        # The fixed sin-cos table is a saved buffer of pos_embed_max_size² rows; SD3's 96 would
        # be 4.7 MB for a 4×4 patch grid.
        "pos_embed_max_size": LATENT_SIZE // 2,
        "qk_norm": "rms_norm",
    }


def scheduler_config() -> dict[str, Any]:
    """``FlowMatchEulerDiscreteScheduler`` config used for sampling."""
    return {"num_train_timesteps": NUM_TRAIN_TIMESTEPS, "shift": SCHEDULER_SHIFT}


def load_shapes_dit(
    torch_dtype: torch.dtype = torch.float32, path: str | Path | None = None
) -> StableDiffusion3Pipeline:
    """Load the shapes diffusion-transformer pipeline offline.

    Args:
        torch_dtype: Dtype of every component.
        path: Pipeline directory; defaults to the committed ``weights/shapes-dit``.

    Returns:
        A ``StableDiffusion3Pipeline`` without T5, generating 32×32 images.

    Raises:
        ModelLoadError: The directory is missing or incomplete.
    """
    from diffusers import StableDiffusion3Pipeline

    directory = Path(path) if path is not None else WEIGHTS_DIR
    pipe: StableDiffusion3Pipeline = shapes_pipeline.load_zoo_pipeline(
        StableDiffusion3Pipeline, directory, "shapes-dit",
        "run python -m opsnn_quant.zoo.training.train_shapes_dit", torch_dtype,
        text_encoder_3=None, tokenizer_3=None,
    )  # fmt: skip
    return pipe


def generate(
    pipe: Any,
    prompts: list[str],
    seed: int = 0,
    num_inference_steps: int = DEMO_STEPS,
    guidance_scale: float = DEMO_GUIDANCE,
    batch_size: int = 64,
    max_sequence_length: int = DEMO_T5_TOKENS,
) -> np.ndarray:
    """Generate one image per prompt, reproducibly.

    Args:
        pipe: A pipeline from :func:`load_shapes_dit` (or a quantized copy of one).
        prompts: Captions.
        seed: Seed of the initial latents (one generator for the whole call).
        num_inference_steps: Euler steps.
        guidance_scale: Classifier-free guidance scale.
        batch_size: Prompts per pipeline call.
        max_sequence_length: Zero tokens standing in for the absent T5.

    Returns:
        uint8 array ``[len(prompts), 32, 32, 3]``.
    """
    return shapes_pipeline.generate(
        pipe, prompts, seed, num_inference_steps, guidance_scale, batch_size,
        denoiser="transformer", max_sequence_length=max_sequence_length,
    )  # fmt: skip


def weights_dir() -> Path:
    """The committed pipeline directory.

    Raises:
        ModelLoadError: It holds no pipeline.
    """
    if not (WEIGHTS_DIR / "model_index.json").is_file():
        raise ModelLoadError(
            f"no shapes-dit pipeline at {WEIGHTS_DIR}; run python -m opsnn_quant.zoo.training.train_shapes_dit"
        )
    return WEIGHTS_DIR
