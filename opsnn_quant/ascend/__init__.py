"""Exact CPU/GPU reference of Ascend's quantization operators.

Pure tensor functions with the names, argument names, defaults and dtypes of torch_npu's, so a
caller can swap one for the other. See each function for its formula and source, and
``docs/fidelity.md`` for which modes are bit-exact, which are within a stated tolerance, and which
raise :class:`~opsnn_quant.errors.ShapeError`.
"""

from opsnn_quant.ascend.attention import (
    ascend_quant_fp16,
    fp16_round_away,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
    npu_prompt_flash_attention,
)
from opsnn_quant.ascend.attention_quant import (
    fa3_head_range,
    fa3_per_head_scale,
    fa3_quantize,
    smooth_k,
)
from opsnn_quant.ascend.dynamic import npu_dynamic_quant
from opsnn_quant.ascend.int4 import npu_convert_weight_to_int4pack, pack_int4, unpack_int4
from opsnn_quant.ascend.matmul import (
    int8_matmul_exact,
    npu_quant_matmul,
    quant_matmul_cached,
    quant_matmul_epilogue,
)
from opsnn_quant.ascend.params import (
    fp19,
    npu_trans_quant_param,
    requant_int8,
    unpack_quant_param,
)
from opsnn_quant.ascend.quantize import npu_quantize
from opsnn_quant.ascend.weight_matmul import npu_weight_quant_batchmatmul

__all__ = [
    "ascend_quant_fp16",
    "fa3_head_range",
    "fa3_per_head_scale",
    "fa3_quantize",
    "fp16_round_away",
    "fp19",
    "int8_matmul_exact",
    "npu_convert_weight_to_int4pack",
    "npu_dynamic_quant",
    "npu_fused_infer_attention_score",
    "npu_fused_infer_attention_score_v2",
    "npu_prompt_flash_attention",
    "npu_quant_matmul",
    "npu_quantize",
    "npu_trans_quant_param",
    "npu_weight_quant_batchmatmul",
    "pack_int4",
    "quant_matmul_cached",
    "quant_matmul_epilogue",
    "requant_int8",
    "smooth_k",
    "unpack_int4",
    "unpack_quant_param",
]
