"""``opsnn-quant engine-demo``: the quantization engine on a small built-in transformer block.

It shows every scheme's output error against fp32, computed
by the exact Ascend reference on this machine's CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opsnn_quant.cli import _ui

if TYPE_CHECKING:
    import torch
    from torch import nn


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
        force: Annotated[bool, typer.Option("--force", help=_ui.FORCE_HELP)] = False,
    ) -> None:
        """Quantize a small transformer block with every scheme and print its error vs fp32."""
        import copy

        import torch

        from opsnn_quant.core.numerics import cosine, sqnr_db
        from opsnn_quant.core.user_config import check_seed
        from opsnn_quant.formats.checkpoint import OUTPUT_KIND, save_quantized
        from opsnn_quant.output.directories import atomic_dir, check_output_dir
        from opsnn_quant.quant.api import quantize
        from opsnn_quant.quant.spec import QuantSpec
        from opsnn_quant.types import Precision
        from opsnn_quant.zoo.demo_block import DemoBlock

        check_seed(seed)
        check_output_dir(out, OUTPUT_KIND, force=force)
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
        table = _ui.table(
            "Output error vs fp32 (backend: cpu-reference of the Ascend int8 ops)",
            [("scheme", "left"), ("SQNR dB", "right"), ("cosine", "right")],
        )
        best = None
        for label, spec in schemes.items():
            q = quantize(copy.deepcopy(model), {"up": spec, "down": spec}, _loop(calib))
            with torch.no_grad():
                y = q(test)
            snr = sqnr_db(ref, y)
            table.add_row(label, f"{snr:.1f}", f"{cosine(ref, y):.6f}")
            if spec.precision == "w8a8" and (best is None or snr > best[0]):
                best = (snr, q, label)
        _ui.print_table(table)
        assert best is not None
        with atomic_dir(out, OUTPUT_KIND, force=force) as tmp:
            save_quantized(best[1], tmp, source_model=f"engine-demo-block(seed={seed})")
        _ui.console.print(f"saved the best static W8A8 model ({best[2]}) to {out}")
