"""Quantized matmul speed, side by side in one run: the exact CPU reference and ONNX Runtime.

For each shape M x K x N it times, interleaved (round robin, so that machine load hits every
candidate alike) after a warm-up, and prints medians:

* ``fp32``: ``torch.matmul`` of fp32 (M, K) @ (K, N);
* ``ref``: :func:`opsnn_quant.ascend.npu_quant_matmul`, int8 in, fp16 out, packed int64 scale,
  int32 bias, as this machine runs it: on a CPU whose ``torch._int_mm`` proves exact, the int8
  GEMM (``native`` in the header), else fp32 GEMMs on K chunks; goal <= 3x fp32;
* ``ref fp32``: the same on the fp32 K-chunk path with the fp32 weight cache (``x2_float``)
  QuantLinear passes there (what a CPU without an exact int8 GEMM runs);
* ``ORT fp32`` / ``ORT QDQ``: a one-layer Linear (w8a8, static) exported by
  :func:`opsnn_quant.formats.atc.onnx.export.export_onnx` as QDQ, and with ``fp32_baseline=True``,
  run by ORT's CPU EP; goal: QDQ faster. The QDQ model is checked to have been fused by ORT into
  an int8 kernel (QGemm) by reading the graph ORT optimized. On x86 CPUs without VNNI the
  weights are converted to uint8 (:func:`to_uint8_weights`): ORT's U8S8 kernels would saturate.

Usage: ``python benchmarks/bench_quant_matmul.py [--runs 50] [--warmup 5]``
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import onnx
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opsnn_quant.ascend.matmul as matmul
from opsnn_quant.ascend import npu_quant_matmul, npu_trans_quant_param
from opsnn_quant.ascend.matmul import quant_matmul_cached
from opsnn_quant.formats.atc.onnx.export import export_onnx
from opsnn_quant.formats.atc.onnx.runtime import (
    onnxruntime_session,
    ort_int8_weights_saturate,
    to_uint8_weights,
)
from opsnn_quant.quant.api import quantize

SHAPES = [(256, 768, 768), (4096, 320, 320), (77, 768, 3072)]


def time_interleaved(
    fns: dict[str, Callable[[], object]], runs: int, warmup: int
) -> dict[str, float]:
    """Median wall time (ms) of each function, called round robin ``runs`` times."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def ort_models(
    m: int, k: int, n: int, tmp: Path, u8: bool
) -> tuple[object, object, str, torch.Tensor]:
    """ORT sessions (QDQ, fp32 baseline) of one calibrated w8a8 Linear, its fused op, an input."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(k, n))
    calib = [torch.randn(m, k, generator=g) for _ in range(2)]

    def calibrate(mod: nn.Module) -> None:
        for c in calib:
            mod(c)

    quantize(model, {"0": "w8a8"}, calibrate)
    x = torch.randn(m, k, generator=g)
    qdq = export_onnx(model, (x,), tmp / f"qdq_{m}_{k}_{n}.onnx").path
    fp32 = export_onnx(model, (x,), tmp / f"fp32_{m}_{k}_{n}.onnx", fp32_baseline=True).path
    if u8:
        qdq = to_uint8_weights(qdq, qdq.with_suffix(".u8.onnx"))
    opt = tmp / f"qdq_{m}_{k}_{n}.opt.onnx"
    sess_q = onnxruntime_session(qdq, optimized_model_path=opt)

    fused = sorted(
        {nd.op_type for nd in onnx.load(str(opt)).graph.node}
        & {"QGemm", "MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger"}
    )
    return sess_q, onnxruntime_session(fp32), "+".join(fused) or "none (float)", x


def _fp32_path(*args: object, **kwargs: object) -> torch.Tensor:
    """The reference on its fp32 K-chunk path, whatever this CPU's int8 GEMM."""
    with mock.patch.object(matmul, "int8_gemm_is_exact", lambda: False):
        return quant_matmul_cached(*args, **kwargs)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch and ORT intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # onnxruntime_session() follows torch's thread count
    u8 = ort_int8_weights_saturate()
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir, torch.no_grad():
        for m, k, n in SHAPES:
            g = torch.Generator().manual_seed(1)
            a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
            x1 = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
            w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
            x2, x2f = w.t(), w.t().to(torch.float32)  # as QuantLinear passes them
            scale = npu_trans_quant_param(torch.rand(n, generator=g) * 1e-4)
            bias = torch.randint(-5000, 5000, (n,), dtype=torch.int32, generator=g)
            sess_q, sess_f, fused, x = ort_models(m, k, n, Path(tmpdir), u8)
            feed = {sess_q.get_inputs()[0].name: x.numpy()}  # type: ignore[attr-defined]
            feed_f = {sess_f.get_inputs()[0].name: x.numpy()}  # type: ignore[attr-defined]
            ref = functools.partial(
                npu_quant_matmul, x1, x2, scale, bias=bias, output_dtype=torch.float16
            )
            ref_fp32 = functools.partial(
                _fp32_path, x1, x2, scale, bias=bias, output_dtype=torch.float16, x2_float=x2f
            )
            fns: dict[str, Callable[[], object]] = {
                "fp32": functools.partial(torch.matmul, a, b),
                "ref": ref,
                "ref_fp32": ref_fp32,
                "ort_fp32": functools.partial(sess_f.run, None, feed_f),  # type: ignore[attr-defined]
                "ort_qdq": functools.partial(sess_q.run, None, feed),  # type: ignore[attr-defined]
            }
            t = time_interleaved(fns, args.runs, args.warmup)
            rows.append((f"{m}x{k}x{n}", t, fused))
    native = matmul.native_int8_matmul(torch.device("cpu"))
    print(f"threads={args.threads}, median of {args.runs} interleaved runs after {args.warmup} warm-up; "
          f"ORT weights: {'uint8 (x86 without VNNI)' if u8 else 'int8'}; "
          f"ref int8 GEMM: {'native (torch._int_mm)' if native else 'fp32 K chunks'}")  # fmt: skip
    head = (
        "M x K x N",
        "fp32 ms",
        "ref ms",
        "ref/fp32",
        "ref fp32 ms",
        "ORT fp32 ms",
        "ORT QDQ ms",
        "fp32/QDQ",
        "ORT int8 op",
    )
    print(" | ".join(f"{h:>12}" for h in head))
    for shape, t, fused in rows:
        vals = (shape, f"{t['fp32']:.3f}", f"{t['ref']:.3f}", f"{t['ref'] / t['fp32']:.2f}x",
                f"{t['ref_fp32']:.3f}",
                f"{t['ort_fp32']:.3f}", f"{t['ort_qdq']:.3f}", f"{t['ort_fp32'] / t['ort_qdq']:.2f}x", fused)  # fmt: skip
        print(" | ".join(f"{v:>12}" for v in vals))
    if hasattr(os, "getloadavg"):
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        print(f"load average (1, 5, 15 min) at the end: {load} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
