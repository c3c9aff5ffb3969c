"""ONNX Runtime side of the QDQ export: sessions, running, and the uint8-weight copy.

On x86 CPUs without VNNI, ORT fuses QDQ Gemms into U8S8 kernels whose int16 pair sums saturate
with full-range int8 weights (wrong results); :func:`onnxruntime_session` turns fusion off there
for int8 weights, and :func:`to_uint8_weights` writes an equivalent uint8-weight copy that ORT's
exact U8U8 kernels run fast.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from opsnn_quant.errors import ShapeError
from opsnn_quant.formats.atc.onnx.files import save_onnx_atomic
from opsnn_quant.formats.atc.onnx.info import OnnxExportInfo, require_onnx, to_numpy

log = logging.getLogger(__name__)


def _uint8_weights(onnx: Any, proto: Any) -> int:
    """int8 DequantizeLinear initializers and zero points -> uint8 + 128, in place."""
    inits, nh, changed = {i.name: i for i in proto.graph.initializer}, onnx.numpy_helper, 0
    for node in proto.graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) < 3:
            continue
        pair = [inits.get(node.input[0]), inits.get(node.input[2])]
        if all(t is not None and t.data_type == onnx.TensorProto.INT8 for t in pair):
            for t in cast(list[Any], pair):
                shifted = (nh.to_array(t).astype(np.int16) + 128).astype(np.uint8)
                t.CopyFrom(nh.from_array(shifted, t.name))
            changed += 1
    return changed


def to_uint8_weights(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Copy an int8 QDQ export with its DequantizeLinear weights as uint8 (+128, zero point 128).

    Dequantized values are identical, and ORT on x86 CPUs without VNNI then runs its exact U8U8
    kernels instead of saturating U8S8 ones (see :func:`export_onnx`). Activation Q/DQ pairs are
    left alone; node names are unchanged, so ``<src stem>.nodes.json`` is carried over. Written
    atomically; returns ``dest``.
    """
    (onnx,) = require_onnx("onnx")
    src, out = Path(src), Path(dest)
    proto = onnx.load(str(src))
    log.info("%s: %d weight DequantizeLinear nodes -> uint8", src, _uint8_weights(onnx, proto))
    save_onnx_atomic(proto, out)
    if src.with_suffix(".nodes.json").exists():
        doc = json.loads(src.with_suffix(".nodes.json").read_text(encoding="utf-8"))
        doc |= {"weight_dtype": "uint8", "path": out, "nodes_path": out.with_suffix(".nodes.json")}
        OnnxExportInfo(
            **{k: doc[k] for k in OnnxExportInfo.__dataclass_fields__}
        ).write_nodes_json()
    return out


def ort_int8_weights_saturate() -> bool:
    """True on x86 CPUs without VNNI, where ORT's fused U8S8 GEMM saturates int16 pair sums."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return True  # cannot tell: assume the older CPU
    return not any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def _has_int8_weight_dq(onnx: Any, path: str | os.PathLike[str]) -> bool:
    graph = onnx.load(str(path), load_external_data=False).graph
    int8 = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.INT8}
    return any(n.op_type == "DequantizeLinear" and n.input[0] in int8 for n in graph.node)


def onnxruntime_session(
    path: str | os.PathLike[str],
    *,
    qdq_fusion: bool | None = None,
    optimized_model_path: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> Any:
    """A CPU ``InferenceSession`` (the one session factory of the package: every ORT figure
    goes through the saturation guard below).

    Args:
        path: the ``.onnx`` file.
        qdq_fusion: let ORT fuse QDQ groups into int8 kernels (True), or run the graph as
            written, DequantizeLinear + float ops (False: ONNX's reference semantics). None: fuse
            unless int8 weights meet a CPU where ORT's int8 GEMM saturates
            (:func:`ort_int8_weights_saturate`; :func:`to_uint8_weights` avoids that).
        optimized_model_path: where ORT saves the graph after its fusions (to look for QGemm).
        threads: intra-op threads (default ``torch.get_num_threads()``).
    """
    onnx, ort = require_onnx("onnx", "onnxruntime")
    if qdq_fusion is None:
        qdq_fusion = not (ort_int8_weights_saturate() and _has_int8_weight_dq(onnx, path))
        if not qdq_fusion:
            log.info("%s: int8 weights on a CPU without VNNI: ORT QDQ fusion off", path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads if threads is not None else torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # errors only: ORT warns about every unused initializer
    if not qdq_fusion:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_onnxruntime(
    path: str | os.PathLike[str] | Any, inputs: Sequence[torch.Tensor | np.ndarray]
) -> list[np.ndarray]:
    """Run an ONNX model on ORT's CPU EP; ``path`` may also be a :func:`onnxruntime_session`.

    Args:
        path: model file or session.
        inputs: positional inputs, in the order of the graph inputs.

    Returns:
        The outputs as numpy arrays.
    """
    sess = onnxruntime_session(path) if isinstance(path, str | os.PathLike) else path
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(inputs):
        raise ShapeError(f"the ONNX model takes {len(names)} inputs ({names}), got {len(inputs)}")
    return list(sess.run(None, {n: to_numpy(t) for n, t in zip(names, inputs, strict=True)}))
