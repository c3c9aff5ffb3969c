"""Train the shapes text-to-video model on CPU and save its ``WanPipeline``.

Usage::

    python -m opsnn_quant.zoo.training.train_shapes_t2v --out DIR [--vae-steps N] [--dit-steps N]

Two stages, each seeded: the video VAE (``AutoencoderKLWan``) reconstructs 5-frame windows of
the training clips (the causal encoder's first frame and one 4-frame chunk: every path a 9-frame
clip takes); then the transformer and the text encoder learn flow matching on the VAE's
normalised latents of whole 9-frame clips (velocity target, logit-normal sigmas, 10 % empty
captions for classifier-free guidance, EMA). Writes ``DIR/shapes-t2v``. Runs on ``--threads``
CPU threads (the same seed and thread count give the same weights).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import time

# Shared dev machines: passive OpenMP workers do not spin against the other user's processes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from opsnn_quant.zoo import shapes_t2v
from opsnn_quant.zoo.shapes_video import FRAMES, generate, vocabulary
from opsnn_quant.zoo.training.train_shapes import Progress, lr_schedule, setup

logger = logging.getLogger("opsnn_quant.zoo.training.train_shapes_t2v")

WINDOW = 5  # frames of a VAE training window: the first frame and one chunk of four


def to_video(clips: np.ndarray) -> torch.Tensor:
    """uint8 ``[n, F, H, W, 3]`` -> float ``[n, 3, F, H, W]`` in [-1, 1]."""
    x = torch.from_numpy(clips).float().div(127.5).sub(1.0)
    return x.permute(0, 4, 1, 2, 3).contiguous()


def train_vae(clips: np.ndarray, steps: int, g: torch.Generator, batch_size: int = 8) -> Any:
    """An ``AutoencoderKLWan`` trained to reconstruct 5-frame windows (L1 + MSE, tiny KL)."""
    from diffusers import AutoencoderKLWan

    vae: Any = AutoencoderKLWan(**shapes_t2v.vae_config())
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    sched = lr_schedule(opt, steps, warmup=100)
    progress = Progress("vae", steps)
    vae.train()
    for step in range(steps):
        idx = torch.randint(len(clips), (batch_size,), generator=g)
        first = int(torch.randint(FRAMES - WINDOW + 1, (1,), generator=g))
        x = to_video(clips[idx.numpy(), first : first + WINDOW])
        post = vae.encode(x).latent_dist
        z = post.mean + post.std * torch.randn(post.mean.shape, generator=g)
        rec = vae.decode(z).sample
        kl = 0.5 * (post.mean.pow(2) + post.var - 1.0 - post.logvar).mean()
        loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        progress.update(step, loss.item())
    return vae.eval().requires_grad_(False)


@torch.no_grad()
def encode_clips(vae: Any, clips: np.ndarray, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and std of whole clips: ``[n, z, 5, 8, 8]`` each."""
    means, stds = [], []
    for start in range(0, len(clips), chunk):
        dist = vae.encode(to_video(clips[start : start + chunk])).latent_dist
        means.append(dist.mean)
        stds.append(dist.std)
    return torch.cat(means), torch.cat(stds)


def build_text(out: Path) -> tuple[Any, Any]:
    """The tokenizer (written to ``out``) and a fresh UMT5 encoder over its vocabulary."""
    from transformers import CLIPTokenizer, UMT5Config, UMT5EncoderModel

    from opsnn_quant.zoo.tokenizer_shapes import write_tokenizer_files

    write_tokenizer_files(out, vocabulary())
    tok = CLIPTokenizer.from_pretrained(str(out), local_files_only=True)
    config = UMT5Config(
        **shapes_t2v.text_encoder_config(len(tok), tok.pad_token_id, tok.eos_token_id)
    )
    return tok, UMT5EncoderModel(config)


