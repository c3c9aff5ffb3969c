"""A quantized module's parameters in the form a serving engine holds them (``QuantSpec.engine``,
its entry of :mod:`opsnn_quant.quant.engines`: ``Engine.input_scale``, ``Engine.deq_scale_pack``).

The engines keep some scales in their model dtype (bfloat16/float16) and compute with those
roundings; a module made for an engine chooses its parameters so that the rounded values are the
ones it means:

* the activation scale an engine quantizes with: MindIE-SD rounds the stored float32
  ``input_scale`` to bfloat16 in a bfloat16 model (float32 in a float16 one) and divides by it;
  vLLM-Ascend casts it to the params dtype and multiplies by ``1 / input_scale`` computed in that
  dtype. The module keeps the stored value and dequantizes with the scale that is effectively
  applied (:func:`mindie_sd_input_scale`, :func:`vllm_ascend_input_scale`), so ``deq_scale``
  and ``quant_bias`` match it;
* weight scales an engine keeps in its dtype (per-token and weight-only Linears): rounded up to a
  representable value before the weight is quantized (:func:`round_up_to`), so the int8 values
  never need clipping and the engine's scale is the one they were made with;
* MindIE-SD's ``mul_scale`` (``1 / s`` of SmoothQuant in the model dtype): the weight is
  smoothed with the factor it effectively undoes, ``1 / float(mul_scale)`` (:func:`mul_scale_of`).
"""

from __future__ import annotations

import numpy as np
import torch

from opsnn_quant.quant.observers import MIN_SCALE

# a spec's output dtype name -> torch dtype (the engine dtype of a module made for an engine)
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# the float dtypes whose positive values' bit patterns increase with the value
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


@torch.no_grad()
def round_up_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The smallest ``dtype`` value >= each positive float32 value, returned as float32."""
    v = values.to(torch.float32)
    r = v.to(dtype)
    low = r.to(torch.float32) < v
    if bool(low.any()):
        bumped = (r.view(_BITS[dtype]) + 1).view(dtype)  # the next larger positive value
        r = torch.where(low, bumped, r)
    return r.to(torch.float32)


@torch.no_grad()
def mul_scale_of(smooth: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """MindIE-SD's ``mul_scale`` for SmoothQuant factors ``smooth`` (K,), and the factor it
    effectively divides the activations by.

    Returns:
        ``(mul_scale, factor)``: ``dtype(1 / s)`` (K,) and ``1 / float(mul_scale)`` in float32
        (the factor the weight is multiplied by before quantizing).
    """
    mul = (1.0 / smooth.to(torch.float64)).to(dtype)
    factor = (1.0 / mul.to(torch.float64)).to(torch.float32)
    return mul, factor


def calibrated_input_scale(scale: float, dtype: torch.dtype) -> tuple[float, float]:
    """This package's arithmetic: the calibrated ``input_scale`` is stored and applied as is
    (``Engine.input_scale`` of ``opsnn``)."""
    return scale, scale


@torch.no_grad()
def mindie_sd_input_scale(scale: float, dtype: torch.dtype) -> tuple[float, float]:
    """MindIE-SD's ``input_scale`` for a calibrated static scale in a ``dtype`` model:
    ``(stored, effective)``, both exact in float32. A bfloat16 model holds
    ``input_scale.to(bfloat16)``, a float16 one the float32 as stored, and divides by it."""
    s32 = torch.tensor([max(scale, MIN_SCALE)], dtype=torch.float32)
    stored = s32.to(torch.bfloat16).to(torch.float32) if dtype == torch.bfloat16 else s32
    return float(stored), float(stored)


@torch.no_grad()
def vllm_ascend_input_scale(scale: float, dtype: torch.dtype) -> tuple[float, float]:
    """vLLM-Ascend's ``input_scale`` for a calibrated static scale in a ``dtype`` model:
    ``(stored, effective)``, both exact in float32. It holds ``input_scale`` in the params dtype
    and multiplies by its reciprocal computed in that dtype (as on load)."""
    held = torch.tensor([max(scale, MIN_SCALE)], dtype=torch.float32).to(dtype)
    multiplier = 1 / held
    return float(held.to(torch.float32)), 1.0 / float(multiplier.to(torch.float64))


@torch.no_grad()
def deqscale2int64(deq_scale: torch.Tensor) -> torch.Tensor:
    """The int64 ``deq_scale`` of a float16 AscendV1 model: the float32 bits, sign-extended
    (msModelSlim ``save/utils/deqscale.py`` ``deqscale2int64``; the kernel keeps the top 19
    bits, as it does of ``npu_trans_quant_param``'s packing)."""
    bits = np.frombuffer(deq_scale.to(torch.float32).cpu().numpy().tobytes(), dtype=np.int32)
    return torch.from_numpy(bits.astype(np.int64)).reshape(deq_scale.shape)
