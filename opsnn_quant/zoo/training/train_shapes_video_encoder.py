"""Train the shapes video encoder (the KVD feature space) on CPU.

Usage::

    python -m opsnn_quant.zoo.training.train_shapes_video_encoder --out DIR [--steps N]

Cross-entropy on the five heads (shape, colour, size, motion, speed) over clips of all 576
captions (:func:`~opsnn_quant.zoo.shapes_video.any_caption_clips`: trained on the training half
only, the heads learn the halves' parity rule, e.g. the shape from the four other attributes,
and miss every eval clip); prints each head's accuracy on the 288 eval clips. Writes ``DIR/shapes-video-encoder``. Seeded;
the same seed and thread count give the same weights.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.evaluation.video_features import VideoEncoder, save_video_encoder
from opsnn_quant.zoo.shapes_data import COLORS, SHAPES, SIZES
from opsnn_quant.zoo.shapes_video import MOTIONS, SPEEDS, any_caption_clips, generate
from opsnn_quant.zoo.training.train_shapes import Progress, lr_schedule, setup

logger = logging.getLogger("opsnn_quant.zoo.training.train_shapes_video_encoder")

HEADS: dict[str, tuple[str, ...]] = {
    "shape": SHAPES,
    "color": tuple(COLORS),
    "size": SIZES,
    "motion": tuple(MOTIONS),
    "speed": SPEEDS,
}


class WithHeads(nn.Module):
    """The encoder and one linear head per label (training only: the heads are not saved)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = VideoEncoder(width=16, features=64)
        self.heads = nn.ModuleDict({k: nn.Linear(64, len(v)) for k, v in HEADS.items()})

    def forward(self, clips: torch.Tensor) -> dict[str, torch.Tensor]:
        f = F.silu(self.encoder(clips))
        return {k: head(f) for k, head in self.heads.items()}


def _targets(labels: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor([v.index(x) for x in labels[k]]) for k, v in HEADS.items()}


@torch.no_grad()
def accuracy(
    model: nn.Module, clips: torch.Tensor, labels: dict[str, list[str]]
) -> dict[str, float]:
    """Each head's accuracy on ``clips``."""
    logits = model(clips)
    targets = _targets(labels)
    return {k: float((logits[k].argmax(1) == targets[k]).float().mean()) for k in HEADS}


def train(out: Path, steps: int, seed: int = 0, threads: int = 1, pool: int = 6000,
          batch_size: int = 32) -> Path:  # fmt: skip
    """Train and save; returns the directory."""
    g = setup(seed, threads)
    clips_np, labels = any_caption_clips(pool, seed=seed)
    clips = torch.from_numpy(clips_np)
    targets = _targets(labels)
    model = WithHeads()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = lr_schedule(opt, steps, warmup=100)
    progress = Progress("encoder", steps)
    for step in range(steps):
        idx = torch.randint(pool, (batch_size,), generator=g)
        logits = model(clips[idx])
        loss = sum(F.cross_entropy(logits[k], targets[k][idx]) for k in HEADS)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[union-attr]
        opt.step()
        sched.step()
        progress.update(step, float(loss))
    model.eval()
    eval_np, _, eval_labels = generate("eval", 288)
    logger.info("eval accuracy: %s", accuracy(model, torch.from_numpy(eval_np), eval_labels))
    # features of order one for KVD's cubic kernel: one over their RMS on 512 training clips
    with torch.no_grad():
        rms = model.encoder(clips[:512]).pow(2).mean().sqrt()
    model.encoder.scale = round(1.0 / float(rms), 6)
    logger.info("feature scale %.6f", model.encoder.scale)
    return save_video_encoder(model.encoder, out / "shapes-video-encoder")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.monotonic()
    train(Path(args.out), args.steps, args.seed, args.threads)
    logger.info("shapes-video-encoder done in %.0f s", time.monotonic() - start)


if __name__ == "__main__":
    main()
