"""Measure the shapes zoo gates on the committed weights and draw the sample grid.

Usage::

    python -m opsnn_quant.zoo.shapes_report [--n 128] [--grid docs/shapes_t2i_samples.png]

Prints JSON: the judge's colour/shape/size/position accuracy on images generated for held-out
eval prompts (20 DDIM steps, guidance 5, seed 0) and the CLIP's top-1 retrieval accuracy among
16 captions.
"""

from __future__ import annotations

import argparse
import json
import logging
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def save_sample_grid(
    images: Any, prompts: list[str], correct: list[bool], path: str | Path, columns: int = 8
) -> Path:
    """Save generated images with their prompts as titles (green: judge agrees, red: not).

    Args:
        images: uint8 ``[n, 32, 32, 3]``.
        prompts: One prompt per image.
        correct: Whether the judge read the prompt's colour and shape.
        path: PNG path.
        columns: Images per row.

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
        "shapes-t2i on held-out prompts (20 DDIM steps, guidance 5, seed 0); "
        "frame: judge reads colour+shape right (green) / wrong (red)",
        fontsize=8,
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def measure(n: int = 128, grid: str | Path | None = None, grid_size: int = 32) -> dict[str, Any]:
    """Measure the t2i and CLIP gates on the committed weights.

    Args:
        n: Held-out prompts to generate for (the first ``n`` single-shape eval captions).
        grid: Where to save the sample grid of the first ``grid_size`` images (optional).
        grid_size: Images in the grid.

    Returns:
        Accuracies, counts and timings.
    """
    from opsnn_quant import zoo
    from opsnn_quant.zoo import shapes_clip, shapes_judge, shapes_pipeline

    torch.set_num_threads(2)
    start = time.monotonic()
    pipe = zoo.load("shapes-t2i")
    judge = shapes_judge.load_shapes_judge()
    prompts, labels = shapes_judge.eval_prompts(n)
    images = shapes_pipeline.generate(pipe, prompts, seed=0, num_inference_steps=20)
    preds = judge.predict(images)
    t2i = {
        k: sum(p == t for p, t in zip(preds[k], labels[k], strict=True)) / n
        for k in shapes_judge.HEADS
    }
    t2i_s = time.monotonic() - start
    if grid is not None:
        ok = [
            preds["color"][i] == labels["color"][i] and preds["shape"][i] == labels["shape"][i]
            for i in range(grid_size)
        ]
        save_sample_grid(images[:grid_size], prompts[:grid_size], ok, grid)
    start = time.monotonic()
    clip = zoo.load("shapes-clip")
    processor = shapes_clip.load_shapes_clip_processor()
    retrieval = shapes_clip.retrieval_accuracy(clip, processor, n=256)
    return {
        "t2i_prompts": n,
        "t2i_accuracy": t2i,
        "t2i_seconds": round(t2i_s, 1),
        "clip_retrieval_top1_of_16": retrieval,
        "clip_images": 256,
        "clip_seconds": round(time.monotonic() - start, 1),
    }


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: print the measured figures as JSON."""
    parser = argparse.ArgumentParser(description="Measure the shapes zoo gates.")
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--grid", default=None, help="PNG path for the sample grid")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(measure(args.n, args.grid), indent=2))


if __name__ == "__main__":
    main()
