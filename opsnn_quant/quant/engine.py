"""The arithmetic behind the engine table (:mod:`opsnn_quant.quant.engines`): each engine's
Linear on a frozen module's parameters (``Engine.rows``), and a quantized module's parameters in
the form a serving engine holds them (``QuantSpec.engine``).

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

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from opsnn_quant.ascend import engines
from opsnn_quant.quant.observers import MIN_SCALE
from opsnn_quant.types import Precision

if TYPE_CHECKING:
    from opsnn_quant.backends.base import QuantBackend
    from opsnn_quant.quant.qmodule import QuantModule

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


# ---- each engine's Linear on a frozen module's (M, K) rows (``Engine.rows``) -------------------


def opsnn_rows(module: QuantModule[Any], x2d: torch.Tensor, backend: QuantBackend) -> torch.Tensor:
    """(M, K) -> (M, N): this package's Ascend quant arithmetic (the backend's torch_npu ops or
    their CPU reference) on ``module``'s frozen parameters, in the rows' dtype."""
    spec = module.spec
    if spec.precision == Precision.W4A16:
        # (K // 8, N): the transposed view of the (N, K // 8) words npu_weight_quant_
        # batchmatmul takes (as npu_convert_weight_to_int4pack lays them out).
        packed_t = module.weight.reshape(module.out_n, module.in_k // 8).t()
        return backend.weight_quant_matmul(
            x2d,
            packed_t,
            module.weight_quantizer.scale,
            module.bias,
            group_size=spec.group_size or 0,
        )
    w_q_t = module.weight.reshape(module.out_n, module.in_k).t()
    if spec.precision == Precision.W8A16:
        return backend.weight_quant_matmul(x2d, w_q_t, module.weight_quantizer.scale, module.bias)
    wf = module.reference_weight(x2d, backend)
    out_dtype = TORCH_DTYPES[spec.output_dtype]
    iq = module.input_quantizer
    if spec.static_activations:
        g = iq.group_index()  # the step group's row of every static parameter, if grouped

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if g is None else t[g]

        offset = None if spec.activation_symmetric else pick(iq.offset).reshape(1).to(x2d.dtype)
        x_q = backend.quantize_static(x2d, pick(iq.inv_scale).to(x2d.dtype), offset)
        # fp16 output goes through the fixpipe's packed FP19 scale; bf16 takes fp32.
        scale = pick(module.deq_scale_packed if out_dtype == torch.float16 else module.deq_scale)
        y = backend.quant_matmul(
            x_q, w_q_t, scale, pertoken_scale=None, bias=pick(module.quant_bias),
            output_dtype=out_dtype, w_float_t=wf,
        )  # fmt: skip
    else:
        smooth = getattr(iq, "smooth_scales", None)
        smooth = None if smooth is None else smooth.to(x2d.dtype)
        x_q, tok_scale = backend.quantize_dynamic(x2d, smooth)
        y = backend.quant_matmul(
            x_q, w_q_t, module.weight_quantizer.scale, pertoken_scale=tok_scale,
            bias=module.bias, output_dtype=out_dtype, w_float_t=wf,
        )  # fmt: skip
    return y.to(x2d.dtype)


def mindie_sd_rows(
    module: QuantModule[Any], x2d: torch.Tensor, backend: QuantBackend
) -> torch.Tensor:
    """(M, K) -> (M, N) in the rows' dtype: MindIE-SD's Linear (:mod:`opsnn_quant.ascend.engines`)
    on ``module``'s parameters as its loader holds them (see
    :mod:`opsnn_quant.formats.mindie_sd`'s reader): activations times ``mul_scale`` in the
    engine dtype, the float32 bias of a weight-only Linear."""
    wf = module.reference_weight(x2d, backend)
    spec, iq = module.spec, module.input_quantizer
    dtype = TORCH_DTYPES[spec.output_dtype]
    w_t = module.weight.reshape(module.out_n, module.in_k).t()
    mul = getattr(iq, "mul_scale", None)
    if spec.weight_only:  # MindIE-SD holds the bias in float32
        y = engines.weight_only(x2d, w_t, module.weight_quantizer.scale, module.bias, dtype)
    elif spec.static_activations:
        g = iq.group_index()  # W8A8_TIMESTEP: the row of the step the loop is at
        rows = (lambda t: t) if g is None else (lambda t: t[g])
        offset = rows(iq.offset).reshape(1).to(torch.int8)
        # input_scale: bfloat16 in a bfloat16 model, float32 in a float16 one
        held = rows(iq.scale).reshape(1).to(dtype if dtype == torch.bfloat16 else torch.float32)
        y = engines.mindie_sd_static(
            x2d, w_t, rows(module.deq_scale), rows(module.quant_bias), held, offset, mul, dtype,
            wf,
        )  # fmt: skip
    else:
        scale = module.weight_quantizer.scale.to(dtype)
        bias = None if module.bias is None else module.bias.to(dtype)
        held = scale if dtype == torch.bfloat16 else scale.to(torch.float32)
        y = engines.mindie_sd_dynamic(x2d, w_t, held, bias, mul, dtype, wf)
    return y.to(x2d.dtype)


def vllm_ascend_rows(
    module: QuantModule[Any], x2d: torch.Tensor, backend: QuantBackend
) -> torch.Tensor:
    """(M, K) -> (M, N) in the rows' dtype: vLLM-Ascend's Linear
    (:mod:`opsnn_quant.ascend.engines`) on ``module``'s parameters as its loader holds them (see
    :mod:`opsnn_quant.formats.ascendv1`'s consumers): a SmoothQuant factor is folded into the
    norm before (the rows divided by it here), the bias in the params dtype."""
    wf = module.reference_weight(x2d, backend)
    spec, iq = module.spec, module.input_quantizer
    dtype = TORCH_DTYPES[spec.output_dtype]
    w_t = module.weight.reshape(module.out_n, module.in_k).t()
    folded = getattr(iq, "smooth", None)
    # what the norm with the factor divided into it hands the Linear
    x = x2d if folded is None else x2d.to(torch.float32) / folded
    bias = None if module.bias is None else module.bias.to(dtype)
    if spec.weight_only:
        y = engines.weight_only(x, w_t, module.weight_quantizer.scale, bias, dtype)
    elif spec.static_activations:
        offset = iq.offset.reshape(1).to(torch.int8)
        deq = module.deq_scale_packed if dtype == torch.float16 else module.deq_scale
        y = engines.vllm_ascend_static(
            x, w_t, deq, module.quant_bias, iq.scale.reshape(1).to(dtype), offset, dtype, wf
        )
    else:
        scale = module.weight_quantizer.scale.to(dtype)
        y = engines.vllm_ascend_dynamic(x, w_t, scale, bias, dtype, wf)
    return y.to(x2d.dtype)
