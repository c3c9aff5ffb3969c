"""A tiny CNN that reads colour, shape, size and position of a single shape in a 32×32 image.

It is the judge of the shapes text-to-image quality gate: generated images for held-out eval
prompts are scored by how often the judge's reading matches the prompt. Trained on single-shape
images of every (colour, shape, position) triple, half of them passed through the VAE so that
the judge reads decoded images as well as drawn ones.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.zoo.shapes_data import COLORS, POSITIONS, SHAPES, SIZES, generate

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights" / "shapes-judge"
HEADS: dict[str, list[str]] = {
    "color": list(COLORS),
    "shape": list(SHAPES),
    "size": list(SIZES),
    "position": list(POSITIONS),
}


class ShapesJudge(nn.Module):
    """Conv net with one classification head per attribute."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        w = width

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]

        self.features = nn.Sequential(
            *block(3, w), *block(w, w), nn.MaxPool2d(2),
            *block(w, 2 * w), *block(2 * w, 2 * w), nn.MaxPool2d(2),
            *block(2 * w, 2 * w), nn.MaxPool2d(2),
        )  # fmt: skip
        self.hidden = nn.Sequential(nn.Flatten(), nn.Linear(2 * w * 16, 128), nn.ReLU())
        self.heads = nn.ModuleDict({k: nn.Linear(128, len(v)) for k, v in HEADS.items()})
        self.width = width

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Logits per head for images in [-1, 1], ``[n, 3, 32, 32]``."""
        h = self.hidden(self.features(x))
        return {k: head(h) for k, head in self.heads.items()}

    @torch.no_grad()
    def predict(self, images: np.ndarray) -> dict[str, list[str]]:
        """Read uint8 ``[n, 32, 32, 3]`` images; returns head -> predicted names."""
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        logits = self.eval()(x)
        return {k: [HEADS[k][int(i)] for i in v.argmax(dim=1)] for k, v in logits.items()}


def load_shapes_judge(path: str | Path | None = None) -> ShapesJudge:
    """Load the committed judge (or one from ``path``) in eval mode.

    Raises:
        ModelLoadError: The directory is missing or incomplete.
    """
    from safetensors.torch import load_file

    directory = Path(path) if path is not None else WEIGHTS_DIR
    try:
        config = json.loads((directory / "config.json").read_text())
        judge = ShapesJudge(width=int(config["width"]))
        judge.load_state_dict(load_file(str(directory / "model.safetensors")))
    except (OSError, KeyError, RuntimeError, ValueError) as err:
        raise ModelLoadError(f"cannot load the shapes judge from {directory}: {err}") from err
    return judge.eval()


def eval_prompts(n: int, seed: int = 0) -> tuple[list[str], dict[str, list[str]]]:
    """The first ``n`` single-shape eval captions (held-out triples) and their labels."""
    prompts: list[str] = []
    labels: dict[str, list[str]] = {k: [] for k in HEADS}
    start = 0
    while len(prompts) < n:
        _, caps, labs = generate("eval", 2 * n, seed=seed, start=start)
        for i, cap in enumerate(caps):
            if labs["n_shapes"][i] == 1 and len(prompts) < n:
                prompts.append(cap)
                for k in HEADS:
                    labels[k].append(labs[k][i])
        start += 2 * n
    return prompts, labels


def t2i_scores(
    pipe: Any,
    judge: ShapesJudge,
    n: int = 128,
    seed: int = 0,
    num_inference_steps: int = 20,
    guidance_scale: float = 5.0,
) -> dict[str, float]:
    """Generate images for ``n`` held-out eval prompts and score them with the judge.

    Args:
        pipe: A shapes text-to-image pipeline.
        judge: The judge.
        n: Number of prompts (single-shape eval captions).
        seed: Seed of the prompts and of the initial latents.
        num_inference_steps: DDIM steps.
        guidance_scale: Classifier-free guidance scale.

    Returns:
        Fraction of images whose ``color``/``shape``/``size``/``position`` match the prompt.
    """
    from opsnn_quant.zoo.shapes_pipeline import generate as t2i_generate

    prompts, labels = eval_prompts(n, seed)
    images = t2i_generate(pipe, prompts, seed, num_inference_steps, guidance_scale)
    preds = judge.predict(images)
    return {k: sum(p == t for p, t in zip(preds[k], labels[k], strict=True)) / n for k in HEADS}


def train_judge(
    out: Path, steps: int, seed: int = 0, batch_size: int = 64, pool: int = 20000
) -> Path:
    """Train the judge on single-shape images of all triples (train + eval split, seed 1).

    Half of the images are replaced by their VAE reconstruction when the VAE of ``out`` exists.
    """
    import numpy as np
    from safetensors.torch import save_file

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    parts = [generate("train", pool // 2), generate("eval", pool // 2, seed=1)]
    keep = [np.asarray(labs["n_shapes"]) == 1 for _, _, labs in parts]
    images = np.concatenate([imgs[k] for (imgs, _, _), k in zip(parts, keep, strict=True)])
    targets = {
        h: torch.tensor(
            [HEADS[h].index(v) for (_, _, labs), k in zip(parts, keep, strict=True)
             for v, kk in zip(labs[h], k, strict=True) if kk]
        )
        for h in HEADS
    }  # fmt: skip
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    vae_dir = out / "shapes-t2i" / "vae"
    if (vae_dir / "config.json").is_file():
        from diffusers import AutoencoderKL

        vae = AutoencoderKL.from_pretrained(str(vae_dir), local_files_only=True).eval()
        half = len(x) // 2
        with torch.no_grad():
            x[:half] = torch.cat(
                [vae.decode(vae.encode(c).latent_dist.mode()).sample for c in x[:half].split(512)]
            ).clamp(-1, 1)
    judge = ShapesJudge()
    opt = torch.optim.AdamW(judge.parameters(), lr=2e-3, weight_decay=1e-4)
    lr = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps))))
    )
    judge.train()
    for step in range(steps):
        idx = torch.randint(len(x), (batch_size,), generator=g)
        # Noise and a per-image colour shift: generated images are never exactly on-palette.
        xb = x[idx] + 0.03 * torch.randn(x[idx].shape, generator=g)
        xb = xb + 0.08 * (torch.rand(batch_size, 3, 1, 1, generator=g) - 0.5)
        logits = judge(xb)
        loss = sum(
            (nn.functional.cross_entropy(logits[h], targets[h][idx]) for h in HEADS),
            torch.zeros(()),
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lr.step()
        if (step + 1) % 100 == 0:
            logger.info("judge step %d/%d loss %.4f", step + 1, steps, loss.item())
    judge.eval()
    ev, _, labs = generate("eval", min(512, pool), seed=2)
    single = np.asarray(labs["n_shapes"]) == 1
    preds = judge.predict(ev[single])
    for h in HEADS:
        truth = [v for v, s in zip(labs[h], single, strict=True) if s]
        acc = sum(p == t for p, t in zip(preds[h], truth, strict=True)) / len(truth)
        logger.info("judge accuracy on drawn eval images (seed 2) %s: %.4f", h, acc)
    target = out / "shapes-judge"
    target.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in judge.state_dict().items()},
        str(target / "model.safetensors"),
    )
    (target / "config.json").write_text(
        json.dumps({"width": judge.width, "heads": HEADS}, indent=2) + "\n"
    )
    return target
