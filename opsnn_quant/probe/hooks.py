"""Which modules the probes watch, and small helpers to read tensors out of module calls."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import nn

PARAM_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.LayerNorm, nn.GroupNorm)
QUANTIZABLE = (nn.Linear, nn.Conv2d)
NORMS = (nn.LayerNorm, nn.GroupNorm)
# Blocks whose output is a residual sum (x + f(x)): watched for range only.
RESIDUAL_BLOCKS = {
    "ResnetBlock2D",
    "BasicTransformerBlock",  # also PixArt's blocks
    "Transformer2DModel",
    "CLIPEncoderLayer",
    "WhisperEncoderLayer",
    "WhisperDecoderLayer",
    # Transformer denoisers. The two-stream blocks return (context, image) states: the range
    # read is their first output; their norms' inputs watch both streams.
    "JointTransformerBlock",  # SD3 (MMDiT)
    "SD3SingleTransformerBlock",
    "FluxTransformerBlock",
    "FluxSingleTransformerBlock",
    "WanTransformerBlock",
    # T5 / UMT5 encoder layers (SD3, FLUX, PixArt, Wan text encoders) end in neither suffix.
    "T5Block",
    "UMT5Block",
}
GELU_TYPES = {"GELU", "GELUActivation", "NewGELUActivation", "QuickGELUActivation"}


def is_attention(module: nn.Module) -> bool:
    """An attention module whose q/k projections the softmax check can read (diffusers
    ``Attention``: ``to_q``/``to_k``/``heads``; transformers CLIP/Whisper: ``q_proj``/``k_proj``)."""
    diffusers = hasattr(module, "to_q") and hasattr(module, "to_k") and hasattr(module, "heads")
    return diffusers or (hasattr(module, "q_proj") and hasattr(module, "k_proj"))


def kind_of(module: nn.Module) -> str | None:
    """``param`` (leaf with weights), ``act`` (GELU), ``attention`` (its softmax scores),
    ``residual`` (block output) or None."""
    if isinstance(module, PARAM_TYPES):
        return "param"
    name = type(module).__name__
    if name in GELU_TYPES and not any(True for _ in module.parameters(recurse=False)):
        return "act"
    if is_attention(module):
        return "attention"
    if name in RESIDUAL_BLOCKS or name.endswith(("EncoderLayer", "DecoderLayer")):
        return "residual"
    return None


def watched_modules(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Named modules the overflow probe watches, with their kind, in model order."""
    out = {}
    for name, module in model.named_modules():
        if not name:
            continue
        kind = kind_of(module)
        if kind is not None:
            out[name] = (module, kind)
    return out


def count_params(module: nn.Module) -> int:
    """Parameters directly owned by the module (not its children)."""
    return sum(p.numel() for p in module.parameters(recurse=False))


def macs_of(module: nn.Module, out: torch.Tensor) -> int:
    """Multiply-accumulates of one Linear/Conv call producing ``out``."""
    if isinstance(module, nn.Linear):
        return out.numel() * module.in_features
    if isinstance(module, nn.Conv1d | nn.Conv2d):
        k = module.weight[0].numel()  # in_channels/groups * kernel
        return out.numel() * k
    return 0


_RERUN: contextvars.ContextVar[bool] = contextvars.ContextVar("opsnn_quant_rerun", default=False)


@contextlib.contextmanager
def rerunning() -> Iterator[None]:
    """While a watched module is re-run (fp16/bf16) inside its own hook: every probe hook
    stands aside (:func:`in_rerun`), so the re-run neither recurses nor adds statistics."""
    token = _RERUN.set(True)
    try:
        yield
    finally:
        _RERUN.reset(token)


def in_rerun() -> bool:
    """True inside :func:`rerunning`."""
    return _RERUN.get()
