"""A tiny Stable Diffusion pipeline with planted fp16 overflows of every kind the probe knows.

Each plant scales real weights of :func:`tests.tiny_pipelines.save_tiny_sd`'s pipeline so that
one kind of fp16 overflow happens on the calibration prompts while fp32 stays finite:

* ``linear``: the text encoder's ``mlp.fc2`` output passes 65504 (its block's residual sum then
  does too: ``residual``);
* ``norm``: token embeddings x1.5e4 make ``layer_norm1``'s mean of squares pass 65504 while
  |x| stays far below it;
* ``softmax``: q/k projections x1500 make the attention scores pass 65504 while q and k stay
  in range;
* ``conv``: the VAE decoder's ``conv_out`` output passes 65504.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_pipelines import save_tiny_sd

TE = "text_encoder.encoder.layers.0"
PLANTED = {
    "linear": f"{TE}.mlp.fc2",
    "residual": TE,
    "norm": f"{TE}.layer_norm1",
    "softmax": f"{TE}.self_attn",
    "conv": "vae.decoder.conv_out",
}


def save_planted_sd(path: Path) -> Path:
    """The tiny pipeline with the plants above, saved in ``path``."""
    from diffusers import StableDiffusionPipeline

    save_tiny_sd(path)
    pipe = StableDiffusionPipeline.from_pretrained(str(path))
    te = pipe.text_encoder
    layer = te.encoder.layers[0]
    with torch.no_grad():
        te.embeddings.token_embedding.weight.mul_(1.5e4)
        layer.self_attn.q_proj.weight.mul_(1500.0)
        layer.self_attn.k_proj.weight.mul_(1500.0)
        layer.mlp.fc2.weight.mul_(1e6)
        pipe.vae.decoder.conv_out.weight.mul_(1e6)
    pipe.save_pretrained(str(path))
    return path
