"""A CPU stand-in for ``torch_npu``: only on the engine conformance tests' PYTHONPATH.

NOT torch_npu. It lets an engine's own, unmodified Python code (MindIE-SD 3.1.0, vllm-ascend
0.23.0.post1 on vLLM 0.23.0, from PyPI) import and run on a machine without an NPU: it reports no
device (so the engine loads none of its native libraries) and its operators are this project's
exact CPU references (``opsnn_quant.ascend``), so what the engine computes is its own code's calls
into Ascend's arithmetic, not our modules.

What each name satisfies (``M`` = the mindiesd 3.1.0 package, ``A`` = vllm_ascend 0.23.0.post1):

- ``npu.device_count() -> 0``, ``npu.is_available() -> False``: ``M/utils/utils.py:16-28``
  ``is_npu_available``, called at import (so ``M/layers/register_ops.py:88-89`` loads no
  ``libPTAExtensionOPS.so``), and ``M/utils/get_platform.py:28-53`` ``get_npu_device``.
- ``npu.config.allow_internal_format``: assigned at import, ``M/layers/moe/moe_mlp.py:20``.
  (These three names are all that ``import mindiesd`` touches: traced.)
- ``npu.get_soc_version``: ``M/utils/get_platform.py:33`` (not reached with no device: raises).
- ``npu.empty_cache``: ``M/quantization/quantize.py:422``, the end of ``quantize()``.
- ``npu.current_device`` (``M/layers/triton_utils.py:44``), ``npu.synchronize``
  (``M/layers/flash_attn/attention_func.py:197``), ``npu.Stream``/``Event``/``stream``/
  ``current_stream`` (``M/offload.py:173-233``; class annotations read at import in
  ``A/ops/fused_moe/fused_moe.py:73-75``, ``prepare_finalize.py:52``): device API names.
- ``npu.NPUGraph``, ``npu.ExternalEvent``, ``_C._NPUTaskGroupHandle``: class annotations that
  ``A/compilation/acl_graph.py:57,294,296`` evaluates when vLLM-Ascend's attention backend
  (``A/attention/attention_v1.py:59``) is imported to build a model's attention layers; never
  instantiated here.
- ``npu_quantize``: ``M/quantization/layer.py:339-345`` (static W8A8: ``scales=``,
  ``zero_points=``, ``dtype=torch.qint8``, ``axis=-1``, divide mode by default) and 424-434
  (timestep); ``A/ops/register_custom_ops.py:191`` (``torch.ops.vllm.quantize`` of the static
  W8A8 Linear: positional, ``(x, 1 / input_scale, input_offset, torch.qint8, -1, False)``,
  multiply mode).
- ``npu_quant_matmul``: ``M/quantization/layer.py:347-363`` and 436-452;
  ``A/quantization/methods/w8a8_static.py:133-139`` (``deq_scale``, ``bias=quant_bias``,
  ``output_dtype=params_dtype``), ``w8a8_dynamic.py:115-121`` (``pertoken_scale=``).
- ``npu_dynamic_quant``: ``M/quantization/layer.py:352-354`` and 441-443;
  ``A/quantization/methods/w8a8_dynamic.py:82`` (``dst_type=torch.int8``).
- ``npu_weight_quant_batchmatmul``: ``M/quantization/layer.py:217`` (W8A16);
  ``A/quantization/methods/w8a16.py:65``.
- ``npu_format_cast`` (identity: the CPU has no NZ layout): the ``use_nz`` paths
  (``M/quantization/layer.py:196``, 315), off by default; ``A/utils.py:298`` ``maybe_trans_nz``
  (vLLM-Ascend casts int8 weights to NZ by default, ``VLLM_ASCEND_ENABLE_NZ=1``);
  ``get_npu_format``: ``M/layers/moe/moe_mlp.py:24``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from opsnn_quant.ascend import (  # the exact references, with torch_npu's signatures
    npu_dynamic_quant,
    npu_quant_matmul,
    npu_quantize,
    npu_weight_quant_batchmatmul,
)
from torch_npu import npu  # the device namespace

__version__ = "0.0.0+cpu-stand-in"
STAND_IN = True  # a test can assert it runs against this, not a real torch_npu

_ND = 2  # ACL_FORMAT_ND


def npu_format_cast(t: torch.Tensor, acl_format: int, customize_dtype: Any = None) -> torch.Tensor:
    """Identity: the CPU has no private (NZ) layout."""
    return t


def get_npu_format(t: torch.Tensor) -> int:
    return _ND


class _NPUTaskGroupHandle:  # (annotation only: vllm_ascend/compilation/acl_graph.py:296)
    pass


_C = types.ModuleType("torch_npu._C")  # torch_npu's extension module: only the names read at import
_C._NPUTaskGroupHandle = _NPUTaskGroupHandle  # type: ignore[attr-defined]
sys.modules["torch_npu._C"] = _C

sys.modules["torch.npu"] = npu
torch.npu = npu  # type: ignore[attr-defined]  # as torch_npu registers it: torch.npu is npu

__all__ = [
    "STAND_IN",
    "get_npu_format",
    "npu",
    "npu_dynamic_quant",
    "npu_format_cast",
    "npu_quant_matmul",
    "npu_quantize",
    "npu_weight_quant_batchmatmul",
]
