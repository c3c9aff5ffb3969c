"""fp32 vs QDQ ONNX models on ONNX Runtime (CPU), measured with the same code as torch models.

Takes paths, so it works with any exporter (``opsnn_quant.formats.atc.onnx.export.export_onnx``
writes such a pair). Results are labelled ``cpu-onnxruntime``: a relative figure on this host,
not an Ascend number.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.latency import ORT_NOTE, LatencyResult, measure

BACKEND = "cpu-onnxruntime"


class OrtSpeedResult(BaseModel):
    """Both models' measurements and their ratios (> 1: the QDQ model is faster / smaller).

    File sizes include an external-data file ``<model>.onnx.data`` next to the model.
    """

    model_config = ConfigDict(frozen=True)

    fp32: LatencyResult
    qdq: LatencyResult
    p50_speedup: float
    mean_speedup: float
    fp32_file_bytes: int
    qdq_file_bytes: int
    size_ratio: float
    threads: int


def _session(path: Path, threads: int) -> Any:
    # The package's one session factory: int8 weights on a CPU whose ORT int8 GEMM saturates
    # (no VNNI) run with QDQ fusion off, so the figure is never computed on saturated weights.
    from opsnn_quant.formats.atc.onnx.runtime import onnxruntime_session

    if not path.is_file():
        raise InputError(f"ONNX model {path} not found")
    return onnxruntime_session(path, threads=threads)


def _model_bytes(path: Path) -> int:
    """Size of an ONNX model including its external-data file (``<name>.data``), if any."""
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def ort_speed(
    fp32_onnx_path: str | os.PathLike[str],
    qdq_onnx_path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    runs: int = 20,
    warmup: int = 3,
    threads: int | None = None,
    memory: bool = True,
) -> OrtSpeedResult:
    """Time both ONNX models on the same inputs with :func:`~.latency.measure`.

    Args:
        fp32_onnx_path: The float model.
        qdq_onnx_path: The QuantizeLinear/DequantizeLinear model of the same graph.
        inputs: Input name -> array, fed to both.
        runs, warmup: As in :func:`~.latency.measure`.
        threads: Intra-op threads for both sessions (default: all cores), the same for both
            so the comparison is fair.
        memory: Also measure peak RSS of one call each.

    Raises:
        InputError: A model file is missing or the inputs do not match a model's inputs.
    """
    threads = threads or os.cpu_count() or 1
    paths = (Path(fp32_onnx_path), Path(qdq_onnx_path))
    feeds = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
    results = []
    for path in paths:
        sess = _session(path, threads)
        names = {i.name for i in sess.get_inputs()}
        if names != set(feeds):
            raise InputError(f"{path.name} takes inputs {sorted(names)}, got {sorted(feeds)}")
        results.append(
            measure(
                functools.partial(sess.run, None, feeds),
                warmup=warmup,
                runs=runs,
                device="cpu",
                backend=BACKEND,
                memory=memory,
                note=ORT_NOTE,
            )
        )
    fp32, qdq = results
    sizes = [_model_bytes(p) for p in paths]
    return OrtSpeedResult(
        fp32=fp32,
        qdq=qdq,
        p50_speedup=fp32.p50_ms / qdq.p50_ms if qdq.p50_ms > 0 else float("nan"),
        mean_speedup=fp32.mean_ms / qdq.mean_ms if qdq.mean_ms > 0 else float("nan"),
        fp32_file_bytes=sizes[0],
        qdq_file_bytes=sizes[1],
        size_ratio=sizes[0] / sizes[1] if sizes[1] else float("nan"),
        threads=threads,
    )
