"""Tiny random-config instances of the classes real users quantize (for adapter/CLI tests).

Built in a few seconds, saved with ``save_pretrained`` so that loading goes through the same
local-directory path as a real Stable Diffusion checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = [
    "a",
    "red",
    "blue",
    "green",
    "circle",
    "square",
    "small",
    "large",
    "at",
    "the",
    "top",
    "left",
]


def _tokenizer_files(d: Path) -> None:
    # Character-level BPE without merges: every word splits into letters, the last one with </w>.
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n")


def save_tiny_sd(path: Path, seed: int = 0) -> Path:
    """A tiny StableDiffusionPipeline (CLIP text encoder, cross-attention UNet, VAE) in ``path``."""
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    tok_dir = path / "_tok"
    _tokenizer_files(tok_dir)
    tokenizer = CLIPTokenizer(
        str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"), model_max_length=16
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(json.loads((tok_dir / "vocab.json").read_text())),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=DDIMScheduler(num_train_timesteps=1000, clip_sample=False),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(str(path))
    return path
