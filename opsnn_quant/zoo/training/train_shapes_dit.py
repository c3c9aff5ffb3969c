"""Train the shapes diffusion transformer (stage ``dit``) on CPU and save its SD3 pipeline.

Usage::

    python -m opsnn_quant.zoo.training.train_shapes_dit --out DIR --steps N --seed S [--zoo ZOO]

Reads the trained shapes VAE (``ZOO/shapes-t2i/vae``), CLIP (``ZOO/shapes-clip``) and, for the
progress scores, judge (``ZOO/shapes-judge``); ``ZOO`` defaults to the committed weights root.
Only the transformer is trained: rectified flow (velocity target, logit-normal sigmas), 10 %
empty-caption dropout for classifier-free guidance, EMA. Writes the whole pipeline to
``DIR/shapes-dit``. Seeded; runs on ``--threads`` CPU threads (default 1; the same seed and
thread count give the same weights).
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import time

# Shared dev machines: passive OpenMP workers do not spin against the other user's processes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from opsnn_quant.zoo import shapes_dit
from opsnn_quant.zoo.shapes_data import generate
from opsnn_quant.zoo.training.train_shapes import (
    Progress,
    encode_posteriors,
    lr_schedule,
    maybe_judge,
    setup,
)

logger = logging.getLogger("opsnn_quant.zoo.training.train_shapes_dit")

DEFAULT_STEPS = 6000
DEFAULT_ZOO = Path(__file__).parent.parent / "weights"
# The pipeline appends max_sequence_length zero tokens without T5 (256 by default): training
# covers every count up to this one.
MAX_T5_TOKENS = 256


def build_text_encoder(clip_dir: Path) -> Any:
    """The shapes CLIP's text tower + text projection as a ``CLIPTextModelWithProjection``."""
    from transformers import CLIPModel, CLIPTextModelWithProjection

    clip: Any = CLIPModel.from_pretrained(str(clip_dir), local_files_only=True)
    config = copy.deepcopy(clip.config.text_config)
    # The text config carries transformers' default 512; the CLIP projects to 128.
    config.projection_dim = clip.config.projection_dim
    te: Any = CLIPTextModelWithProjection(config)
    te.text_model.load_state_dict(clip.text_model.state_dict())
    te.text_projection.load_state_dict(clip.text_projection.state_dict())
    return te.eval()


