"""Core types shared by every part of opsnn-quant (see shared DESIGN.md, "Key types")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from torch import nn


class Precision(StrEnum):
    """Numeric format a module runs in.

    ``w8a8`` quantizes activations statically per tensor (AscendQuantV2), ``w8a8_dynamic``
    per token at run time (DynamicQuant), ``w8a16`` is weight-only int8 and ``w4a16`` weight-only
    int4 in groups along K (WeightQuantBatchMatmul, int4 weights packed eight per int32).
    ``a8`` is an attention module's int8 attention: query, key, value and softmax probabilities
    in int8 with static per-tensor scales (the fused int8 attention of Atlas A2,
    :mod:`opsnn_quant.quant.attention`); it has no weights.
    """

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    W8A8 = "w8a8"
    W8A8_DYNAMIC = "w8a8_dynamic"
    W8A16 = "w8a16"
    W4A16 = "w4a16"
    A8 = "a8"

    @property
    def is_float(self) -> bool:
        """True for the floating formats (no int8 arithmetic)."""
        return self in (Precision.FP32, Precision.FP16, Precision.BF16)

    @property
    def is_attention(self) -> bool:
        """True for the attention precision (``a8``: no weights, Q/K/V and P in int8)."""
        return self is Precision.A8

    @property
    def is_int8(self) -> bool:
        """True for every quantized format (int8 or int4 weights: the integer-matmul paths)."""
        return not self.is_float


class Modality(StrEnum):
    """Which part of a multimodal pipeline a module belongs to."""

    TEXT_ENCODER = "text_encoder"
    DENOISER = "denoiser"
    IMAGE_DECODER = "image_decoder"
    AUDIO_ENCODER = "audio_encoder"
    TEXT_DECODER = "text_decoder"
    OTHER = "other"


ForwardLoop: TypeAlias = Callable[["nn.Module"], None]
"""Runs a model over calibration data; the single calibration contract (as in ModelOpt)."""

Progress: TypeAlias = Callable[[str], None]
"""Told about each phase of a long run (a CLI progress line, a log message)."""


def match_prefix(name: str, prefixes: Iterable[str]) -> str | None:
    """The longest of ``prefixes`` that covers module ``name``; None when none does.

    A prefix covers a name when it is ``""`` (the whole model), the name itself or one of its
    dotted ancestors: ``"unet"`` covers ``"unet.conv_in"`` but not ``"unet2.conv_in"``. Module
    names are matched to modalities this way everywhere (adapters, policies, rule emission).
    """
    best: str | None = None
    for prefix in prefixes:
        covers = prefix == "" or name == prefix or name.startswith(prefix + ".")
        if covers and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


# Device names a model can be placed on (recipes, --device): resolved by backends.devices.
DEVICE_PATTERN = r"^(cpu|npu(:\d+)?|cuda(:\d+)?)$"
