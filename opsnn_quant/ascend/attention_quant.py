"""Quantizing attention inputs: msModelSlim's FA3 per-head int8 scales, and SageAttention's K-mean
smoothing. Pure functions; the fused int8 attention itself is :mod:`opsnn_quant.ascend.attention`.

**FA3 (msModelSlim 26.1.0).** ``msmodelslim/processor/quant/fa3/processor.py`` calibrates per-head
symmetric int8 min-max scales (default ``QConfig(INT8, PER_HEAD, symmetric, minmax)``, l.68-71) for
the ``fa3_q``/``fa3_k``/``fa3_v`` placeholders the FLUX, Wan2.2 and HunyuanVideo adapters install
(FLUX: ratio 0.9999 for q/k, 1.0 for v, ``model/flux1/model_adapter.py`` l.285-287). Per call
the observer ``_FA3PerHeadObserver.forward`` (l.96-103) takes ``x.contiguous().view(H, -1)`` of a
(B, H, S, D) tensor and ``recall_window`` (``core/observer/recall_window.py``) keeps the
narrowest window holding ``int(ratio * n)`` sorted values of each row; the running min/max are
the elementwise min of mins and max of maxes over calls. ``calculate_int_qparam``
(``ir/api/impl/int_quantization.py`` l.41-97, symmetric branch l.79-85) turns them into
``scale = max(max(-min(min, 0), max(max, 0)) / 127, eps_fp32)`` and a zero offset, and the
exporter (``core/quant_service/modelslim_v1/save/ascendv1.py`` ``_save_activation_per_head``
l.550-558) writes ``<placeholder>.scale`` as float32 (H, 1) and ``<placeholder>.offset`` as int8
zeros (H, 1), both tagged ``FAQuant``. The quantize is ``int_quantize`` (l.130-157):
``clamp(round(x / scale + offset), -128, 127)`` with the scale on the head axis (1).

Note: ``view(H, -1)`` groups heads only for B = 1 (a contiguous (B, H, S, D) tensor's row r is
its r-th chunk of B*S*D/H values, which spans whole batches when B > 1); :func:`fa3_head_range`
reproduces this, as the export does. PFA/FIA take one ``deq_scale1`` per call (per tensor), so a
per-head scale needs one call per head, or the per-tensor maximum.

**K-mean smoothing (SageAttention).** ``sageattention/core.py`` (``km = k.mean(dim=seq_dim,
keepdim=True)``) and ``sageattention/triton/quant_per_block.py`` (``k -= km`` before quantizing K;
thu-ml/SageAttention at e533d47c): ``softmax(q (k - km)^T) = softmax(q k^T)`` exactly, since
``q km^T`` is one constant per query row; the smoothed K has a smaller range, so its int8 step is
finer when K carries a large common offset.
"""

from __future__ import annotations

import torch

from opsnn_quant.ascend._checks import require_dtype
from opsnn_quant.errors import ShapeError

_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INT8_SYM_MAX = 127.0


