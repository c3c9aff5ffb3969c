"""The model dtype ``vllm serve DIR`` runs in by default (``--dtype auto``), from ``config.json``.

Written from vLLM 0.23.0's source, without importing it (its import needs the engine's
environment):

* ``transformers_utils/model_arch_config_convertor.py:166-204`` ``get_torch_dtype``: the config's
  ``dtype`` (transformers fills it from ``dtype`` or ``torch_dtype`` in ``config.json``), else its
  text, vision or encoder sub-config's, else the dtype every tensor of the directory's
  ``*.safetensors`` casts to without loss (``common_broadcastable_dtype``,
  ``utils/torch_utils.py:219-264``; ``transformers_utils/config.py:1243-1249``), else float32;
* ``config/model.py:1996-2037`` ``_resolve_auto_dtype`` (a generation model): a float32 config is
  run in the platform's first supported dtype, bfloat16 (``platforms/interface.py:153-158``
  ``supported_dtypes`` = bfloat16, float16, float32; vllm-ascend's ``NPUPlatform`` does not
  override it), float16 where the model type refuses it (1969-1982: gemma2/3, plamo2, glm4
  refuse float16 instead); a float16 or bfloat16 config is run as it says.

A checkpoint that names its dtype otherwise (ours: ``metadata.opsnn_quant.params_dtype``; a
static W8A8 ``deq_scale``'s dtype) is read by :meth:`~opsnn_quant.formats.ascendv1.reader.
AscendV1Checkpoint.params_dtype` before this rule.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

# platforms/interface.py:153-158, in its order (the first: what a float32 model runs in)
SUPPORTED = (torch.bfloat16, torch.float16, torch.float32)
# config/model.py 1969-1975: model types whose float16 vLLM refuses
NO_FLOAT16 = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})
# what transformers turns a config's dtype string into (getattr(torch, name))
_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}  # fmt: skip


def config_dtype(config: Mapping[str, Any]) -> torch.dtype | None:
    """The dtype a ``config.json`` names (``get_torch_dtype``'s order: the config, then its
    ``text_config``, ``vision_config``, ``encoder_config``); None: it names none."""
    for doc in (
        config,
        *(config.get(k) for k in ("text_config", "vision_config", "encoder_config")),
    ):
        if not isinstance(doc, Mapping):
            continue
        value = doc.get("dtype") or doc.get("torch_dtype")
        if isinstance(value, str) and value in _NAMES:
            return _NAMES[value]
    return None


def _level(dtype: torch.dtype) -> int:
    return int(dtype != torch.bool) + int(dtype.is_floating_point) + 2 * int(dtype.is_complex)


def _lossless(src: torch.dtype, dst: torch.dtype) -> bool:
    """``is_lossless_cast`` (utils/torch_utils.py:224-253)."""
    if src == dst:
        return True
    if _level(src) != _level(dst):
        return _level(src) < _level(dst)
    if not src.is_floating_point:
        a, b = torch.iinfo(src), torch.iinfo(dst)
        return a.min >= b.min and a.max <= b.max
    f, g = torch.finfo(src), torch.finfo(dst)
    return f.min >= g.min and f.max <= g.max and f.resolution >= g.resolution


def common_dtype(dtypes: Collection[torch.dtype]) -> torch.dtype:
    """``common_broadcastable_dtype``: the dtype most of ``dtypes`` cast to without loss (the
    first such in sorted order on a tie, where vLLM's set order decides)."""
    ordered = sorted(set(dtypes), key=str)
    return max(ordered, key=lambda d: sum(_lossless(s, d) for s in ordered))


def auto_dtype(
    config: Mapping[str, Any] | None, tensor_dtypes: Collection[torch.dtype]
) -> torch.dtype:
    """The dtype ``vllm serve --dtype auto`` runs a generation model in, from its ``config.json``
    (None: none is read) and the dtypes of the served directory's safetensors tensors."""
    named = config_dtype(config) if config is not None else None
    if named is None:
        named = common_dtype(tensor_dtypes) if tensor_dtypes else torch.float32
    model_type = config.get("model_type") if config is not None else None
    supported = [d for d in SUPPORTED if not (model_type in NO_FLOAT16 and d == torch.float16)]
    if named == torch.float32 or named not in supported:
        return supported[0]
    return named
