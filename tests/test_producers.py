"""Which module produces each module's input, and the Linears one norm alone feeds
(opsnn_quant/producers.py)."""

from __future__ import annotations

import torch
from torch import nn

from opsnn_quant.producers import fold_groups, is_norm


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ln, self.ln2, self.ln3, self.ln4 = (nn.LayerNorm(16) for _ in range(4))
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.fc, self.act = nn.Linear(16, 16), nn.GELU()
        self.o, self.fc4 = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        y = self.q(h) + self.k(h) + self.v(h)  # ln feeds three Linears only: one group
        h2 = self.ln2(y)
        z = self.fc(h2) + self.act(h2)  # ln2 also feeds a GELU, which needs its input as is
        h3 = self.ln3(z)
        w = self.o(h3) + self.o(z)  # o also takes another tensor: no single producer
        return self.fc4(self.ln4(w))


def test_fold_groups_are_the_linears_a_norm_alone_feeds():
    model = _Block()
    calls = [((torch.randn(2, 5, 16),), {})]
    assert fold_groups(model, {"": calls}) == {"ln": ["k", "q", "v"], "ln4": ["fc4"]}


def test_is_norm_takes_a_gain_over_the_last_dim():
    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

    assert is_norm(nn.LayerNorm(8)) and is_norm(RMSNorm())
    assert not is_norm(nn.LayerNorm(8, elementwise_affine=False))
    assert not is_norm(nn.GroupNorm(2, 8)) and not is_norm(nn.Linear(8, 8))
