"""What an engine target's calibrate deploys: the policy's int8 MAC share beside each written
artifact's, and how many quantized Linears the engine's consumer computes differently from ours.

Rows: the tiny random-config diffusion transformers of the tests (SD3, FLUX.1-like, Wan2.1-like
text to video; ``tests/tiny_pipelines.py``) calibrated for ``ascend910b-mindie-sd``, and a tiny
Whisper for ``ascend910b-vllm-ascend``. For each: the policy's int8 MAC share (what it asks),
the share each model export writes in int8 (``export/mindie-sd``, ``export/ascendv1``), and the
quantized Linears whose output through the engine's consumer (MindIE-SD's or vLLM-Ascend's Linear
on the written files: ``opsnn_quant/formats/mindie_sd/reader.py``, ``opsnn_quant/formats/ascendv1/consumer.py``)
differs from our module's on the inputs one recorded call gives it (bit for bit; a Linear whose
vLLM SmoothQuant factor is folded into its norm is handed ``x / s``, what that norm gives it).

Random weights: coverage and arithmetic, not accuracy. Backend: cpu (the exact Ascend
reference in each engine's arithmetic).

Run from the repository root: ``python benchmarks/bench_engine_deploy.py [--workdir DIR]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' tiny builders

from opsnn_quant.core.determinism import set_reproducible
from opsnn_quant.core.timesteps import at_step, current_step
from opsnn_quant.formats.checkpoint import load_quantized
from opsnn_quant.pipeline.calibrate import load_recipe_model, run_calibrate
from opsnn_quant.pipeline.recipe import load_recipe
from opsnn_quant.quant.modules import is_quant_module
from opsnn_quant.recording import record_roots, replay
from tests import tiny_pipelines

DIT = {
    "sd3": (tiny_pipelines.save_tiny_sd3, {}),
    "flux": (tiny_pipelines.save_tiny_flux, {}),
    "wan-t2v": (tiny_pipelines.save_tiny_wan, {"num_frames": 5}),
}


def _whisper_recipe(root: Path) -> Path:
    tiny_pipelines.save_tiny_whisper(root / "pipe")
    data = {
        "name": "tiny_whisper",
        "model": {"family": "whisper", "source": str(root / "pipe"),
                  "settings": {"batch_size": 2, "max_new_tokens": 4}},
        "data": {"calibration": "zoo:speech/calibration", "limit": 4},
        "probe": {"max_root_calls": 2},
        "budget": {"min_int8_mac_share": 0.0},
        "target": "ascend910b-vllm-ascend",
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _differing(recipe_path: Path, out: Path, consumer: str) -> tuple[int, int]:
    """(quantized Linears whose engine output differs from ours, quantized Linears compared) on
    one recorded call per root."""
    from opsnn_quant.formats.ascendv1.consumer import apply_ascendv1
    from opsnn_quant.formats.ascendv1.reader import read_ascendv1
    from opsnn_quant.formats.mindie_sd.reader import apply_mindie_sd_dir

    recipe = load_recipe(str(recipe_path))
    ours = load_recipe_model(recipe)
    data = tiny_pipelines.TINY_DIT_PROMPTS[:2] if recipe.model.family != "whisper" else None
    records: list[Any] = [{"prompt": p} for p in data] if data else []
    if not records:
        from opsnn_quant.models.data import load_records

        records = load_records("zoo:speech/eval", 2)
    recorded = record_roots(ours, ours.forward_loop(records), 1, seed=3)
    load_quantized(ours.model, out / "quant")
    engine = load_recipe_model(recipe)
    if consumer == "mindie-sd":
        apply_mindie_sd_dir(engine.model, out / "export" / "mindie-sd")
    else:
        apply_ascendv1(engine.model, read_ascendv1(out / "export" / "ascendv1"))
    a, b = dict(ours.model.named_modules()), dict(engine.model.named_modules())
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor, int | None]]] = {}

    def keep(name: str, x: torch.Tensor, y: torch.Tensor) -> None:
        seen.setdefault(name, []).append((x.detach(), y.detach(), current_step()))

    hooks = [
        a[n].register_forward_hook(lambda m, i, o, n=n: keep(n, i[0], o))
        for n in a
        if is_quant_module(a[n])
    ]
    with torch.no_grad():
        for root, root_calls in recorded.calls.items():
            for call, step in zip(root_calls, recorded.steps_of(root), strict=True):
                replay(a[root], call, step)
    for h in hooks:
        h.remove()
    differ = set()
    for n, triples in seen.items():
        for x, y, step in triples:
            with torch.no_grad(), at_step(step):  # a per-step module's row of that step
                if not torch.equal(y, b[n](_engine_input(a[n], x))):
                    differ.add(n)
    return len(differ), len(seen)


def _engine_input(module: Any, x: torch.Tensor) -> torch.Tensor:
    """What the engine's Linear is handed where ours takes ``x``: ``x / s`` after the norm a
    vLLM module's SmoothQuant factor was folded into (the fold's own fp32 rounding aside)."""
    smooth = getattr(module.input_quantizer, "smooth", None)
    if module.spec.engine != "vllm-ascend" or smooth is None:
        return x
    return x.to(torch.float32) / smooth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-engine-"))
    rows = [(n, b, e) for n, (b, e) in DIT.items()] + [("whisper", None, {})]
    print("row        target                  policy  artifact shares          differing")
    for name, builder, extra in rows:
        set_reproducible(seed=0)
        root = work / name
        root.mkdir(parents=True, exist_ok=True)
        if builder is not None:
            builder(root / "pipe")
            recipe = tiny_pipelines.tiny_dit_recipe(
                root, name, target="ascend910b-mindie-sd", extra=extra
            )
            consumer = "mindie-sd"
        else:
            recipe = _whisper_recipe(root)
            consumer = "ascendv1"
        result = run_calibrate(load_recipe(str(recipe)), root / "out", force=True)
        shares = ", ".join(f"{f} {s['overall']:.1%}" for f, s in result.deployed.items())
        differ, compared = _differing(recipe, root / "out", consumer)
        target = load_recipe(str(recipe)).target
        print(f"{name:10} {target:23} {result.int8_mac_share or 0:6.1%}  {shares:24} "
              f"{differ} of {compared} ({consumer})")  # fmt: skip


if __name__ == "__main__":
    main()
