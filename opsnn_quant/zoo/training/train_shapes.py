"""Train the shapes zoo models on CPU: VAE, CLIP, judge, UNet.

Usage::

    python -m opsnn_quant.zoo.training.train_shapes {vae,clip,judge,unet,all} --out DIR --steps N --seed S

``DIR`` is the weights root (the committed one is ``opsnn_quant/zoo/weights``); stages write
``DIR/shapes-t2i/vae``, ``DIR/shapes-clip``, ``DIR/shapes-judge`` and, last, the whole pipeline in
``DIR/shapes-t2i``. The UNet stage needs the VAE and CLIP stages' outputs (its text encoder is
the CLIP's frozen text tower); the judge stage uses the VAE if present. Every stage is seeded
and runs on 2 CPU threads; ``--steps`` overrides the stage's default step count.
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import time

# The dev machines are shared: with spinning OpenMP workers two busy processes on two cores slow
# each other several-fold. Set before torch starts its thread pool.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from opsnn_quant.zoo import shapes_clip, shapes_judge, shapes_pipeline
from opsnn_quant.zoo.shapes_data import generate

logger = logging.getLogger("opsnn_quant.zoo.training.train_shapes")

DEFAULT_STEPS = {"vae": 1500, "clip": 1500, "judge": 600, "unet": 4000}
STAGES = ("vae", "clip", "judge", "unet")


def setup(seed: int, threads: int = 2) -> torch.Generator:
    """Seed torch, set the thread count and return the stage's batch-order generator."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def lr_schedule(opt: torch.optim.Optimizer, steps: int, warmup: int) -> Any:
    """``LambdaLR``: linear warm-up over ``warmup`` steps, then cosine to 10 % at ``steps``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


class Progress:
    """Logs the mean loss and the speed every ``every`` steps."""

    def __init__(self, stage: str, steps: int, every: int = 100) -> None:
        self.stage, self.steps, self.every = stage, steps, every
        self.start = time.monotonic()
        self.total = 0.0
        self.count = 0

    def update(self, step: int, loss: float) -> None:
        self.total += loss
        self.count += 1
        if (step + 1) % self.every == 0 or step + 1 == self.steps:
            elapsed = time.monotonic() - self.start
            logger.info(
                "%s step %d/%d loss %.5f (%.2f steps/s, %.0f s)",
                self.stage,
                step + 1,
                self.steps,
                self.total / self.count,
                (step + 1) / elapsed,
                elapsed,
            )
            self.total, self.count = 0.0, 0


def to_unit(images: Any) -> torch.Tensor:
    """uint8 [n, H, W, 3] -> float [n, 3, H, W] in [-1, 1] (the VAE's range)."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def encode_posteriors(vae: Any, images: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the VAE posterior of uint8 ``[n, 32, 32, 3]`` images (chunks of 512)."""
    means, stds = [], []
    with torch.no_grad():
        for c in to_unit(images).split(512):
            dist = vae.encode(c).latent_dist
            means.append(dist.mean)
            stds.append(dist.std)
    return torch.cat(means), torch.cat(stds)


def train_vae(
    out: Path, steps: int, seed: int = 0, batch_size: int = 32, pool: int = 20000
) -> Path:
    """Train the VAE (L1 + MSE reconstruction, small KL) and measure its scaling factor.

    The VAE is convolutional, so the first 80 % of the steps train on 16×16 crops (4× cheaper
    per image on these shared CPUs); the last 20 % train on whole images, a quarter of the
    batch, so the mid-block attention and the norms settle on the 8×8 latents used later.
    """
    from diffusers import AutoencoderKL

    g = setup(seed)
    images, _, _ = generate("train", pool)
    data = to_unit(images)
    vae: Any = AutoencoderKL(**shapes_pipeline.vae_config())
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    sched = lr_schedule(opt, steps, warmup=100)
    progress = Progress("vae", steps)
    vae.train()
    for step in range(steps):
        if step < int(0.8 * steps):
            x = data[torch.randint(len(data), (batch_size,), generator=g)]
            # Offsets on the 4-pixel latent grid, so a crop's latents are whole latent cells.
            off = 4 * torch.randint(5, (batch_size, 2), generator=g)
            x = torch.stack(
                [im[:, r : r + 16, c : c + 16] for im, (r, c) in zip(x, off.tolist(), strict=True)]
            )
        else:
            x = data[torch.randint(len(data), (max(1, batch_size // 4),), generator=g)]
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample(generator=g)).sample
        # L1 keeps the flat shapes' edges sharp; the KL only keeps the latents bounded.
        loss = F.l1_loss(recon, x) + F.mse_loss(recon, x) + 1e-5 * posterior.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        progress.update(step, loss.item())
    vae.eval()
    with torch.no_grad():
        x = data[:2048]
        z = torch.cat([vae.encode(c).latent_dist.sample(generator=g) for c in x.split(256)])
        scaling = 1.0 / float(z.std())
        ev, _, _ = generate("eval", min(256, pool))
        xe = to_unit(ev)
        recon = vae.decode(vae.encode(xe).latent_dist.mode()).sample.clamp(-1, 1)
        mse = float(F.mse_loss((recon + 1) / 2, (xe + 1) / 2))
    vae.register_to_config(scaling_factor=round(scaling, 5))
    logger.info("vae scaling_factor %.5f, eval PSNR %.2f dB", scaling, -10 * math.log10(mse))
    target = out / "shapes-t2i" / "vae"
    vae.save_pretrained(str(target), safe_serialization=True)
    return target


def train_clip(
    out: Path, steps: int, seed: int = 0, batch_size: int = 64, pool: int = 40000
) -> Path:
    """Train the CLIP contrastively; captions equal within a batch count as positives."""
    from transformers import CLIPModel, CLIPProcessor, CLIPTokenizer

    from opsnn_quant.zoo.tokenizer_shapes import write_tokenizer_files

    g = setup(seed)
    target = out / "shapes-clip"
    write_tokenizer_files(target)
    tok = CLIPTokenizer.from_pretrained(str(target))  # a local dir: no hub lookup
    model = CLIPModel(shapes_clip.clip_config(len(tok), tok.bos_token_id, tok.eos_token_id))
    images, captions, _ = generate("train", pool)
    pixels = shapes_clip.pixel_values(images)
    unique = sorted(set(captions))
    ids = tok(unique, padding="max_length", truncation=True, return_tensors="pt")["input_ids"]
    lookup = {c: i for i, c in enumerate(unique)}
    cap_index = torch.tensor([lookup[c] for c in captions])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.05)
    sched = lr_schedule(opt, steps, warmup=200)
    progress = Progress("clip", steps)
    model.train()
    for step in range(steps):
        idx = torch.randint(len(pixels), (batch_size,), generator=g)
        cap = cap_index[idx]
        out_ = model(input_ids=ids[cap], pixel_values=pixels[idx])
        logits = out_.logits_per_image
        same = (cap[:, None] == cap[None, :]).float()
        targets = same / same.sum(dim=1, keepdim=True)
        loss = (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():  # CLIP's cap on the temperature
            model.logit_scale.clamp_(0, math.log(100))
        progress.update(step, loss.item())
    model.eval()
    model.save_pretrained(str(target), safe_serialization=True)
    CLIPProcessor(image_processor=shapes_clip.image_processor(), tokenizer=tok).save_pretrained(
        str(target)
    )
    acc = shapes_clip.retrieval_accuracy(model, shapes_clip.load_shapes_clip_processor(target))
    logger.info("clip retrieval top-1 among 16: %.4f", acc)
    return target


def _text_encoder(clip_dir: Path) -> Any:
    """The CLIP's text tower as a standalone ``CLIPTextModel`` (same weights)."""
    from transformers import CLIPModel, CLIPTextModel

    clip: Any = CLIPModel.from_pretrained(str(clip_dir), local_files_only=True)
    te: Any = CLIPTextModel(clip.config.text_config)
    # transformers 5 flattened CLIPTextModel (no .text_model wrapper); 4.x still has it.
    getattr(te, "text_model", te).load_state_dict(clip.text_model.state_dict())
    return te.eval()


def train_unet(
    out: Path,
    steps: int,
    seed: int = 0,
    batch_size: int = 64,
    pool: int = 40000,
    eval_every: int = 1000,
) -> Path:
    """Train the UNet (epsilon prediction, 10 % empty-caption dropout, EMA) and save the pipeline."""
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        DDPMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTokenizer

    g = setup(seed)
    vae: Any = AutoencoderKL.from_pretrained(str(out / "shapes-t2i" / "vae"), local_files_only=True)
    vae.eval()
    clip_dir = out / "shapes-clip"
    tok = CLIPTokenizer.from_pretrained(str(clip_dir), local_files_only=True)
    te = _text_encoder(clip_dir)
    images, captions, _ = generate("train", pool)
    unique = ["", *sorted(set(captions))]
    lookup = {c: i for i, c in enumerate(unique)}
    cap_index = torch.tensor([lookup[c] for c in captions])
    with torch.no_grad():
        # Embeddings exactly as StableDiffusionPipeline.encode_prompt computes them.
        ids = tok(unique, padding="max_length", truncation=True, return_tensors="pt")["input_ids"]
        emb = torch.cat([te(c)[0] for c in ids.split(512)])
    mean, std = encode_posteriors(vae, images)
    scaling = vae.config.scaling_factor
    unet: Any = UNet2DConditionModel(**shapes_pipeline.unet_config())
    ema = copy.deepcopy(unet).eval().requires_grad_(False)
    noise_sched: Any = DDPMScheduler(
        **{k: v for k, v in shapes_pipeline.scheduler_config().items() if k != "set_alpha_to_one"}
    )
    alphas = noise_sched.alphas_cumprod
    snr = alphas / (1 - alphas)
    opt = torch.optim.AdamW(unet.parameters(), lr=5e-4, weight_decay=0.0)
    sched = lr_schedule(opt, steps, warmup=300)
    progress = Progress("unet", steps)

    def build(model: Any) -> Any:
        return StableDiffusionPipeline(
            vae=vae,
            text_encoder=te,
            tokenizer=tok,
            unet=model,
            scheduler=DDIMScheduler(**shapes_pipeline.scheduler_config()),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )

    unet.train()
    for step in range(steps):
        idx = torch.randint(len(mean), (batch_size,), generator=g)
        latents = (mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=g)) * scaling
        cap = cap_index[idx]
        drop = torch.rand(batch_size, generator=g) < 0.1  # classifier-free guidance dropout
        cond = emb[torch.where(drop, torch.zeros_like(cap), cap)]
        noise = torch.randn(latents.shape, generator=g)
        t = torch.randint(0, noise_sched.config.num_train_timesteps, (batch_size,), generator=g)
        pred = unet(noise_sched.add_noise(latents, noise, t), t, cond).sample
        # Min-SNR-5 weighting: low-noise steps stop dominating the gradient, which speeds
        # convergence several-fold (Hang et al. 2023); for epsilon targets w = min(snr, 5) / snr.
        weight = (snr[t].clamp(max=5.0) / snr[t]).view(-1, 1, 1, 1)
        loss = (weight * (pred - noise) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            # EMA warms up (decay min(0.999, (1+s)/(10+s))) so early weights do not linger.
            decay = min(0.999, (1 + step) / (10 + step))
            for pe, p in zip(ema.parameters(), unet.parameters(), strict=True):
                pe.lerp_(p, 1 - decay)
        progress.update(step, loss.item())
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            # Looked up here, not at start: the judge may still be training in parallel.
            judge = maybe_judge(out)
            if judge is not None:
                scores = shapes_judge.t2i_scores(build(ema), judge, n=64)
                logger.info("unet step %d EMA judge scores %s", step + 1, scores)
    target = out / "shapes-t2i"
    pipe = build(ema)
    pipe.save_pretrained(str(target), safe_serialization=True)
    _portable_pipeline_files(target)
    judge = maybe_judge(out)
    if judge is not None:
        scores = shapes_judge.t2i_scores(shapes_pipeline.load_shapes_t2i(path=target), judge)
        logger.info("final judge scores on 128 eval prompts: %s", scores)
    return target


def _portable_pipeline_files(target: Path) -> None:
    """Make the saved pipeline loadable by transformers 4.x as well as 5.x.

    transformers 5 saves ``CLIPTextModel`` weights without the ``text_model.`` prefix and the
    tokenizer as ``tokenizer.json`` only; 4.x needs the prefix and the slow tokenizer's
    ``vocab.json``/``merges.txt``. transformers 5 loads both layouts.
    """
    from safetensors.torch import load_file, save_file

    from opsnn_quant.zoo.tokenizer_shapes import write_tokenizer_files

    write_tokenizer_files(target / "tokenizer")
    weights = target / "text_encoder" / "model.safetensors"
    state = load_file(str(weights))
    state = {k if k.startswith("text_model.") else f"text_model.{k}": v for k, v in state.items()}
    save_file(state, str(weights), metadata={"format": "pt"})


def maybe_judge(out: Path) -> Any:
    """The judge of ``out/shapes-judge`` if it has been trained, else ``None``."""
    if (out / "shapes-judge" / "config.json").is_file():
        return shapes_judge.load_shapes_judge(out / "shapes-judge")
    return None


def train(
    stage: str, out: str | Path, steps: int | None = None, seed: int = 0, **kwargs: Any
) -> None:
    """Run one stage (or ``all``: vae, clip, judge, unet in order).

    Args:
        stage: ``vae``, ``clip``, ``judge``, ``unet`` or ``all``.
        out: Weights root directory.
        steps: Optimizer steps (default: the stage's :data:`DEFAULT_STEPS`).
        seed: Seed of initialization and batch order.
        **kwargs: Stage options (``batch_size``, ``pool``).
    """
    root = Path(out)
    stages = STAGES if stage == "all" else (stage,)
    for name in stages:
        n = DEFAULT_STEPS[name] if steps is None else steps
        start = time.monotonic()
        if name == "vae":
            train_vae(root, n, seed, **kwargs)
        elif name == "clip":
            train_clip(root, n, seed, **kwargs)
        elif name == "judge":
            shapes_judge.train_judge(root, n, seed, **kwargs)
        else:
            train_unet(root, n, seed, **kwargs)
        logger.info("stage %s done in %.0f s", name, time.monotonic() - start)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=[*STAGES, "all"])
    parser.add_argument("--out", required=True, help="weights root, e.g. opsnn_quant/zoo/weights")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--pool", type=int, default=None, help="training images held in memory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    kwargs = {k: v for k, v in (("batch_size", args.batch_size), ("pool", args.pool)) if v}
    train(args.stage, args.out, args.steps, args.seed, **kwargs)


if __name__ == "__main__":
    main()
