"""Tiny models for tests, each with ``example_inputs()`` (deterministic for a seed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The probe's candidate schemes of a Linear outside a sampling loop (no per-step schemes), as
# listed in quant/schemes.py's table: what a probe report measures on such a module.
LINEAR_CANDIDATES = frozenset(
    {"w8a8", "w8a8_mse", "w8a8_smoothquant", "w8a8_dynamic", "w8a8_dynamic_smoothquant", "w4a16",
     "w8a8_gptq", "w8a8_smoothquant_gptq", "w8a8_dynamic_gptq"}
)  # fmt: skip


class TinyMLP(nn.Module):
    """Linear -> GELU -> Linear, with one outlier input channel (SmoothQuant's use case)."""

    def __init__(self, d_in: int = 64, d_hidden: int = 128, d_out: int = 32, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_out)
        self.d_in = d_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def example_inputs(self, batch: int = 8, seed: int = 0) -> tuple[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, 4, self.d_in, generator=g)
        x[..., 3] *= 20.0
        return (x,)


class TinyConvBlock(nn.Module):
    """Conv3x3 -> GroupNorm -> SiLU -> Conv3x3 (stride 2), as in a UNet/VAE resnet block."""

    def __init__(self, c_in: int = 4, c_mid: int = 32, c_out: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = nn.Conv2d(c_in, c_mid, 3, padding=1)
        self.norm = nn.GroupNorm(8, c_mid)
        self.conv2 = nn.Conv2d(c_mid, c_out, 3, stride=2, padding=1)
        self.c_in = c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.silu(self.norm(self.conv1(x))))

    def example_inputs(self, batch: int = 2, seed: int = 0) -> tuple[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, self.c_in, 8, 8, generator=g),)


class TinyAttention(nn.Module):
    """Pre-LN self-attention block with q/k/v/out projections and an MLP."""

    def __init__(self, dim: int = 64, heads: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.norm1 = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, 4 * dim)
        self.ff2 = nn.Linear(4 * dim, dim)
        self.heads, self.dim = heads, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (
            p(h).reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
            for p in (self.to_q, self.to_k, self.to_v)
        )
        att = F.scaled_dot_product_attention(q, k, v)
        x = x + self.to_out(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))

    def example_inputs(self, batch: int = 2, seed: int = 0) -> tuple[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, 8, self.dim, generator=g),)


def forward_loop_for(model: nn.Module, batches: int = 4, seed: int = 100):  # type: ignore[no-untyped-def]
    """A ForwardLoop feeding ``batches`` fresh example inputs (seeds seed..seed+batches-1)."""
    make = model.example_inputs  # type: ignore[operator]

    def loop(m: nn.Module) -> None:
        for i in range(batches):
            m(*make(seed=seed + i))

    return loop
