"""Where quantized modules run: the single dispatch point :func:`get_backend`.

``npu`` tensors go to :class:`~opsnn_quant.backends.npu.NpuBackend` (torch_npu, imported lazily);
every other device (cpu, cuda) to :class:`~opsnn_quant.backends.reference.ReferenceBackend`, the
exact arithmetic of :mod:`opsnn_quant.ascend`.
"""

from __future__ import annotations

import torch

from opsnn_quant.backends.base import QuantBackend
from opsnn_quant.backends.npu import NpuBackend
from opsnn_quant.backends.reference import ReferenceBackend

_REFERENCE = ReferenceBackend()
_NPU = NpuBackend()


def get_backend(device: torch.device | str) -> QuantBackend:
    """Backend for tensors on ``device``: ``npu`` -> torch_npu, anything else -> reference."""
    device_type = device if isinstance(device, str) else device.type
    device_type = device_type.split(":")[0]
    return _NPU if device_type == "npu" else _REFERENCE


__all__ = ["NpuBackend", "QuantBackend", "ReferenceBackend", "get_backend"]
