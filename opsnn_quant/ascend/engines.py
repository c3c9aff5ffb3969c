"""The int8 Linear of each serving engine: torch_npu's quant ops composed as the engine calls them.

Each function takes the tensors as the engine holds them after loading (its load-time casts
already applied, see each docstring) and (M, K) rows of activations; it returns (M, N) rows in
the engine's dtype. This package's quantized modules (``QuantSpec.engine``) and the deploy-side
consumers that read an engine's files both run these, so that a module and the engine's view of
its export compute the same bits; the ops themselves are the exact references of this package.

MindIE-SD (``mindiesd`` 3.1.0 ``mindiesd/quantization/layer.py``, ``W8A8QuantLinear``; first
written at 3066189, whose arithmetic is the same): the activations
are cast to the engine dtype (``dtype`` kwarg of ``mindiesd.quantize``, bfloat16 by default),
multiplied by ``mul_scale`` (the non-fusion SmoothQuant form ``<linear>.div.mul_scale``, in that
dtype) when there is one, then

* static (``forward`` lines 332-349): ``npu_quantize(x, input_scale, input_offset, qint8,
  axis=-1)`` with the default ``div_mode=True`` (x / s + zp; ``input_scale`` repeated to K, in
  bfloat16 in a bfloat16 model and float32 in a float16 one, lines 276-303; ``input_offset`` in
  bfloat16 in a bfloat16 model, int8 in a float16 one: the same integer),
  then ``npu_quant_matmul(x_q, weight.T, deq_scale, bias=quant_bias, output_dtype=dtype)`` with
  ``deq_scale`` as stored (float32);
* dynamic (lines 350-363, load 305-318): ``npu_dynamic_quant(x)`` then ``npu_quant_matmul(x_q, weight.T,
  weight_scale, pertoken_scale=s_t, bias=bias, output_dtype=dtype)``; ``weight_scale`` squeezed
  and cast to the engine dtype at load (float32 through float16 in a float16 model), ``bias``
  cast to the engine dtype;
* weight-only (``WeightQuantLinear``, lines 182-232): ``npu_weight_quant_batchmatmul(x, weight.T,
  weight_scale (1, N) in the engine dtype, bias)``; no ``mul_scale`` (MindIE-SD accepts one but
  never applies it).

vLLM-Ascend (``vllm-ascend`` 0.23.0.post1 ``vllm_ascend/quantization/methods/w8a8_static.py``;
first written at 182b75e, same arithmetic; eager mode: the graph mode's norm-quant fusion divides
instead):

* static (``process_weights_after_loading`` lines 142-161, ``apply`` 73-140, the quantize through
  ``torch.ops.vllm.quantize``, ``ops/register_custom_ops.py`` 188-197): ``input_scale`` in
  the params dtype, ``reciprocal = 1 / input_scale`` computed in that dtype,
  ``input_offset`` int8 -> params dtype, ``npu_quantize(x, reciprocal, offset, qint8, -1, False)``
  (AscendQuantV3, x * (1/s) + zp in fp32), then ``npu_quant_matmul(x_q, weight, deq_scale,
  bias=quant_bias, output_dtype=params_dtype)`` with ``deq_scale`` int64 in a float16 model
  (the fp32 bits, which the kernel truncates to FP19) and float32 in a bfloat16 one;
* dynamic (``w8a8_dynamic.py`` ``apply`` lines 74-125, process 127-152): ``npu_dynamic_quant(x)``, ``weight_scale``
  flattened in the params dtype, ``npu_quant_matmul(x_q, weight, weight_scale,
  pertoken_scale=s_t, bias=bias, output_dtype=x.dtype)``;
* weight-only (``w8a16.py`` lines 29-78): ``npu_weight_quant_batchmatmul(x, weight,
  antiquant_scale=weight_scale, antiquant_offset=weight_offset, bias=bias)``, params dtype.

Where the engines' kernels were not readable (A2's Quantize / DynamicQuant internals) the
package's op references follow the ops-nn goldens; see :mod:`opsnn_quant.ascend.quantize`.
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend.dynamic import npu_dynamic_quant
from opsnn_quant.ascend.matmul import quant_matmul_cached
from opsnn_quant.ascend.quantize import npu_quantize
from opsnn_quant.ascend.weight_matmul import npu_weight_quant_batchmatmul


@torch.no_grad()
def mindie_sd_static(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    deq_scale: torch.Tensor,
    quant_bias: torch.Tensor,
    input_scale: torch.Tensor,
    input_offset: torch.Tensor,
    mul_scale: torch.Tensor | None,
    dtype: torch.dtype,
    weight_float_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """MindIE-SD's static W8A8 Linear on (M, K) rows.

    Args:
        x: (M, K) activations (any float dtype; cast to ``dtype`` first).
        weight_t: int8 (K, N), the transposed view of the stored (N, K) weight.
        deq_scale: float32 (N,), as stored.
        quant_bias: int32 (N,).
        input_scale: (1,) as loaded: bfloat16 in a bfloat16 model, float32 in a float16 one.
        input_offset: int8 (1,).
        mul_scale: (K,) in ``dtype`` or None.
        dtype: the engine dtype (bfloat16 or float16).
        weight_float_t: ``weight_t`` in float32 (a reference speed-up only).
    """
    k = weight_t.shape[0]
    xd = _smoothed(x, mul_scale, dtype)
    x_q = npu_quantize(xd, input_scale.repeat(k), input_offset.repeat(k), torch.qint8, -1)
    return quant_matmul_cached(
        x_q, weight_t, deq_scale, bias=quant_bias, output_dtype=dtype, x2_float=weight_float_t
    )


@torch.no_grad()
def mindie_sd_dynamic(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    mul_scale: torch.Tensor | None,
    dtype: torch.dtype,
    weight_float_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """MindIE-SD's dynamic (per-token) W8A8 Linear on (M, K) rows.

    Args:
        weight_scale: (N,) as loaded: bfloat16 in a bfloat16 model, float32 (rounded through
            float16) in a float16 one.
        bias: (N,) in ``dtype`` or None.
        x, weight_t, mul_scale, dtype, weight_float_t: as :func:`mindie_sd_static`.
    """
    x_q, token_scale = npu_dynamic_quant(_smoothed(x, mul_scale, dtype))
    return quant_matmul_cached(
        x_q, weight_t, weight_scale, pertoken_scale=token_scale, bias=bias, output_dtype=dtype,
        x2_float=weight_float_t,
    )  # fmt: skip


@torch.no_grad()
def vllm_ascend_static(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    deq_scale: torch.Tensor,
    quant_bias: torch.Tensor,
    input_scale: torch.Tensor,
    input_offset: torch.Tensor,
    dtype: torch.dtype,
    weight_float_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """vLLM-Ascend's static W8A8 Linear (``AscendW8A8LinearMethod``) on (M, K) rows.

    Args:
        x: (M, K) activations (cast to ``dtype``, the params dtype).
        weight_t: int8 (K, N).
        deq_scale: int64 (N,) in a float16 model (fp32 bits), float32 (N,) in a bfloat16 one.
        quant_bias: int32 (N,).
        input_scale: (1,) in ``dtype`` (the loader's ``copy_`` cast of the stored float32).
        input_offset: int8 (1,).
        dtype: the params dtype.
        weight_float_t: ``weight_t`` in float32 (a reference speed-up only).
    """
    k = weight_t.shape[0]
    reciprocal = 1 / input_scale.to(dtype).repeat(k)  # in the params dtype, as on the device
    offset = input_offset.to(torch.int8).repeat(k).to(dtype)
    x_q = npu_quantize(x.to(dtype), reciprocal, offset, torch.qint8, -1, False)
    return quant_matmul_cached(
        x_q, weight_t, deq_scale, bias=quant_bias, output_dtype=dtype, x2_float=weight_float_t
    )


@torch.no_grad()
def vllm_ascend_dynamic(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    weight_float_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """vLLM-Ascend's dynamic W8A8 Linear (``AscendW8A8DynamicLinearMethod``) on (M, K) rows.

    Args:
        weight_scale: (N,) in ``dtype`` (flattened, kept in the params dtype).
        bias: (N,) in ``dtype`` or None.
        x, weight_t, dtype, weight_float_t: as :func:`vllm_ascend_static`.
    """
    x_q, token_scale = npu_dynamic_quant(x.to(dtype))
    if weight_scale.dtype == torch.float16:
        # a float16 model passes its float16 weight_scale with per-token scaling, a combination
        # torch_npu's table does not list; the kernel's dequant runs in fp32: the fp16 value
        weight_scale = weight_scale.to(torch.float32)
    return quant_matmul_cached(
        x_q, weight_t, weight_scale, pertoken_scale=token_scale, bias=bias, output_dtype=dtype,
        x2_float=weight_float_t,
    )  # fmt: skip


@torch.no_grad()
def weight_only(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The engines' W8A16 Linear: ``npu_weight_quant_batchmatmul(x, weight.T, scale, bias)`` with
    activations and the (N,) per-channel scale in the engine dtype (symmetric weights: no
    offset).

    Args:
        x: (M, K) activations (cast to ``dtype``).
        weight_t: int8 (K, N).
        weight_scale: (N,) in ``dtype``.
        bias: (N,) or None.
        dtype: the engine dtype.
    """
    return npu_weight_quant_batchmatmul(
        x.to(dtype), weight_t, weight_scale.to(dtype).reshape(1, -1), bias=bias
    )


def _smoothed(x: torch.Tensor, mul_scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in the engine dtype, times MindIE-SD's ``mul_scale`` (an elementwise product in that
    dtype, rounded once) when there is one."""
    xd = x.to(dtype)
    return xd if mul_scale is None else xd * mul_scale.to(dtype)
