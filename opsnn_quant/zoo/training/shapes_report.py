"""Measure the shapes zoo gates on the committed weights and draw the sample grid.

Usage::

    python -m opsnn_quant.zoo.training.shapes_report [--model shapes-t2i] [--n 128] [--grid PNG]

Prints JSON: the judge's colour/shape/size/position accuracy on images generated for held-out
eval prompts at the model's demo sampling settings (:data:`SAMPLING`; seed 0) and, for
``shapes-t2i``, the CLIP's top-1 retrieval accuracy among 16 captions.
"""

from __future__ import annotations

import argparse
import json
import logging
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opsnn_quant.zoo import shapes_dit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    """How a zoo text-to-image model generates for its gate and its demo."""

    module: str  # module whose ``generate(pipe, prompts, seed, steps, guidance)`` is used
    num_inference_steps: int
    guidance_scale: float
    sampler: str  # for titles


SAMPLING: dict[str, Sampling] = {
    "shapes-t2i": Sampling("opsnn_quant.zoo.shapes_pipeline", 20, 5.0, "DDIM"),
    "shapes-dit": Sampling(
        "opsnn_quant.zoo.shapes_dit",
        shapes_dit.DEMO_STEPS,
        shapes_dit.DEMO_GUIDANCE,
        "flow-match Euler",
    ),
}


def judge_accuracy(
    pipe: Any, model: str, judge: Any, n: int = 128, seed: int = 0
) -> tuple[dict[str, float], Any, list[str], dict[str, list[str]], dict[str, list[str]]]:
    """Generate for ``n`` held-out prompts at ``model``'s settings and score them with the judge.

    Args:
        pipe: The pipeline of ``model`` (or a quantized copy).
        model: A key of :data:`SAMPLING`.
        judge: The shapes judge.
        n: Prompts (the first ``n`` single-shape eval captions).
        seed: Seed of the prompts and of the initial latents.

    Returns:
        ``(accuracy per head, images, prompts, labels, predictions)``.
    """
    import importlib

    from opsnn_quant.zoo import shapes_judge

    settings = SAMPLING[model]
    prompts, labels = shapes_judge.eval_prompts(n, seed)
    generate = importlib.import_module(settings.module).generate
    images = generate(pipe, prompts, seed, settings.num_inference_steps, settings.guidance_scale)
    preds = judge.predict(images)
    accuracy = {
        k: sum(p == t for p, t in zip(preds[k], labels[k], strict=True)) / n
        for k in shapes_judge.HEADS
    }
    return accuracy, images, prompts, labels, preds


def save_sample_grid(
    images: Any,
    prompts: list[str],
    correct: list[bool],
    path: str | Path,
    columns: int = 8,
    title: str = "shapes-t2i on held-out prompts (20 DDIM steps, guidance 5, seed 0)",
) -> Path:
    """Save generated images with their prompts as titles (green: judge agrees, red: not).

    Args:
        images: uint8 ``[n, 32, 32, 3]``.
        prompts: One prompt per image.
        correct: Whether the judge read the prompt's colour and shape.
        path: PNG path.
        columns: Images per row.
        title: Start of the figure title (the frame legend follows).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (len(prompts) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(1.7 * columns, 2.3 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, (image, prompt, ok) in enumerate(zip(images, prompts, correct, strict=True)):
        ax = axes.flat[i]
        ax.imshow(image, interpolation="nearest")
        ax.set_title("\n".join(textwrap.wrap(prompt, 20)), fontsize=6.5)
        for spine in ax.spines.values():
            spine.set_visible(True)
            spine.set_color("tab:green" if ok else "tab:red")
            spine.set_linewidth(2.5)
        ax.axis("on")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(
        f"{title}; frame: judge reads colour+shape right (green) / wrong (red)", fontsize=8
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def measure(
    n: int = 128,
    grid: str | Path | None = None,
    grid_size: int = 32,
    model: str = "shapes-t2i",
    threads: int = 2,
) -> dict[str, Any]:
    """Measure a text-to-image gate (and, for ``shapes-t2i``, the CLIP's) on the committed weights.

    Args:
        n: Held-out prompts to generate for (the first ``n`` single-shape eval captions).
        grid: Where to save the sample grid of the first ``grid_size`` images (optional).
        grid_size: Images in the grid.
        model: A key of :data:`SAMPLING`.
        threads: CPU threads.

    Returns:
        Accuracies, counts, sampling settings and timings.
    """
    from opsnn_quant import zoo
    from opsnn_quant.zoo import shapes_clip, shapes_judge

    torch.set_num_threads(threads)
    settings = SAMPLING[model]
    start = time.monotonic()
    pipe = zoo.load(model)
    judge = shapes_judge.load_shapes_judge()
    gen_start = time.monotonic()
    t2i, images, prompts, labels, preds = judge_accuracy(pipe, model, judge, n)
    gen_s = time.monotonic() - gen_start
    t2i_s = time.monotonic() - start
    if grid is not None:
        ok = [
            preds["color"][i] == labels["color"][i] and preds["shape"][i] == labels["shape"][i]
            for i in range(grid_size)
        ]
        title = (
            f"{model} on held-out prompts ({settings.num_inference_steps} {settings.sampler} "
            f"steps, guidance {settings.guidance_scale:g}, seed 0)"
        )
        save_sample_grid(images[:grid_size], prompts[:grid_size], ok, grid, title=title)
    result: dict[str, Any] = {
        "model": model,
        "sampling": {
            "sampler": settings.sampler,
            "num_inference_steps": settings.num_inference_steps,
            "guidance_scale": settings.guidance_scale,
            "seed": 0,
        },
        "t2i_prompts": n,
        "t2i_accuracy": t2i,
        "t2i_seconds": round(t2i_s, 1),
        "seconds_per_image": round(gen_s / n, 4),
        "threads": threads,
    }
    if model != "shapes-t2i":
        return result
    start = time.monotonic()
    clip = zoo.load("shapes-clip")
    processor = shapes_clip.load_shapes_clip_processor()
    result["clip_retrieval_top1_of_16"] = shapes_clip.retrieval_accuracy(clip, processor, n=256)
    result["clip_images"] = 256
    result["clip_seconds"] = round(time.monotonic() - start, 1)
    return result


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: print the measured figures as JSON."""
    parser = argparse.ArgumentParser(description="Measure the shapes zoo gates.")
    parser.add_argument("--model", choices=sorted(SAMPLING), default="shapes-t2i")
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--grid", default=None, help="PNG path for the sample grid")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = measure(args.n, args.grid, model=args.model, threads=args.threads)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
