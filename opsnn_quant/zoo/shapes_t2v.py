"""The shapes text-to-video model: a small diffusers ``WanPipeline`` (Wan2.1's classes).

Parts (every Linear of the transformer and text encoder has K % 16 == 0 and N % 8 == 0, so
Ascend int8 matmuls apply):

- ``transformer``: ``WanTransformer3DModel`` on 8-channel latents of 5 frames x 8 x 8, patch
  (1, 2, 2) (80 tokens), width 96 (3 heads of 32, 3-D RoPE), 4 blocks of spatio-temporal
  self-attention, cross-attention to the text and a 256-wide MLP; flow-matching velocity
  prediction, as Wan2.1.
- ``vae``: ``AutoencoderKLWan`` (causal 3-D convolutions, frames in chunks of four as Wan's),
  base width 16, spatial /4, temporal /2: 9 frames of 32x32 <-> 5 latent frames of 8x8x8;
  ``latents_mean``/``latents_std`` measured on the training clips.
- ``text_encoder``: a 2-layer ``UMT5EncoderModel`` (width 64), trained with the transformer;
  ``tokenizer``: the shapes BPE tokenizer (:mod:`.tokenizer_shapes`) over the video captions'
  words. The pipeline pads the text to ``max_sequence_length`` zero rows, as Wan's.
- ``scheduler``: ``FlowMatchEulerDiscreteScheduler`` (shift :data:`SCHEDULER_SHIFT`).

Trained by ``python -m opsnn_quant.zoo.training.train_shapes_t2v`` on clips of
:mod:`.shapes_video`; weights in ``weights/shapes-t2v``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.zoo import shapes_pipeline
from opsnn_quant.zoo.shapes_video import FRAMES

if TYPE_CHECKING:
    from diffusers import WanPipeline

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights" / "shapes-t2v"
NUM_TRAIN_TIMESTEPS = 1000
SCHEDULER_SHIFT = 1.0
Z_DIM = 8
TEXT_DIM = 64
# Text rows the pipeline gives the transformer (captions are at most 9 tokens with BOS/EOS).
MAX_SEQUENCE_LENGTH = 16
# Demo sampling settings (the suite, the gate and the tests use them).
DEMO_STEPS = 10
DEMO_GUIDANCE = 4.0
DEMO_FRAMES = FRAMES
DEMO_SIZE = 32


def transformer_config() -> dict[str, Any]:
    """``WanTransformer3DModel`` config: 4 blocks of width 96 on (1, 2, 2) patches."""
    return {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 3,
        "attention_head_dim": 32,
        "in_channels": Z_DIM,
        "out_channels": Z_DIM,
        "text_dim": TEXT_DIM,
        "freq_dim": 64,
        "ffn_dim": 256,
        "num_layers": 4,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "rope_max_seq_len": 64,
    }


def vae_config(
    latents_mean: list[float] | None = None, latents_std: list[float] | None = None
) -> dict[str, Any]:
    """``AutoencoderKLWan`` config: spatial /4 and temporal /2 (one 3-D downsampling)."""
    return {
        "base_dim": 16,
        "z_dim": Z_DIM,
        "dim_mult": [1, 2, 4],
        "num_res_blocks": 1,
        "attn_scales": [],
        "temperal_downsample": [False, True],
        "dropout": 0.0,
        "latents_mean": latents_mean or [0.0] * Z_DIM,
        "latents_std": latents_std or [1.0] * Z_DIM,
        "scale_factor_temporal": 2,
        "scale_factor_spatial": 4,
    }


def text_encoder_config(vocab_size: int, pad_token_id: int, eos_token_id: int) -> dict[str, Any]:
    """``UMT5Config`` of the text encoder: 2 layers of width 64 (2 heads of 32)."""
    return {
        "vocab_size": vocab_size,
        "d_model": TEXT_DIM,
        "d_kv": 32,
        "d_ff": 128,
        "num_layers": 2,
        "num_heads": 2,
        "relative_attention_num_buckets": 16,
        "relative_attention_max_distance": 32,
        "dropout_rate": 0.0,
        "feed_forward_proj": "gated-gelu",
        "is_encoder_decoder": False,
        "use_cache": False,
        "pad_token_id": pad_token_id,
        "eos_token_id": eos_token_id,
        "decoder_start_token_id": pad_token_id,
        "tie_word_embeddings": False,
    }


def scheduler_config() -> dict[str, Any]:
    """``FlowMatchEulerDiscreteScheduler`` config used for sampling."""
    return {"num_train_timesteps": NUM_TRAIN_TIMESTEPS, "shift": SCHEDULER_SHIFT}


def load_shapes_t2v(
    torch_dtype: torch.dtype = torch.float32, path: str | Path | None = None
) -> WanPipeline:
    """Load the shapes text-to-video pipeline offline.

    Args:
        torch_dtype: Dtype of every component.
        path: Pipeline directory; defaults to the committed ``weights/shapes-t2v``.

    Raises:
        ModelLoadError: The directory is missing or incomplete.
    """
    from diffusers import WanPipeline

    directory = Path(path) if path is not None else WEIGHTS_DIR
    pipe: WanPipeline = shapes_pipeline.load_zoo_pipeline(
        WanPipeline, directory, "shapes-t2v", _HOW, torch_dtype
    )
    return pipe


_HOW = "run python -m opsnn_quant.zoo.training.train_shapes_t2v"


def generate(
    pipe: Any,
    prompts: list[str],
    seed: int = 0,
    num_inference_steps: int = DEMO_STEPS,
    guidance_scale: float = DEMO_GUIDANCE,
    batch_size: int = 32,
) -> Any:
    """One clip per prompt, reproducibly: uint8 ``[len(prompts), 9, 32, 32, 3]``.

    Each batch's latents come from one generator seeded ``seed + start`` (the adapters' rule).
    """
    import numpy as np

    out = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        g = torch.Generator().manual_seed(seed + start)
        with torch.no_grad():
            frames = pipe(
                prompt=batch,
                negative_prompt=[""] * len(batch),
                height=DEMO_SIZE,
                width=DEMO_SIZE,
                num_frames=DEMO_FRAMES,
                num_inference_steps=num_inference_steps,
                guidance_scale=guidance_scale,
                generator=g,
                output_type="np",
                max_sequence_length=MAX_SEQUENCE_LENGTH,
            ).frames
        out.append((np.clip(np.asarray(frames), 0, 1) * 255).round().astype(np.uint8))
    return np.concatenate(out)


def weights_dir() -> Path:
    """The committed pipeline directory.

    Raises:
        ModelLoadError: It holds no pipeline.
    """
    if not (WEIGHTS_DIR / "model_index.json").is_file():
        raise ModelLoadError(f"no shapes-t2v pipeline at {WEIGHTS_DIR}; {_HOW}")
    return WEIGHTS_DIR
