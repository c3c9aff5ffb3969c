"""Random-weight pipelines at the real widths of the users' models, at a depth of our choosing.

Used by ``bench_calibrate_scale.py`` (the ``flux-dev-width``, ``wan14b-width`` and
``whisper-large-v3-width`` rows) and by ``tests/benchmarks/test_depth_memory.py`` (narrower
settings of the same builders). Every builder writes a ``save_pretrained`` directory that the
recipe families load as they would a real checkpoint, and returns it with its parameter counts.

* :func:`build_flux`: a ``FluxPipeline`` whose transformer has FLUX.1-dev's widths (3072 hidden,
  24 heads x 128, ``joint_attention_dim`` 4096, pooled 768, guidance embedding, rope axes
  16/56/56), the T5-XXL encoder's widths (4096, d_ff 10240, 64 heads x 64, gated-GELU) and
  CLIP-L's (768, 3072, 12 heads) cut to ``text_layers`` layers, and FLUX's VAE (16 latent
  channels, 128/256/512/512); FLUX.1-dev has 19 double- and 38 single-stream blocks.
* :func:`build_wan`: a ``WanPipeline`` whose transformer has Wan2.1-T2V-14B's widths (5120, ffn
  13824, 40 heads x 128, text_dim 4096, freq_dim 256), umT5-XXL's widths cut to ``text_layers``
  and Wan2.1's VAE (96 base channels, z 16); Wan2.1-14B has 40 blocks.
* :func:`build_whisper`: Whisper large-v3's widths (d_model 1280, 20 heads, ffn 5120, 128 mel
  bins, vocabulary 51866) with the zoo tiny.en's tokenizer and generation config (so decoding
  starts as tiny.en's), and a 128-bin feature extractor; large-v3 has 32 + 32 layers.

The tokenizers are the tests' offline ones (``tests/tiny_pipelines.py``: a character CLIP BPE and
a small T5 unigram), so the embedding tables are small: their rows are not a real model's cost.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Full depths of the real checkpoints (the benchmark extrapolates to these).
FULL_DEPTH = {"flux": (19, 38), "wan": (40,), "whisper": (32, 32)}


def _tiny() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests import tiny_pipelines

    return tiny_pipelines


def n_params(module: Any) -> int:
    """Parameters of ``module``."""
    return sum(p.numel() for p in module.parameters())


def _block_params(model: Any, prefixes: tuple[str, ...]) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefixes))


def _t5(tok: Any, d_model: int, d_ff: int, heads: int, d_kv: int, layers: int, umt5: bool) -> Any:
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kwargs: dict[str, Any] = dict(vocab_size=len(tok), d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
                  num_heads=heads, relative_attention_num_buckets=32,
                  feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1)  # fmt: skip
    return UMT5EncoderModel(UMT5Config(**kwargs)) if umt5 else T5EncoderModel(T5Config(**kwargs))


def _clip(tok: Any, hidden: int, inter: int, heads: int, layers: int) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter, projection_dim=hidden,
        num_hidden_layers=layers, num_attention_heads=heads,
        max_position_embeddings=tok.model_max_length, bos_token_id=0, eos_token_id=1,
        pad_token_id=1))  # fmt: skip


def build_flux(
    path: Path,
    *,
    double: int,
    single: int,
    heads: int = 24,
    head_dim: int = 128,
    t5: tuple[int, int, int, int] = (4096, 10240, 64, 64),
    clip: tuple[int, int, int] = (768, 3072, 12),
    text_layers: int = 2,
    real_vae: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """A FluxPipeline (widths: FLUX.1-dev's by default) in ``path``; ``t5``: (d_model, d_ff,
    heads, d_kv; its width is the transformer's ``joint_attention_dim``); ``clip``: (hidden,
    intermediate, heads; its width is ``pooled_projection_dim``). Returns the parameter counts."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )

    tiny = _tiny()
    torch.manual_seed(seed)
    tok = tiny._clip_tokenizer(path / "_tok", max_length=77)
    t5_tok = tiny._t5_tokenizer(max_length=512)
    if real_vae:  # FLUX.1-dev's VAE
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=16, layers_per_block=2,
            block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, use_quant_conv=False,
            use_post_quant_conv=False, shift_factor=0.1159, scaling_factor=0.3611,
        )  # fmt: skip
        latent = 16
    else:
        vae = tiny._vae(4, post_quant_conv=False, shift_factor=0.1)
        latent = 4
    # rope axes sum to the head dim (FLUX.1-dev: 16, 56, 56 for 128)
    axes = (16, 56, 56) if head_dim == 128 else (head_dim // 4, head_dim // 4, head_dim // 2)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=4 * latent, num_layers=double, num_single_layers=single,
        attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=t5[0],
        pooled_projection_dim=clip[0], guidance_embeds=True, axes_dims_rope=axes,
    )  # fmt: skip
    d_model, d_ff, t5_heads, d_kv = t5
    pipe: Any = FluxPipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=_clip(tok, *clip, layers=text_layers),
        tokenizer=tok,
        text_encoder_2=_t5(t5_tok, d_model, d_ff, t5_heads, d_kv, text_layers, umt5=False),
        tokenizer_2=t5_tok,
    )
    pipe.save_pretrained(str(path))
    return {
        "params": sum(
            n_params(m) for m in (transformer, vae, pipe.text_encoder, pipe.text_encoder_2)
        ),
        "transformer_params": n_params(transformer),
        "block_params": _block_params(
            transformer, ("transformer_blocks.", "single_transformer_blocks.")
        ),
        "kind_params": (
            _block_params(transformer, ("transformer_blocks.",)),
            _block_params(transformer, ("single_transformer_blocks.",)),
        ),
        "blocks": (double, single),
    }


