"""``opsnn-quant engine-demo``: the quantization engine on a small built-in transformer block.

A stand-in until ``calibrate`` lands: it shows every scheme's output error against fp32, computed
by the exact Ascend reference on this machine's CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.table import Table
from torch import nn

from opsnn_quant.numerics import cosine, sqnr_db


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


def _loop(batches: list[torch.Tensor]) -> Callable[[nn.Module], None]:
    def loop(model: nn.Module) -> None:
        for x in batches:
            model(x)

    return loop


def register(app: typer.Typer) -> None:
    """Add the command to ``app``."""

    @app.command("engine-demo")
    def engine_demo(
        out: Annotated[Path, typer.Option("-o", "--out", help="checkpoint directory")] = Path(
            "out/engine-demo"
        ),
        seed: Annotated[int, typer.Option(help="seed of the model and the data")] = 0,
    ) -> None:
        """Quantize a small transformer block with every scheme and print its error vs fp32."""
        import copy

        from opsnn_quant.quant.api import quantize
        from opsnn_quant.quant.checkpoint import save_quantized
        from opsnn_quant.quant.spec import QuantSpec
        from opsnn_quant.types import Precision

        torch.manual_seed(seed)
        model = DemoBlock(seed=seed).eval()
        g = torch.Generator().manual_seed(seed + 1)
        calib = [torch.randn(4, 32, 256, generator=g) for _ in range(8)]
        test = torch.randn(4, 32, 256, generator=g)
        with torch.no_grad():
            ref = model(test)
        schemes = {
            "w8a8 minmax": QuantSpec(Precision.W8A8),
            "w8a8 mse": QuantSpec(Precision.W8A8, observer="mse"),
            "w8a8 + SmoothQuant(auto)": QuantSpec(Precision.W8A8, smoothquant_alpha="auto"),
            "w8a8_dynamic": QuantSpec(Precision.W8A8_DYNAMIC),
            "w8a8_dynamic + SmoothQuant(0.5)": QuantSpec(
                Precision.W8A8_DYNAMIC, smoothquant_alpha=0.5
            ),
            "w8a16": QuantSpec(Precision.W8A16),
        }
        table = Table(title="Output error vs fp32 (backend: cpu reference of Ascend int8 ops)")
        for col in ("scheme", "SQNR dB", "cosine"):
            table.add_column(col)
        best = None
        for label, spec in schemes.items():
            q = quantize(copy.deepcopy(model), {"up": spec, "down": spec}, _loop(calib))
            with torch.no_grad():
                y = q(test)
            snr = sqnr_db(ref, y)
            table.add_row(label, f"{snr:.1f}", f"{cosine(ref, y):.6f}")
            if spec.precision == "w8a8" and (best is None or snr > best[0]):
                best = (snr, q, label)
        Console().print(table)
        assert best is not None
        save_quantized(best[1], out, source_model=f"engine-demo-block(seed={seed})")
        Console().print(f"saved the best static W8A8 model ({best[2]}) to {out}")