def text_rows(te: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What ``WanPipeline._get_t5_prompt_embeds`` gives the transformer: the encoder's rows of
    the real tokens, zeros after them."""
    hidden = te(ids, mask).last_hidden_state
    return hidden * mask.unsqueeze(-1).to(hidden.dtype)


def train_dit(
    vae: Any, clips: np.ndarray, captions: list[str], out: Path, steps: int,
    g: torch.Generator, batch_size: int = 32, lr: float = 5e-4,
) -> Any:  # fmt: skip
    """Transformer and text encoder trained jointly; returns the EMA pipeline."""
    from diffusers import WanTransformer3DModel

    from opsnn_quant.zoo.training.train_shapes_dit import zero_init

    tok, te = build_text(out / "tokenizer")
    unique = ["", *sorted(set(captions))]
    lookup = {c: i for i, c in enumerate(unique)}
    cap_index = torch.tensor([lookup[c] for c in captions])
    enc = tok(unique, padding="max_length", max_length=shapes_t2v.MAX_SEQUENCE_LENGTH,
              truncation=True, return_tensors="pt")  # fmt: skip
    mean, std = encode_clips(vae, clips)
    ch_mean = mean.mean(dim=(0, 2, 3, 4))
    # the spread of the sampled latents the transformer learns: the means' and the posterior's
    ch_var = (mean - ch_mean.view(1, -1, 1, 1, 1)).pow(2) + std.pow(2)
    ch_std = ch_var.mean(dim=(0, 2, 3, 4)).sqrt()
    lm = [round(float(v), 5) for v in ch_mean]
    ls = [round(float(v), 5) for v in ch_std]
    vae.register_to_config(latents_mean=lm, latents_std=ls)
    logger.info("latents mean %s std %s", lm, ls)
    m = torch.tensor(lm).view(1, -1, 1, 1, 1)
    s = torch.tensor(ls).view(1, -1, 1, 1, 1)

    model: Any = WanTransformer3DModel(**shapes_t2v.transformer_config())
    zero_init(model)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    ema_te = copy.deepcopy(te).eval().requires_grad_(False)
    params = [*model.parameters(), *te.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = lr_schedule(opt, steps, warmup=300)
    progress = Progress("dit", steps)
    model.train()
    te.train()
    for step in range(steps):
        idx = torch.randint(len(mean), (batch_size,), generator=g)
        z = mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=g)
        x0 = (z - m) / s
        cap = cap_index[idx]
        drop = torch.rand(batch_size, generator=g) < 0.1  # classifier-free guidance dropout
        cap = torch.where(drop, torch.zeros_like(cap), cap)
        context = text_rows(te, enc.input_ids[cap], enc.attention_mask[cap])
        noise = torch.randn(x0.shape, generator=g)
        sigma = torch.sigmoid(torch.randn(batch_size, generator=g)).view(-1, 1, 1, 1, 1)
        xt = (1 - sigma) * x0 + sigma * noise
        t = sigma.flatten() * shapes_t2v.NUM_TRAIN_TIMESTEPS
        pred = model(xt, t, context).sample
        loss = F.mse_loss(pred, noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            decay = min(0.999, (1 + step) / (10 + step))
            for pe, p in zip(ema.parameters(), model.parameters(), strict=True):
                pe.lerp_(p, 1 - decay)
            for pe, p in zip(ema_te.parameters(), te.parameters(), strict=True):
                pe.lerp_(p, 1 - decay)
        progress.update(step, loss.item())
    return _pipeline(ema, vae, ema_te, tok)


def _pipeline(transformer: Any, vae: Any, te: Any, tok: Any) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe: Any = WanPipeline(
        tokenizer=tok,
        text_encoder=te,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(**shapes_t2v.scheduler_config()),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def train(out: Path, vae_steps: int, dit_steps: int, seed: int = 0, threads: int = 1,
          pool: int = 8000) -> Path:  # fmt: skip
    """Both stages; the pipeline goes to ``out/shapes-t2v``."""
    g = setup(seed, threads)
    clips, captions, _ = generate("train", pool)
    vae = train_vae(clips, vae_steps, g)
    target = out / "shapes-t2v"
    pipe = train_dit(vae, clips, captions, target, dit_steps, g)
    pipe.save_pretrained(str(target), safe_serialization=True)
    from opsnn_quant.zoo.tokenizer_shapes import write_tokenizer_files

    # transformers 5 saves tokenizer.json only; 4.x reads the slow tokenizer's vocab/merges
    write_tokenizer_files(target / "tokenizer", vocabulary())
    return target


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True, help="weights root, e.g. opsnn_quant/zoo/weights")
    parser.add_argument("--vae-steps", type=int, default=1500)
    parser.add_argument("--dit-steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pool", type=int, default=8000, help="training clips held in memory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.monotonic()
    train(Path(args.out), args.vae_steps, args.dit_steps, args.seed, args.threads, args.pool)
    logger.info("shapes-t2v done in %.0f s", time.monotonic() - start)


if __name__ == "__main__":
    main()
