"""Where a model is placed: device names (``cpu``, ``npu``, ``npu:N``, ``cuda:N``) and dtypes.

``npu`` needs torch_npu, imported here (lazily) because importing it is what registers the
device with torch.
"""

from __future__ import annotations

import importlib
import re

import torch

from opsnn_quant.errors import ConfigError, DeviceUnavailableError
from opsnn_quant.types import DEVICE_PATTERN

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def resolve_device(name: str) -> torch.device:
    """The torch device of ``name``, checked to exist on this machine.

    Raises:
        ConfigError: not a device name this toolkit knows.
        DeviceUnavailableError: the device is not available here (no torch_npu, no CUDA, no
            such index).
    """
    if not re.match(DEVICE_PATTERN, name):
        raise ConfigError(f"device must be cpu, npu, npu:N, cuda or cuda:N, got {name!r}")
    kind, _, index = name.partition(":")
    if kind == "npu":
        try:
            importlib.import_module("torch_npu")
        except ImportError as exc:
            raise DeviceUnavailableError(
                f"device {name} needs torch_npu: install the torch_npu release that matches "
                "your CANN and torch"
            ) from exc
        available = torch.npu.device_count()  # type: ignore[attr-defined]
    elif kind == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    else:
        return torch.device("cpu")
    if available == 0 or (index and int(index) >= available):
        raise DeviceUnavailableError(
            f"device {name} is not available here ({available} {kind} device(s))"
        )
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``float32``/``float16``/``bfloat16``.

    Raises:
        ConfigError: another name.
    """
    if name not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def backend_label(device: torch.device) -> str:
    """How figures computed on ``device`` are labelled: ``npu`` runs torch_npu's kernels,
    anything else the exact reference (``cpu-reference``, ``cuda-reference``)."""
    return "npu" if device.type == "npu" else f"{device.type}-reference"