@torch.no_grad()
def fa3_head_range(x: torch.Tensor, ratio: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (min, max) of one calibration call, as msModelSlim's ``_FA3PerHeadObserver``.

    Rows are ``x.contiguous().view(x.shape[1], -1)`` (heads when B = 1, see the module note);
    each row's window is the narrowest ``[sorted[i], sorted[i + t - 1]]`` with
    ``t = int(ratio * n)`` (the first such i on ties, as ``recall_window``'s strict ``<``).

    Args:
        x: float (B, H, S, D).
        ratio: in (0, 1]; 1.0 is plain min-max.

    Returns:
        ``(min, max)``, each (H,) in ``x``'s dtype.
    """
    op = "fa3_head_range"
    require_dtype("x", x, _FLOATS, op)
    if x.dim() != 4:
        raise ShapeError(f"{op}: x must be (B, H, S, D), got {tuple(x.shape)}")
    rows = x.contiguous().view(x.shape[1], -1)
    n = rows.shape[1]
    t = int(ratio * n)
    if not 0.0 < ratio <= 1.0 or t < 1:
        raise ShapeError(f"{op}: ratio must keep at least one of {n} values, got {ratio}")
    ordered, _ = torch.sort(rows, dim=-1)
    widths = ordered[:, t - 1 :].to(torch.float64) - ordered[:, : n - t + 1].to(torch.float64)
    start = torch.argmin(widths, dim=-1, keepdim=True)  # first minimum, like the strict `<`
    lo = torch.gather(ordered, 1, start).squeeze(1)
    hi = torch.gather(ordered, 1, start + (t - 1)).squeeze(1)
    return lo, hi


@torch.no_grad()
def fa3_per_head_scale(
    min_val: torch.Tensor, max_val: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FA3 export: symmetric int8 per-head scale and zero offset from calibrated ranges.

    ``scale = max(max(-min(min_val, 0), max(max_val, 0)) / 127, eps)`` computed in
    ``min_val``'s dtype (msModelSlim ``calculate_int_qparam``), then widened to float32.

    Args:
        min_val, max_val: (H,) running min / max per head.

    Returns:
        ``(scale, offset)``: float32 (H, 1) and int8 zeros (H, 1), the ``<placeholder>.scale`` /
        ``.offset`` tensors msModelSlim writes.
    """
    op = "fa3_per_head_scale"
    require_dtype("min_val", min_val, _FLOATS, op)
    require_dtype("max_val", max_val, _FLOATS, op)
    if min_val.dim() != 1 or min_val.shape != max_val.shape:
        raise ShapeError(
            f"{op}: min_val and max_val must both be (H,), got {tuple(min_val.shape)} and "
            f"{tuple(max_val.shape)}"
        )
    eps = torch.tensor([torch.finfo(torch.float32).eps]).type_as(min_val)
    lo = torch.min(min_val, torch.zeros_like(min_val))
    hi = torch.max(max_val, torch.zeros_like(max_val))
    scale = torch.max(torch.max(-lo, hi) / INT8_SYM_MAX, eps)
    scale = scale.to(torch.float32).unsqueeze(-1)
    return scale, torch.zeros_like(scale, dtype=torch.int8)


@torch.no_grad()
def fa3_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize Q, K or V (B, H, S, D) to int8 with FA3 per-head scales.

    ``clamp(round(x / scale[h]), -128, 127)`` in float32 (round half to even), the exported
    float32 scale on the head axis. msModelSlim's own fake quant divides in the activation's dtype
    (bf16 for a bf16 model), which can move a value by one step; this is the quantize with the
    exported scale.

    Args:
        x: float (B, H, S, D).
        scale: float32 (H, 1) or (H,), positive.

    Returns:
        int8 (B, H, S, D).
    """
    op = "fa3_quantize"
    require_dtype("x", x, _FLOATS, op)
    require_dtype("scale", scale, (torch.float32,), op)
    if x.dim() != 4 or scale.numel() != x.shape[1] or scale.dim() > 2:
        raise ShapeError(
            f"{op}: x must be (B, H, S, D) and scale (H, 1) with H={x.shape[1] if x.dim() else 0}, "
            f"got {tuple(x.shape)} and {tuple(scale.shape)}"
        )
    if not bool((scale > 0).all()):
        raise ShapeError(f"{op}: scales must be positive")
    y = torch.round(x.to(torch.float32) / scale.reshape(1, -1, 1, 1))
    return y.clamp_(-128, 127).to(torch.int8)


@torch.no_grad()
def smooth_k(key: torch.Tensor, seq_dim: int = -2) -> tuple[torch.Tensor, torch.Tensor]:
    """SageAttention's K smoothing: ``(key - km, km)`` with ``km = key.mean(seq_dim)``.

    Both in ``key``'s dtype, as SageAttention (``k.mean(dim=seq_dim, keepdim=True)``, then
    ``k -= km``). Attention over the smoothed key equals attention over ``key``: the subtracted
    ``q . km`` is one constant per query row, which softmax ignores.

    Args:
        key: float, the token axis at ``seq_dim`` (-2 for BNSD, 1 for BSND).
        seq_dim: the axis of tokens.

    Returns:
        ``(smoothed_key, km)``; ``km`` keeps ``seq_dim`` with size 1.
    """
    op = "smooth_k"
    require_dtype("key", key, _FLOATS, op)
    if not -key.dim() <= seq_dim < key.dim() or key.shape[seq_dim] == 0:
        raise ShapeError(f"{op}: key {tuple(key.shape)} has no token axis {seq_dim}")
    km = key.mean(dim=seq_dim, keepdim=True)
    return key - km, km
