"""Quantized matmul: ``npu_quant_matmul`` (QuantBatchMatmulV3/V4/V5 via aclnnQuantMatmulV5).

Sources: torch_npu ``npu_quant_matmul`` API doc (formulas by bias dtype, the Atlas A2/A3 dtype
table); op-plugin ``op_plugin/ops/opapi/QuantMatmulKernelNpuOpApi.cpp`` (an fp32 ``scale`` without
``pertoken_scale`` and with int8/fp16 output is packed by ``npu_trans_quant_param(scale, offset)``
before the kernel runs); ops-nn ``matmul/quant_batch_matmul_v3/tests/assets/qbmmv3_kernel_golden.py``
(``compute_requant``, ``compute_tc``, ``compute_pertoken``, ``compute_int32``) and
``aclnnQuantMatmulV5.md`` (G-B mode)::

    int32 out:            acc + bias_int32
    int8 out (requant):   clip(clip(rint(fp32(acc + bias) * fp19(scale)), -256, 255) + off9, -128, 127)
    fp16 out:             fp16(fp32(acc + bias) * fp19(scale))
    bf16 / pertoken:      fp32(acc + bias_int32) * scale [* pertoken_scale] [+ bias_float]

``x1@x2`` is an exact int32 accumulation, by one of two paths that give the same integers: the
CPU's int8 GEMM (``torch._int_mm``, oneDNN: int8 operands, int32 sums, as the Cube does), where a
self-check proves it exact (int8 kernels without VNNI may saturate int16 pair sums); or float32
GEMMs on chunks of K small enough that every partial sum is an integer below 2**24 (so any
summation order is exact), the chunks added in int64. Which one runs is chosen per size of
product by a short measured race at first use (:mod:`opsnn_quant.ascend.gemm_path`): the native
kernel is 4-10x faster than fp32 with VNNI/AMX and 40-65x slower without. int4 operands (int32
words of eight values) are unpacked to int8 first; ``|int4 * int4| <= 64`` keeps the same
chunks exact.
"""

from __future__ import annotations

import functools
import logging

import torch

from opsnn_quant.ascend._qmm_checks import (
    MAX_K,
    Plan,
    check_dtype_args,
    check_quant_matmul,
    is_transposed_view,
)
from opsnn_quant.ascend.gemm_path import Gemm, GemmChoice, choose, forced_path, gemm_is_exact
from opsnn_quant.ascend.int4 import unpack_int4
from opsnn_quant.ascend.params import npu_trans_quant_param, requant_int8, unpack_quant_param
from opsnn_quant.errors import ShapeError

log = logging.getLogger(__name__)

# |int8 * int8| <= 2**14, so a sum of 1024 products stays within 2**24, exact in fp32.
EXACT_FP32_CHUNK = 1024
# Elements of an int8 weight converted to fp32 at once when no fp32 copy is given (16 MB).
WEIGHT_CHUNK = 1 << 22
# Every integer of at most this magnitude is an fp32 value.
FP32_EXACT_INT = 1 << 24