def clip_prompt_embeds(te: Any, tok: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """One CLIP's share of ``StableDiffusion3Pipeline.encode_prompt``.

    Returns:
        ``(penultimate hidden states [n, 24, 128], projected pooled output [n, 128])``.
    """
    ids = tok(prompts, padding="max_length", truncation=True, return_tensors="pt")["input_ids"]
    hidden, pooled = [], []
    with torch.no_grad():
        for chunk in ids.split(512):
            out = te(chunk, output_hidden_states=True)
            hidden.append(out.hidden_states[-2])
            pooled.append(out[0])
    return torch.cat(hidden), torch.cat(pooled)


def latent_normalization(mean: torch.Tensor) -> tuple[float, float]:
    """``(shift_factor, scaling_factor)`` so that ``(z - shift) * scale`` has mean 0, std 1."""
    shift = float(mean.mean())
    return round(shift, 5), round(1.0 / float((mean - shift).std()), 5)


def zero_init(model: Any) -> None:
    """adaLN-Zero (Peebles & Xie 2023): modulations and output start at 0, blocks as identities."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and (
            name.endswith("norm1.linear")
            or name.endswith("norm1_context.linear")
            or name in ("norm_out.linear", "proj_out")
        ):
            torch.nn.init.zeros_(module.weight)
            torch.nn.init.zeros_(module.bias)


def sample_t5_tokens(batch_size: int, g: torch.Generator) -> torch.Tensor:
    """Per-sample zero-token counts: 0 (the demo), 256 (SD3's default), log-uniform in 1..256.

    Each of the three a third of the time, so any ``max_sequence_length`` a caller passes has
    been trained for.
    """
    u = torch.rand(batch_size, generator=g)
    log_uniform = torch.exp(torch.rand(batch_size, generator=g) * math.log(MAX_T5_TOKENS)).round()
    n = torch.where(u < 1 / 3, 0.0, torch.where(u < 2 / 3, float(MAX_T5_TOKENS), log_uniform))
    return n


class ZeroTokenAttnProcessor:
    """``JointAttnProcessor2_0`` whose last context token weighs as ``counts`` identical tokens.

    The pipeline without T5 appends n zero rows to the context; they stay identical through
    every block (all per-token maps, the same attention for each), so their keys form one group
    whose softmax weight is n times one key's: an additive ``log n`` on one key is exact, and
    ``-inf`` drops it (n = 0). Training only; the saved model uses diffusers' processor.
    """

    def __init__(self) -> None:
        self.counts = torch.zeros(1)

    def _bias(self, length: int) -> torch.Tensor:
        bias = torch.zeros(len(self.counts), 1, 1, length)
        bias[:, 0, 0, -1] = torch.log(self.counts)  # log 0 = -inf
        return bias

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``JointAttnProcessor2_0.__call__`` (diffusers 0.42), plus the key bias."""
        assert encoder_hidden_states is not None  # joint blocks always pass the context
        b, n_img = hidden_states.shape[:2]

        def heads(x: torch.Tensor, norm: Any) -> torch.Tensor:
            x = x.view(b, -1, attn.heads, x.shape[-1] // attn.heads).transpose(1, 2)
            return norm(x) if norm is not None else x

        q = torch.cat(
            [heads(attn.to_q(hidden_states), attn.norm_q),
             heads(attn.add_q_proj(encoder_hidden_states), attn.norm_added_q)], dim=2,
        )  # fmt: skip
        k = torch.cat(
            [heads(attn.to_k(hidden_states), attn.norm_k),
             heads(attn.add_k_proj(encoder_hidden_states), attn.norm_added_k)], dim=2,
        )  # fmt: skip
        v = torch.cat(
            [heads(attn.to_v(hidden_states), None),
             heads(attn.add_v_proj(encoder_hidden_states), None)], dim=2,
        )  # fmt: skip
        mask = self._bias(k.shape[2]).to(dtype=q.dtype, device=q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        out = out.transpose(1, 2).reshape(b, -1, attn.heads * q.shape[-1]).to(q.dtype)
        img, ctx = out[:, :n_img], out[:, n_img:]
        if not attn.context_pre_only:
            ctx = attn.to_add_out(ctx)
        return attn.to_out[1](attn.to_out[0](img)), ctx


def train_dit(
    out: Path,
    steps: int,
    seed: int = 0,
    zoo: Path = DEFAULT_ZOO,
    batch_size: int = 64,
    pool: int = 40000,
    lr: float = 5e-4,
    threads: int = 1,
    eval_every: int = 1000,
    judge_prompts: int = 128,
) -> Path:
    """Train the SD3 transformer on the frozen zoo VAE and CLIP text tower; save the pipeline.

    Args:
        out: Weights root; the pipeline goes to ``out/shapes-dit``.
        steps: Optimizer steps.
        seed: Seed of initialization, batch order and noise.
        zoo: Root holding ``shapes-t2i/vae``, ``shapes-clip`` and ``shapes-judge``.
        batch_size: Images per step.
        pool: Training images held in memory (as VAE posteriors).
        lr: Peak AdamW learning rate.
        threads: CPU threads.
        eval_every: Log the EMA's judge scores on 64 held-out prompts this often (0: never).
        judge_prompts: Held-out prompts of the final judge scores (0: skip them).

    Returns:
        The pipeline directory.
    """
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTokenizer

    g = setup(seed, threads)
    vae: Any = AutoencoderKL.from_pretrained(str(zoo / "shapes-t2i" / "vae"), local_files_only=True)
    vae.eval()
    tok = CLIPTokenizer.from_pretrained(str(zoo / "shapes-clip"), local_files_only=True)
    te = build_text_encoder(zoo / "shapes-clip")
    images, captions, _ = generate("train", pool)
    unique = ["", *sorted(set(captions))]
    lookup = {c: i for i, c in enumerate(unique)}
    cap_index = torch.tensor([lookup[c] for c in captions])
    # Both SD3 text encoders are this tower, so one copy of its embeddings serves both halves.
    hidden, pooled = clip_prompt_embeds(te, tok, unique)
    mean, std = encode_posteriors(vae, images)
    shift, scale = latent_normalization(mean)
    # A relative provenance instead of this machine's absolute path of the source directory.
    vae.register_to_config(_name_or_path="shapes-t2i/vae", shift_factor=shift, scaling_factor=scale)
    logger.info("latents: shift_factor %.5f scaling_factor %.5f", shift, scale)

    model: Any = SD3Transformer2DModel(**shapes_dit.transformer_config())
    zero_init(model)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    # Training sees one zero token whose attention weight counts as n tokens: exactly the n
    # identical zero tokens the pipeline appends, at the cost of one.
    processor = ZeroTokenAttnProcessor()
    model.set_attn_processor(processor)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("dit: %d parameters (%.2f MB fp32)", n_params, 4 * n_params / 1e6)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = lr_schedule(opt, steps, warmup=300)
    progress = Progress("dit", steps)

    def build(transformer: Any) -> Any:
        return _pipeline(transformer, vae, te, tok)

    model.train()
    for step in range(steps):
        idx = torch.randint(len(mean), (batch_size,), generator=g)
        z = mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=g)
        x0 = (z - shift) * scale
        cap = cap_index[idx]
        drop = torch.rand(batch_size, generator=g) < 0.1  # classifier-free guidance dropout
        cap = torch.where(drop, torch.zeros_like(cap), cap)
        clip = torch.cat([hidden[cap], hidden[cap]], dim=-1)
        context = torch.cat([clip, torch.zeros(batch_size, 1, clip.shape[-1])], dim=1)
        cond = torch.cat([pooled[cap], pooled[cap]], dim=-1)
        processor.counts = sample_t5_tokens(batch_size, g)
        noise = torch.randn(x0.shape, generator=g)
        # SD3's logit-normal sigmas: most weight on the middle of the noise range.
        sigma = torch.sigmoid(torch.randn(batch_size, generator=g)).view(-1, 1, 1, 1)
        xt = (1 - sigma) * x0 + sigma * noise
        pred = model(xt, context, cond, sigma.flatten() * shapes_dit.NUM_TRAIN_TIMESTEPS).sample
        loss = F.mse_loss(pred, noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            # EMA warms up (decay min(0.999, (1+s)/(10+s))) so early weights do not linger.
            decay = min(0.999, (1 + step) / (10 + step))
            for pe, p in zip(ema.parameters(), model.parameters(), strict=True):
                pe.lerp_(p, 1 - decay)
        progress.update(step, loss.item())
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            judge = maybe_judge(zoo)
            if judge is not None:
                logger.info("dit step %d EMA %s", step + 1, judge_scores(build(ema), judge, 64))
    target = out / "shapes-dit"
    build(ema).save_pretrained(str(target), safe_serialization=True)
    _portable_tokenizers(target)
    judge = maybe_judge(zoo) if judge_prompts else None
    if judge is not None:
        scores = judge_scores(shapes_dit.load_shapes_dit(path=target), judge, judge_prompts)
        logger.info("final judge scores on %d eval prompts: %s", judge_prompts, scores)
    return target


def _pipeline(transformer: Any, vae: Any, te: Any, tok: Any) -> Any:
    """The SD3 pipeline around ``transformer``: both CLIP slots hold copies of ``te``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    pipe: Any = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(**shapes_dit.scheduler_config()),
        vae=vae,
        text_encoder=te,
        tokenizer=tok,
        # Separate modules, so that quantizing or hooking one text encoder leaves the other be.
        text_encoder_2=copy.deepcopy(te),
        tokenizer_2=copy.deepcopy(tok),
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def judge_scores(pipe: Any, judge: Any, n: int) -> dict[str, float]:
    """The gate's judge accuracies on ``n`` held-out prompts at the demo sampling settings."""
    from opsnn_quant.zoo.training.shapes_report import judge_accuracy

    return judge_accuracy(pipe, "shapes-dit", judge, n)[0]


def _portable_tokenizers(target: Path) -> None:
    # transformers 5 saves tokenizer.json only; 4.x needs the slow tokenizer's vocab/merges.
    from opsnn_quant.zoo.tokenizer_shapes import write_tokenizer_files

    for name in ("tokenizer", "tokenizer_2"):
        write_tokenizer_files(target / name)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="weights root, e.g. opsnn_quant/zoo/weights")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zoo", type=Path, default=DEFAULT_ZOO, help="root of the VAE/CLIP/judge")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--pool", type=int, default=40000, help="training images held in memory")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=1000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.monotonic()
    train_dit(
        Path(args.out),
        args.steps,
        args.seed,
        zoo=args.zoo,
        batch_size=args.batch_size,
        pool=args.pool,
        lr=args.lr,
        threads=args.threads,
        eval_every=args.eval_every,
    )
    logger.info("stage dit done in %.0f s", time.monotonic() - start)


if __name__ == "__main__":
    main()