def build_wan(
    path: Path,
    *,
    blocks: int,
    heads: int = 40,
    head_dim: int = 128,
    ffn: int = 13824,
    text_dim: int = 4096,
    t5: tuple[int, int, int, int] = (4096, 10240, 64, 64),
    text_layers: int = 2,
    real_vae: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """A WanPipeline (widths: Wan2.1-T2V-14B's by default) in ``path``."""
    import torch
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    tiny = _tiny()
    torch.manual_seed(seed)
    t5_tok = tiny._t5_tokenizer(max_length=512)
    if real_vae:  # Wan2.1's VAE (diffusers' defaults)
        vae = AutoencoderKLWan(base_dim=96, z_dim=16)
        z = 16
    else:
        vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1], num_res_blocks=1,
                               temperal_downsample=[True], latents_mean=[0.0] * 4,
                               latents_std=[1.0] * 4, scale_factor_temporal=2,
                               scale_factor_spatial=2)  # fmt: skip
        z = 4
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
        in_channels=z, out_channels=z, text_dim=text_dim, freq_dim=256, ffn_dim=ffn,
        num_layers=blocks, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
        rope_max_seq_len=1024,
    )  # fmt: skip
    d_model, d_ff, t5_heads, d_kv = t5
    pipe: Any = WanPipeline(
        transformer=transformer,
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
        vae=vae,
        text_encoder=_t5(t5_tok, d_model, d_ff, t5_heads, d_kv, text_layers, umt5=True),
        tokenizer=t5_tok,
    )
    pipe.save_pretrained(str(path))
    return {
        "params": sum(n_params(m) for m in (transformer, vae, pipe.text_encoder)),
        "transformer_params": n_params(transformer),
        "block_params": _block_params(transformer, ("blocks.",)),
        "kind_params": (_block_params(transformer, ("blocks.",)),),
        "blocks": (blocks,),
    }


def build_whisper(
    path: Path,
    *,
    encoder_layers: int,
    decoder_layers: int,
    d_model: int = 1280,
    heads: int = 20,
    ffn: int = 5120,
    mel_bins: int = 128,
    vocab: int = 51866,
    seed: int = 0,
) -> dict[str, Any]:
    """A Whisper model (widths: large-v3's by default) with the zoo tiny.en's tokenizer and
    generation config and a ``mel_bins`` feature extractor, in ``path``."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    from opsnn_quant.sources import model_path

    torch.manual_seed(seed)
    tiny = model_path("zoo:whisper-tiny.en")
    cfg = WhisperConfig.from_pretrained(str(tiny))
    for key, value in (("d_model", d_model), ("encoder_layers", encoder_layers),
                       ("decoder_layers", decoder_layers), ("encoder_attention_heads", heads),
                       ("decoder_attention_heads", heads), ("encoder_ffn_dim", ffn),
                       ("decoder_ffn_dim", ffn), ("num_mel_bins", mel_bins),
                       ("vocab_size", max(vocab, cfg.vocab_size))):  # fmt: skip
        setattr(cfg, key, value)
    model = WhisperForConditionalGeneration(cfg)
    model.generation_config = WhisperForConditionalGeneration.from_pretrained(
        str(tiny)
    ).generation_config
    model.save_pretrained(str(path), safe_serialization=True)
    processor = WhisperProcessor.from_pretrained(str(tiny))
    processor.feature_extractor = WhisperFeatureExtractor(feature_size=mel_bins)
    processor.save_pretrained(str(path))
    return {
        "params": n_params(model),
        "transformer_params": n_params(model),
        "block_params": _block_params(model, ("model.encoder.layers.", "model.decoder.layers.")),
        "kind_params": (
            _block_params(model, ("model.encoder.layers.",)),
            _block_params(model, ("model.decoder.layers.",)),
        ),
        "blocks": (encoder_layers, decoder_layers),
    }