@torch.no_grad()
def int8_matmul_exact(
    x1: torch.Tensor, x2: torch.Tensor, x2_float: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact ``x1 @ x2`` of int8 tensors as int32 (no overflow is possible for K <= 65535).

    Runs the path :func:`gemm_choice` chose for this size of product: the CPU's own int8 GEMM
    or fp32 K chunks; both give the same integers.

    Args:
        x1: int8 (..., M, K).
        x2: int8 (..., K, N).
        x2_float: optional ``x2`` already converted to float32 (callers that reuse a weight cache it).

    Returns:
        int32 (..., M, N).
    """
    k = x1.shape[-1]
    if (
        x1.dtype == x2.dtype == torch.int8
        and x2.dim() == 2
        and k <= MAX_K
        and x2.device == x1.device
        and native_int8_matmul(x1.device, rows=x1.numel() // max(k, 1))
    ):
        # int8 x int8 -> int32 in the CPU's own integer GEMM: exact (checked once per process
        # by int8_gemm_is_exact), no fp32 copies of either operand.
        rows = torch._int_mm(x1.reshape(-1, k), x2)
        return rows.reshape(*x1.shape[:-1], x2.shape[1])
    return fp32_chunk_matmul(x1, x2, x2_float)


@torch.no_grad()
def fp32_chunk_matmul(
    x1: torch.Tensor, x2: torch.Tensor, x2_float: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact ``x1 @ x2`` of int8-valued tensors as int32 through fp32 GEMMs on chunks of K of at
    most :data:`EXACT_FP32_CHUNK` (every partial sum an integer below 2**24), added in int64."""
    k = x1.shape[-1]
    a = x1.to(torch.float32)
    if x2_float is None and x2.dim() == 2 and x2.numel() > WEIGHT_CHUNK and k <= EXACT_FP32_CHUNK:
        # A large int8 weight (an LM head) is converted to fp32 a column block at a time: a
        # whole fp32 copy is 4x the int8 weight, per call. Each output element is the same exact
        # dot product either way.
        cols = max(1, WEIGHT_CHUNK // k)
        out = torch.empty((*a.shape[:-1], x2.shape[1]), dtype=torch.int32, device=a.device)
        for n0 in range(0, x2.shape[1], cols):
            block = x2[:, n0 : n0 + cols].to(torch.float32)
            out[..., n0 : n0 + cols] = torch.matmul(a, block).to(torch.int32)
        return out
    b = x2.to(torch.float32) if x2_float is None else x2_float
    if k <= EXACT_FP32_CHUNK:
        return torch.matmul(a, b).to(torch.int32)
    acc: torch.Tensor | None = None
    for k0 in range(0, k, EXACT_FP32_CHUNK):
        part = torch.matmul(
            a[..., k0 : k0 + EXACT_FP32_CHUNK], b[..., k0 : k0 + EXACT_FP32_CHUNK, :]
        )
        part_i = part.to(torch.int64)
        acc = part_i if acc is None else acc.add_(part_i)
    assert acc is not None
    return acc.to(torch.int32)


@functools.cache
def int8_gemm_is_exact() -> bool:
    """Whether ``torch._int_mm`` on this CPU returns the exact int32 products
    (:func:`~opsnn_quant.ascend.gemm_path.gemm_is_exact`)."""
    if not hasattr(torch, "_int_mm"):
        return False
    exact = gemm_is_exact(torch._int_mm)
    if not exact:
        log.info("torch._int_mm is not exact on this CPU: fp32-chunk int8 matmuls")
    return exact


def _candidates() -> dict[str, Gemm]:
    return {"native": lambda a, b: torch._int_mm(a, b), "fp32-chunk": fp32_chunk_matmul}


def gemm_choice() -> GemmChoice:
    """The exact int8 GEMM path of each size class on this CPU: a short race among the exact
    ones at first use (:mod:`opsnn_quant.ascend.gemm_path`), logged once.

    Raises:
        ConfigError: ``OPSNN_QUANT_INT8_GEMM`` names an unknown or inexact path.
    """
    return _gemm_choice(int8_gemm_is_exact(), forced_path())


@functools.cache
def _gemm_choice(native_exact: bool, forced: str) -> GemmChoice:
    # Keyed by what it depends on: a test that makes the native kernel inexact, or a benchmark
    # that forces a path, gets its own choice; the race runs once per key and process.
    exact = {"native": native_exact, "fp32-chunk": True}
    choice = choose(_candidates(), exact, forced=forced)
    log.info(
        "int8 GEMM: %s (%s; exact: %s)",
        ", ".join(f"{cls} products {path}" for cls, path in choice.paths.items()),
        choice.how, ", ".join(choice.exact),
    )  # fmt: skip
    return choice


def native_int8_matmul(device: torch.device, rows: int | None = None) -> bool:
    """Whether :func:`int8_matmul_exact` runs a product of ``rows`` rows (None: a large one) in
    the CPU's native int8 GEMM on ``device``: exact there, and what the race chose; fp32
    weight copies are then of no use."""
    return (
        device.type == "cpu" and int8_gemm_is_exact() and gemm_choice().path_for(rows) == "native"
    )


def _operands(x1: torch.Tensor, x2: torch.Tensor, plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 (…, M, K) and (…, K, N): int4 words unpacked along K (x1) and N or K (x2)."""
    if not plan.int4:
        return x1, x2
    if is_transposed_view(x2):  # a (K/8, N) view of a contiguous (N, K/8): packed along K
        return unpack_int4(x1), unpack_int4(x2.transpose(-1, -2)).transpose(-1, -2)
    return unpack_int4(x1), unpack_int4(x2)


def _add_int32_bias(acc: torch.Tensor, bias: torch.Tensor, k: int) -> torch.Tensor:
    if int(bias.abs().max()) + k * 2**14 <= 2**31 - 1:
        return acc.add_(bias)  # no int32 overflow is possible: add in place
    # int32 addition wraps on the device; int64 then truncation reproduces that.
    wide = acc.to(torch.int64) + bias.to(torch.int64)
    return torch.where(
        wide >= 2**31, wide - 2**32, torch.where(wide < -(2**31), wide + 2**32, wide)
    ).to(torch.int32)


def _group_gb(
    a: torch.Tensor,
    b: torch.Tensor,
    scale: torch.Tensor,
    pertoken_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.dtype,
) -> torch.Tensor:
    """G-B: ``sum_j (x1 @ x2)_j * (x1Scale[m, j] * x2Scale[j, n // 128]) + bias`` (aclnnQuantMatmulV5
    doc), the K blocks accumulated in fp32 in ascending order (qbmmv3 golden compute_perblock)."""
    n = b.shape[-1]
    col = torch.arange(n, device=b.device) // 128
    y = torch.zeros((a.shape[0], n), dtype=torch.float32, device=a.device)
    for j in range(scale.shape[0]):
        ks = slice(j * 128, (j + 1) * 128)
        part = int8_matmul_exact(a[:, ks], b[ks, :]).to(torch.float32)
        y += part * (pertoken_scale[:, j : j + 1] * scale[j, col])
    if bias is not None:
        y += bias.reshape(-1)
    return y.to(out)


@torch.no_grad()
def quant_matmul_cached(
    x1: torch.Tensor,
    x2: torch.Tensor,
    scale: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
    group_sizes: list[int] | tuple[int, ...] | None = None,
    x2_float: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`npu_quant_matmul` with a reference-only fast path (not a torch_npu function).

    Args:
        x1, x2, scale, offset, pertoken_scale, bias, output_dtype, group_sizes: as
            :func:`npu_quant_matmul`.
        x2_float: ``x2`` already converted to float32 (int8 inputs; a module reusing its weight
            caches it). Changes speed only, never the result.

    Returns:
        As :func:`npu_quant_matmul`.
    """
    plan = check_quant_matmul(
        x1, x2, scale, offset, pertoken_scale, bias, output_dtype, group_sizes
    )
    out = torch.int8 if output_dtype is None else output_dtype
    a, b = _operands(x1, x2, plan)
    if plan.groups is not None:
        assert pertoken_scale is not None  # checked: G-B needs it
        return _group_gb(a, b, scale, pertoken_scale, bias, out)
    w_float = None if plan.int4 else x2_float
    held = _float_accumulator(a, b, w_float, bias, plan.k, out)
    if held is None:
        acc = int8_matmul_exact(a, b, w_float)
    else:  # fp32(acc + bias_int32) already: the epilogue's int32 steps are done
        acc = held
        bias = None if bias is not None and bias.dtype == torch.int32 else bias
    return quant_matmul_epilogue(
        acc, scale, k=plan.k, offset=offset, pertoken_scale=pertoken_scale, bias=bias, output=out
    )


def _float_accumulator(
    a: torch.Tensor,
    b: torch.Tensor,
    b_float: torch.Tensor | None,
    bias: torch.Tensor | None,
    k: int,
    out: torch.dtype,
) -> torch.Tensor | None:
    """``fp32(a @ b + bias_int32)`` straight from one fp32 GEMM, where the fp32-chunk path runs
    the product in a single chunk; None where the int32 route is needed (the native GEMM, K
    past one chunk, a weight converted in column blocks, int32 output, a bias that is not an
    fp32 integer or whose sum could wrap).

    The same bits as converting the int32 sum: the product is an exact integer in fp32 (every
    partial sum below 2**24, :data:`EXACT_FP32_CHUNK`), the bias is one too, and an fp32
    addition rounds the exact sum to nearest-even, as the int32 -> fp32 conversion does. It
    saves the fp32 -> int32 -> fp32 round trip of the (M, N) accumulator (the reference's
    conversions cost a Whisper encoder's quantized Linears as much as their GEMMs)."""
    rows = a.numel() // max(k, 1)
    if out == torch.int32 or k > EXACT_FP32_CHUNK or a.dim() != 2 or b.dim() != 2:
        return None
    if native_int8_matmul(a.device, rows) or (b_float is None and b.numel() > WEIGHT_CHUNK):
        return None
    int_bias = bias is not None and bias.dtype == torch.int32
    if int_bias:
        assert bias is not None
        largest = int(bias.abs().max()) if bias.numel() else 0
        if largest > FP32_EXACT_INT or largest + k * 2**14 > 2**31 - 1:
            return None
    acc = torch.matmul(a.to(torch.float32), b.to(torch.float32) if b_float is None else b_float)
    if int_bias:
        assert bias is not None
        acc.add_(bias.to(torch.float32))
    return acc


@torch.no_grad()
def quant_matmul_epilogue(
    acc: torch.Tensor,
    scale: torch.Tensor,
    *,
    k: int,
    offset: torch.Tensor | None = None,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output: torch.dtype = torch.int8,
) -> torch.Tensor:
    """What :func:`npu_quant_matmul` does after the int32 accumulation (checked arguments):
    int32 bias, then the requant / dequant / per-token epilogue into ``output``. A reference
    int8 conv (an im2col matmul) shares it: ``acc`` (M, N) with K = ``k`` products per sum,
    int32, or fp32 holding ``fp32(acc + bias)`` already (``bias`` then not int32: see
    :func:`_float_accumulator`)."""
    out = output
    if bias is not None and bias.dtype == torch.int32:
        acc = _add_int32_bias(acc, bias, k)
    if out == torch.int32:
        return acc
    if pertoken_scale is None and out in (torch.int8, torch.float16):
        # QuantMatmulKernelNpuOpApi.cpp: an fp32 scale goes through npu_trans_quant_param(scale,
        # offset) first, so int8/fp16 outputs always see the packed FP19 scale and 9-bit offset.
        packed = scale if scale.dtype == torch.int64 else npu_trans_quant_param(scale, offset)
        if out == torch.int8:
            return requant_int8(acc.to(torch.float32), packed)
        s, _ = unpack_quant_param(packed.reshape(-1))  # fp16 (dequant) mode takes no offset
        return acc.to(torch.float32).mul_(s).to(torch.float16)
    # bf16 output and per-token scaling: fp32 scale in full, in the documented order, in place.
    y = acc.to(torch.float32).mul_(scale.reshape(-1).to(torch.float32))
    if pertoken_scale is not None:
        y.mul_(pertoken_scale.unsqueeze(-1))
    if bias is not None and bias.dtype != torch.int32:
        y.add_(bias.to(torch.float32))
    return y.to(out)


@torch.no_grad()
def npu_quant_matmul(
    x1: torch.Tensor,
    x2: torch.Tensor,
    scale: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
    x1_dtype: torch.dtype | int | None = None,
    x2_dtype: torch.dtype | int | None = None,
    pertoken_scale_dtype: torch.dtype | int | None = None,
    scale_dtype: torch.dtype | int | None = None,
    group_sizes: list[int] | tuple[int, ...] | None = None,
    y_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quantized matmul with Ascend's dequant/requant epilogue, as ``torch_npu.npu_quant_matmul``.

    One signature covers the release lines: torch_npu 2.1 (op-plugin 7.0.0) has the arguments up
    to ``output_dtype``; ``group_sizes`` exists from the 2.6 line (op-plugin 7.1.0); ``x1_dtype``,
    ``x2_dtype``, ``pertoken_scale_dtype``, ``scale_dtype`` from 2.6 and ``y_scale`` in the latest
    (master) only. Behaviour follows Atlas A2/A3 (the 310P table is a subset of it).

    Args:
        x1: int8 (..., M, K), or int32 (..., M, K // 8) holding eight int4 values each (a4w4,
            contiguous).
        x2: int8 (..., K, N) (a transposed (N, K) view too), or int32 (K, N // 8) / a (K // 8, N)
            transposed view of a contiguous (N, K // 8). Batch dims broadcast as torch_npu's.
        scale: (1,) or (N,) (or (1, N)): int64 from ``npu_trans_quant_param``, fp32, or bf16. With
            int8/fp16 output and no ``pertoken_scale`` an fp32 scale (and ``offset``) is packed
            first, as op-plugin does: FP19-truncated scale, offset rounded to 9 bits.
        offset: optional fp32 (1,) or (N,), int8 output only. With an int64 ``scale`` the 9-bit
            offset packed inside ``scale`` is the one applied (it is applied even when ``offset``
            is None, which is how the API doc's "Method 2" reproduces "Method 1").
        pertoken_scale: optional fp32 (M,); fp16/bf16 output. G-B mode: (M, ceil(K / 128)).
        bias: optional (N,), (1, N) (torch_npu 2.6 doc) or (batch, 1, N) with a 3-D output: int32
            (added to the accumulator, wrapping like the device) or bf16/fp16/fp32 (added after
            scaling; bf16 output or ``pertoken_scale`` only).
        output_dtype: None/int8 (requantized), float16, bfloat16, or int32 (accumulator + bias).
        x1_dtype, x2_dtype, pertoken_scale_dtype, scale_dtype: None or the tensor's own dtype;
            any other value (fp8/HiFloat8/FP4 reinterpretation, Ascend 950) raises ShapeError.
        group_sizes: None or [0, 0, 0], or [1, 128, 128] for int8 G-B (pergroup-perblock)
            scaling with fp32 ``pertoken_scale`` (M, ceil(K/128)), fp32 ``scale``
            (ceil(K/128), ceil(N/128)), optional fp32 bias, fp16/bf16 output. Other group modes
            (A4W4/A8W4 per-group, Ascend 950 B-B/MX) raise ShapeError.
        y_scale: must be None (T-CG mode, Ascend 950).

    Returns:
        Tensor (broadcast batch..., M, N) of ``output_dtype`` (int8 when None).
    """
    check_dtype_args(
        x1_dtype=(x1_dtype, x1),
        x2_dtype=(x2_dtype, x2),
        pertoken_scale_dtype=(pertoken_scale_dtype, pertoken_scale),
        scale_dtype=(scale_dtype, scale),
    )
    if y_scale is not None:
        raise ShapeError("npu_quant_matmul: y_scale (T-CG mode, Ascend 950) is not supported")
    return quant_matmul_cached(
        x1,
        x2,
        scale,
        offset=offset,
        pertoken_scale=pertoken_scale,
        bias=bias,
        output_dtype=output_dtype,
        group_sizes=group_sizes,
    )
