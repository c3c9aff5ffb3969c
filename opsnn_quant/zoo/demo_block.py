"""A seeded pre-LN transformer MLP block with an outlier channel, for ``opsnn-quant engine-demo``."""

from __future__ import annotations

import torch
from torch import nn


class DemoBlock(nn.Module):
    """A pre-LN transformer MLP block with an outlier input channel, seeded."""

    def __init__(self, dim: int = 256, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        with torch.no_grad():
            for lin in (self.up, self.down):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / lin.in_features**0.5)
                lin.bias.zero_()
            self.norm.weight.fill_(1.0)
            self.norm.weight[7] = 25.0  # an outlier channel, as LayerNorm gains produce in LLMs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))
