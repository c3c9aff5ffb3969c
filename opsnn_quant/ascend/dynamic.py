"""Per-token dynamic quantization: ``npu_dynamic_quant`` (DynamicQuant, Atlas A2/A3 kernels).

Sources: torch_npu ``npu_dynamic_quant`` API doc; op-plugin
``op_plugin/ops/opapi/DynamicQuantKernelNpuOpApi.cpp``; ops-nn ``quant/dynamic_quant/op_kernel``:
``dynamic_quant_multi_row.h``, ``dynamic_quant_db.h``, ``dynamic_quant_single_row.h`` (the kernels
the A2 tiling ``op_host/dynamic_quant_tiling.cpp`` picks for rows that fit the unified buffer),
``dynamic_quant.h`` / ``dynamic_quant_large_shape_opt.h`` (longer rows) and
``dynamic_quant_moe.h`` (``group_index``).

The API doc writes ``scale = rowMax(|x|) / DTYPE_MAX`` and ``y = round(x / scale)``. The kernels
compute, in fp32 with ``Q = DTYPE_MAX`` (127 for int8, 7 for int4)::

    inv   = Q / rowMax(|x * smooth|)            # one fp32 division per row
    y     = rint(x * smooth * inv)              # a multiply, not a divide by scale
    scale = rowMax * fp32(1 / Q)                # multi-row / double-buffer / single-row kernels
    scale = 1 / inv                             # MoE kernel, and rows too long for the buffer

so ``scale`` differs from ``rowMax / Q`` by one ulp for a few percent of rows and ``y`` from
``rint(x / scale)`` by one for a few elements in a thousand.
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.ascend.int4 import INT4_MAX, INT4_MIN, INT4_PER_INT32, pack_int4
from opsnn_quant.errors import ShapeError

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_MAX_EXPERTS = 1024  # dynamic_quant_tiling.cpp MAX_EXPERT_NUM
# A2/A3 unified buffer (192 KiB) minus the tiling's reserve, and the per-element buffer costs of
# dynamic_quant_tiling.cpp that decide between the kernels (see _reciprocal_scale).
_UB_BYTES = 196608 - 1024
_MULTI_ROW_MAX = {False: 16320, True: 12800}  # CheckMultiRowPreconditions maxUbLen
_DB_BYTES_PER_ELEMENT = {False: 13, True: 19}  # FP16/BF16_DB_(SMOOTH_)UB_SIZE


def _reciprocal_scale(k: int, has_smooth: bool, moe: bool) -> bool:
    """True where the kernel A2 tiling picks writes ``scale = 1 / inv`` rather than ``max / Q``.

    dynamic_quant_tiling.cpp: the multi-row kernel takes rows of 128..maxUbLen elements (a
    multiple of 8); otherwise the double-buffer kernel takes rows whose buffers fit the UB; both
    write ``rowMax * (1/Q)``. Longer rows (tiling keys 0/1/6) and MoE (keys 7/8) write ``1/inv``.
    """
    if moe:
        return True
    if 128 <= k <= _MULTI_ROW_MAX[has_smooth] and k % 8 == 0:
        return False
    aligned = -(-k // 16) * 16
    return _DB_BYTES_PER_ELEMENT[has_smooth] * aligned >= _UB_BYTES


def _group_rows(group_index: torch.Tensor, rows: int, experts: int, op: str) -> torch.Tensor:
    """Expert of each row: row r uses the first e with ``group_index[e] > r`` (GetSmoothIndex)."""
    require_dtype("group_index", group_index, (torch.int32,), op)
    if group_index.dim() != 1 or group_index.numel() != experts:
        raise ShapeError(
            f"{op}: group_index must be 1-D with {experts} elements (smooth_scales rows), "
            f"got {tuple(group_index.shape)}"
        )
    g = group_index.to(torch.int64)
    if bool((g[1:] < g[:-1]).any()) or int(g[0]) < 0 or int(g[-1]) != rows:
        raise ShapeError(
            f"{op}: group_index must be non-decreasing, >= 0, and end at the row count {rows}"
        )
    r = torch.arange(rows, dtype=torch.int64, device=g.device)
    return torch.searchsorted(g, r, right=True)


def _smooth_rows(
    x: torch.Tensor,
    input_dtype: torch.dtype,
    smooth_scales: torch.Tensor | None,
    group_index: torch.Tensor | None,
    op: str,
) -> torch.Tensor:
    """``x * smooth_scales`` in fp32: one (K,) vector, or per-expert rows chosen by group_index."""
    k = x.shape[-1]
    if smooth_scales is None:
        if group_index is not None:
            raise ShapeError(f"{op}: group_index needs smooth_scales")
        return x
    require_dtype("smooth_scales", smooth_scales, _FLOATS, op)
    if input_dtype != torch.float32 and smooth_scales.dtype != input_dtype:
        raise ShapeError(f"{op}: smooth_scales must have input's dtype {input_dtype}")
    s = smooth_scales.to(torch.float32)
    if group_index is None:
        if s.dim() != 1 or s.numel() != k:
            raise ShapeError(
                f"{op}: smooth_scales must be 1-D with K={k} elements, got {tuple(s.shape)}"
            )
        return x * s
    if s.dim() != 2 or s.shape[1] != k or not 1 <= s.shape[0] <= _MAX_EXPERTS:
        raise ShapeError(
            f"{op}: with group_index, smooth_scales must be (experts <= 1024, K={k}), "
            f"got {tuple(s.shape)}"
        )
    rows = x.reshape(-1, k)
    expert = _group_rows(group_index, rows.shape[0], s.shape[0], op)
    return (rows * s[expert]).reshape(x.shape)


@torch.no_grad()
def npu_dynamic_quant(
    input: torch.Tensor,
    *,
    smooth_scales: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    dst_type: torch.dtype | None = None,
    quant_mode: str = "pertoken",
    dst_type_max: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric quantization, as ``torch_npu.npu_dynamic_quant`` on Atlas A2/A3.

    Follows the A2/A3 kernels' order of operations, not the API doc's formula (see the module
    docstring): ``inv = Q / rowmax``, ``y = rint(x * inv)``, ``scale = rowmax * fp32(1/Q)``
    (``1 / inv`` with ``group_index`` or rows longer than the buffer: K > 15040 unless
    K <= 16320 and K % 8 == 0; with smooth scales K > 10288 unless K <= 12800 and K % 8 == 0). An all-zero row gives ``scale = 0`` and ``y = 0`` on the kernel path
    (``0 * inf`` is NaN, which the int cast turns into 0; the API doc leaves the case open).

    Args:
        input: fp16/bf16 (fp32 accepted by the reference), at least 2-D, (..., K).
        smooth_scales: optional, ``input``'s dtype: (K,), or (experts, K) with ``group_index``.
        group_index: optional int32 (experts,), MoE: ``smooth_scales[e]`` scales rows
            ``group_index[e-1] .. group_index[e]-1``; non-decreasing, ending at the row count.
        dst_type: ``None``/``torch.int8``/``torch.qint8`` (int8), or ``torch.quint4x2``: int4 in
            [-8, 7] with Q = 7, packed eight per int32 along the last axis (K a multiple of 8).
        quant_mode: torch_npu latest only (V3/V4 aclnn): only ``"pertoken"`` runs on A2/A3;
            ``"pertensor"``/``"perchannel"`` are Ascend 950 and raise ShapeError.
        dst_type_max: torch_npu latest only; a HiFloat8 range (Ascend 950). Only 0.0 is accepted.

    Returns:
        ``(y, scale)``: int8 of ``input``'s shape (int32 (..., K/8) for quint4x2), and fp32
        ``scale`` of ``input.shape[:-1]``.
    """
    op = "npu_dynamic_quant"
    require_dtype("input", input, _FLOATS, op)
    if input.dim() < 2:
        raise ShapeError(f"{op}: input must have at least 2 dims, got {input.dim()}")
    if quant_mode != "pertoken":
        raise ShapeError(
            f"{op}: quant_mode={quant_mode!r} runs only on Ascend 950; A2/A3 take 'pertoken'"
        )
    if dst_type_max != 0.0:
        raise ShapeError(f"{op}: dst_type_max (HiFloat8, Ascend 950) is not supported")
    if dst_type in (None, torch.int8, torch.qint8):
        q, lo, hi = 127.0, -128, 127
    elif dst_type == torch.quint4x2:
        q, lo, hi = 7.0, INT4_MIN, INT4_MAX
        if input.shape[-1] % INT4_PER_INT32:
            raise ShapeError(f"{op}: quint4x2 needs K a multiple of 8, got {input.shape[-1]}")
    else:
        raise ShapeError(
            f"{op}: dst_type must be None, torch.int8 or torch.quint4x2, got {dst_type}"
        )
    x = _smooth_rows(input.to(torch.float32), input.dtype, smooth_scales, group_index, op)
    rowmax = x.abs().amax(dim=-1)
    inv = torch.full_like(rowmax, q).div_(rowmax)  # Q / 0 = inf for an all-zero row
    y = (x * inv.unsqueeze(-1)).round_().nan_to_num_(nan=0.0).clamp_(lo, hi)  # in place
    k = input.shape[-1]
    if _reciprocal_scale(k, smooth_scales is not None, group_index is not None):
        scale = torch.ones_like(inv).div_(inv)
    else:
        scale = rowmax * torch.tensor(1.0 / q, dtype=torch.float32)
    if dst_type == torch.quint4x2:
        return pack_int4(y.to(torch.int8)), scale
    return y.to(torch.int8), scale
