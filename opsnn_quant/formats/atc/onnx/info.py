"""What an ONNX export wrote, and what the export and ONNX Runtime sides both need.

:class:`OnnxExportInfo` is written as ``<stem>.nodes.json`` beside the ``.onnx`` file (read it
back with :func:`opsnn_quant.formats.atc.precision.load_node_map`); :func:`require_onnx` imports the optional ONNX
packages with an install hint.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opsnn_quant.errors import MissingDependencyError
from opsnn_quant.output.files import write_json_atomic

NODES_SCHEMA_VERSION = 1


@dataclass
class OnnxExportInfo:
    """What :func:`opsnn_quant.formats.atc.onnx.export.export_onnx` wrote.

    Attributes:
        path: the ``.onnx`` file.
        nodes_path: ``<stem>.nodes.json`` beside it (these fields as JSON).
        opset: the default-domain opset.
        fp32_baseline: quantized modules written as float Gemm/Conv.
        weight_dtype: ``int8``/``uint8`` DequantizeLinear weights (``float32`` for a baseline).
        nodes: module name -> names of the ONNX nodes it produced: every quantized module, and
            the innermost module of each other node the exporter tagged ("" = the root).
        schemes: quantized module name -> its representation (see
            :mod:`opsnn_quant.formats.atc.onnx.export`).
    """

    path: Path
    nodes_path: Path
    opset: int
    fp32_baseline: bool
    weight_dtype: str
    nodes: dict[str, list[str]] = field(default_factory=dict)
    schemes: dict[str, str] = field(default_factory=dict)

    def write_nodes_json(self) -> Path:
        """Write these fields to :attr:`nodes_path` atomically; returns that path."""
        doc = asdict(self) | {"schema_version": NODES_SCHEMA_VERSION, "path": self.path.name}
        del doc["nodes_path"]
        return write_json_atomic(self.nodes_path, doc)


def require_onnx(*names: str) -> list[Any]:
    """Import the optional ONNX packages ``names`` (e.g. ``onnx``, ``onnxruntime``).

    Raises:
        MissingDependencyError: one is not installed (the message says what to install).
    """
    try:
        return [importlib.import_module(n) for n in names]
    except ImportError as exc:
        raise MissingDependencyError(
            f"ONNX export/inference needs {', '.join(names)}: pip install 'opsnn-quant[onnx]'"
        ) from exc


def to_numpy(value: Any) -> np.ndarray:
    """A C-contiguous numpy array of a tensor (detached, on the CPU) or an array-like."""
    arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return np.ascontiguousarray(arr)
