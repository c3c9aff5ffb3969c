"""Independent float64 Whisper forward pass computed straight from CTranslate2 tensors.

It exists to check the converter: it uses none of transformers' modules and none of the
converter's name mapping, only the CT2 variable names and the architecture of the Whisper paper
(two GELU convolutions, pre-LayerNorm transformer blocks, a decoder with causal self-attention
and cross-attention, output projection tied to the token embeddings). Computing in float64 makes
it a reference that the float32 HF model must match to float32 rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opsnn_quant.zoo.ct2 import CT2Model

_LN_EPS = 1e-5


def _t(ct2: CT2Model, name: str) -> torch.Tensor:
    return torch.from_numpy(ct2.array(name)).to(torch.float64)


def _layer_norm(ct2: CT2Model, x: torch.Tensor, scope: str) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + _LN_EPS) * _t(ct2, f"{scope}/gamma") + _t(
        ct2, f"{scope}/beta"
    )


def _linear(ct2: CT2Model, x: torch.Tensor, scope: str) -> torch.Tensor:
    return x @ _t(ct2, f"{scope}/weight").T + _t(ct2, f"{scope}/bias")


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, causal: bool
) -> torch.Tensor:
    """Multi-head scaled dot-product attention on (time, d) inputs."""
    tq, d = q.shape
    dh = d // heads
    qh = q.reshape(tq, heads, dh).transpose(0, 1)
    kh = k.reshape(k.shape[0], heads, dh).transpose(0, 1)
    vh = v.reshape(v.shape[0], heads, dh).transpose(0, 1)
    scores = qh @ kh.transpose(1, 2) / math.sqrt(dh)
    if causal:
        mask = torch.ones(tq, k.shape[0], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return (scores.softmax(-1) @ vh).transpose(0, 1).reshape(tq, d)


def _ffn(ct2: CT2Model, x: torch.Tensor, scope: str) -> torch.Tensor:
    h = _layer_norm(ct2, x, f"{scope}/layer_norm")
    return _linear(ct2, _gelu(_linear(ct2, h, f"{scope}/linear_0")), f"{scope}/linear_1")


def encode(ct2: CT2Model, mel: torch.Tensor) -> torch.Tensor:
    """Encoder output (frames, d_model) for one log-mel spectrogram (n_mels, 3000)."""
    x = mel.to(torch.float64)[None]
    x = _gelu(
        F.conv1d(x, _t(ct2, "encoder/conv1/weight"), _t(ct2, "encoder/conv1/bias"), padding=1)
    )
    x = _gelu(
        F.conv1d(
            x, _t(ct2, "encoder/conv2/weight"), _t(ct2, "encoder/conv2/bias"), stride=2, padding=1
        )
    )
    x = x[0].T + _t(ct2, "encoder/position_encodings/encodings")[: x.shape[-1]]
    heads = int(ct2.scalar("encoder/num_heads"))
    layer = 0
    while f"encoder/layer_{layer}/ffn/linear_0/weight" in ct2:
        scope = f"encoder/layer_{layer}/self_attention"
        h = _layer_norm(ct2, x, f"{scope}/layer_norm")
        q, k, v = _linear(ct2, h, f"{scope}/linear_0").chunk(3, dim=-1)
        x = x + _linear(ct2, _attention(q, k, v, heads, causal=False), f"{scope}/linear_1")
        x = x + _ffn(ct2, x, f"encoder/layer_{layer}/ffn")
        layer += 1
    return _layer_norm(ct2, x, "encoder/layer_norm")


def decoder_logits(ct2: CT2Model, encoder_out: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Logits (len(tokens), vocab) of the decoder run on a token prefix, without a cache."""
    emb = _t(ct2, "decoder/embeddings/weight")
    x = emb[torch.tensor(tokens)] + _t(ct2, "decoder/position_encodings/encodings")[: len(tokens)]
    heads = int(ct2.scalar("decoder/num_heads"))
    layer = 0
    while f"decoder/layer_{layer}/ffn/linear_0/weight" in ct2:
        scope = f"decoder/layer_{layer}"
        h = _layer_norm(ct2, x, f"{scope}/self_attention/layer_norm")
        q, k, v = _linear(ct2, h, f"{scope}/self_attention/linear_0").chunk(3, dim=-1)
        attn = _attention(q, k, v, heads, causal=True)
        x = x + _linear(ct2, attn, f"{scope}/self_attention/linear_1")
        h = _layer_norm(ct2, x, f"{scope}/attention/layer_norm")
        q = _linear(ct2, h, f"{scope}/attention/linear_0")
        k, v = _linear(ct2, encoder_out, f"{scope}/attention/linear_1").chunk(2, dim=-1)
        attn = _attention(q, k, v, heads, causal=False)
        x = x + _linear(ct2, attn, f"{scope}/attention/linear_2")
        x = x + _ffn(ct2, x, f"{scope}/ffn")
        layer += 1
    x = _layer_norm(ct2, x, "decoder/layer_norm")
    return x @ _t(ct2, "decoder/projection/weight").T
