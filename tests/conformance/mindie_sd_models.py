"""The float models of the MindIE-SD conformance test, built alike in the test and in the engine's
subprocess (``mindie_sd_engine_run.py``, which imports this module but nothing of
``opsnn_quant`` beyond what the torch_npu stand-in forwards to)."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

# A tiny SD3 MMDiT (as tests/tiny_pipelines.py save_tiny_sd3's transformer)
SD3_CONFIG: dict[str, Any] = {
    "sample_size": 8,
    "patch_size": 2,
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 4,
    "joint_attention_dim": 64,
    "caption_projection_dim": 32,
    "pooled_projection_dim": 64,
    "pos_embed_max_size": 16,
}

# A tiny Wan2.1 video transformer (3-D patches, spatio-temporal self-attention with 3-D RoPE,
# cross-attention to the text), as the shapes-t2v demo's at a smaller width
WAN_CONFIG: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 32,
    "freq_dim": 32,
    "ffn_dim": 64,
    "num_layers": 2,
    "rope_max_seq_len": 32,
}


class Block(nn.Module):
    """norm -> a -> GELU -> b -> ReLU -> c (no bias) -> d -> e, and a conv beside them (a conv
    stays float: MindIE-SD replaces ``nn.Linear`` only). The test gives each Linear a scheme."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.norm = nn.LayerNorm(32)
        self.a = nn.Linear(32, 48)
        self.b = nn.Linear(48, 40)
        self.c = nn.Linear(40, 24, bias=False)
        self.d = nn.Linear(24, 24)
        self.e = nn.Linear(24, 16)
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b(nn.functional.gelu(self.a(self.norm(x)))))
        y = self.e(nn.functional.silu(self.d(self.c(y))))
        return y + self.conv(y.reshape(-1, 2, 2, 4)).reshape(y.shape)


def build(kind: str) -> nn.Module:
    """A fresh float model: ``block``, ``sd3`` or ``wan`` (weights to be loaded)."""
    if kind == "block":
        return Block()
    if kind == "sd3":
        from diffusers import SD3Transformer2DModel

        torch.manual_seed(0)
        return cast(nn.Module, SD3Transformer2DModel(**SD3_CONFIG))
    if kind == "wan":
        from diffusers import WanTransformer3DModel

        torch.manual_seed(0)
        return cast(nn.Module, WanTransformer3DModel(**WAN_CONFIG))
    raise ValueError(kind)


def build_dir(directory: str) -> nn.Module:
    """A diffusers model saved in ``directory`` (its ``config.json``'s ``_class_name``), float32."""
    import json
    from pathlib import Path

    import diffusers

    name = json.loads((Path(directory) / "config.json").read_text())["_class_name"]
    return cast(nn.Module, getattr(diffusers, name).from_pretrained(directory))


def forward(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's output tensor on ``inputs`` (keyword arguments)."""
    with torch.no_grad():
        if "hidden_states" in inputs:  # the SD3 and Wan transformers
            return model(**inputs, return_dict=False)[0]
        return model(**inputs)


def sd3_inputs(batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One call of the SD3 transformer as the pipeline makes it (float32; cast by the caller)."""
    return {
        "hidden_states": torch.randn(batch, 4, 8, 8, generator=generator),
        "encoder_hidden_states": torch.randn(batch, 6, 64, generator=generator),
        "pooled_projections": torch.randn(batch, 64, generator=generator),
        "timestep": torch.rand(batch, generator=generator) * 1000,
    }


def wan_inputs(batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One call of the Wan transformer as WanPipeline makes it: 3 latent frames of 4x4."""
    return {
        "hidden_states": torch.randn(batch, 4, 3, 4, 4, generator=generator),
        "timestep": torch.rand(batch, generator=generator) * 1000,
        "encoder_hidden_states": torch.randn(batch, 6, 32, generator=generator),
    }
