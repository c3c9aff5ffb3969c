"""Seed-specific checks: attention softmax inputs in fp16, and GELU exact vs tanh approximation.

Softmax: the scores ``q k^T * scale`` are computed from the watched q/k projection outputs of
each attention call. Scores past 65504 overflow fp16 outright; scores above ln(65504) = 11.09 make
``exp`` overflow unless the kernel subtracts the row maximum first (Ascend's softmax kernels do,
so that case is reported as "needs max-subtraction", not as an overflow).

GELU: the relative error of the tanh approximation against the exact erf form on the real inputs
of each GELU, per modality; below ``1e-3`` the approximation is called safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.core.numerics import CHUNK, ExactSum, energies
from opsnn_quant.probe.hooks import is_attention
from opsnn_quant.probe.report import FP16_MAX, Finding
from opsnn_quant.types import Modality

EXP_LIMIT = math.log(FP16_MAX)  # 11.09
GELU_SAFE = 1e-3


def attention_parts(module: nn.Module) -> tuple[str, str, int, float] | None:
    """(q child name, k child name, heads, scale) for known attention classes, else None.

    None too for an attention that normalises q and k after projecting them (``norm_q``:
    SD3.5, FLUX, Wan): its softmax input is not computable from the projections' outputs, and
    the raw projections would overstate the scores the normalised attention actually sees.
    """
    if not is_attention(module):
        return None
    if getattr(module, "norm_q", None) is not None or getattr(module, "norm_k", None) is not None:
        return None
    if hasattr(module, "to_q"):  # diffusers
        heads = int(getattr(module, "heads"))  # noqa: B009 - typed access to a module attribute
        q_out = int(getattr(getattr(module, "to_q"), "out_features"))  # noqa: B009
        scale = float(getattr(module, "scale", 0.0)) or (q_out // heads) ** -0.5
        return "to_q", "to_k", heads, scale
    # transformers CLIP/Whisper (q_proj/k_proj)
    heads = int(
        getattr(module, "num_heads", 0)
        or getattr(getattr(module, "config", None), "num_attention_heads", 1)
    )
    head_dim = int(getattr(getattr(module, "q_proj"), "out_features")) // heads  # noqa: B009
    scale = float(getattr(module, "scaling", head_dim**-0.5))
    return "q_proj", "k_proj", heads, scale


@dataclass
class SoftmaxWatch:
    """Largest |score| of one attention module over the calibration calls."""

    heads: int
    scale: float
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    max_score: float = 0.0

    @torch.no_grad()
    def close_call(self) -> None:
        """Combine the q/k captured during one attention call."""
        if self.q is not None and self.k is not None and self.q.shape[0] == self.k.shape[0]:
            q, k = self.q[:1].float(), self.k[:1].float()  # one sample bounds the cost
            b, tq, c = q.shape[0], q.shape[-2], q.shape[-1]
            d = c // self.heads
            qh = q.reshape(b, tq, self.heads, d).transpose(1, 2)
            kh = k.reshape(b, k.shape[-2], self.heads, d).transpose(1, 2)
            # Head by head: a long sequence's full score tensor (heads x T x T) would be the
            # probe's largest allocation (1500-frame Whisper encoder: 54 MB per sample).
            for h in range(self.heads):
                lo, hi = torch.aminmax(qh[:, h] @ kh[:, h].transpose(-1, -2))
                self.max_score = max(self.max_score, max(-float(lo), float(hi)) * abs(self.scale))
        self.q = self.k = None

    def merge(self, other: SoftmaxWatch) -> None:
        """Add the scores ``other`` saw."""
        self.max_score = max(self.max_score, other.max_score)

    def finding(self, where: str, modality: Modality) -> Finding:
        """The verdict for this attention module."""
        m = self.max_score
        if m > FP16_MAX:
            verdict = "overflow: attention scores exceed 65504 in fp16; keep this attention in fp32"
        elif m > EXP_LIMIT:
            verdict = (
                f"exp overflows fp16 without max-subtraction (max score {m:.3g} > 11.09); "
                "safe with a max-subtracted softmax"
            )
        else:
            verdict = "safe"
        return Finding(
            kind="softmax_input", where=where, modality=modality, value=m, verdict=verdict
        )


@dataclass
class GeluWatch:
    """Exact-vs-tanh GELU error energies of one modality (summed exactly: the order of the
    calls, or of shares of the data merged, does not show)."""

    err: ExactSum = field(default_factory=ExactSum)
    ref: ExactSum = field(default_factory=ExactSum)
    modules: list[str] = field(default_factory=list)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Add one GELU input."""
        flat = x.detach().reshape(-1)
        for i in range(0, flat.numel(), CHUNK):  # chunks: two GELU copies of a whole activation
            xf = flat[i : i + CHUNK].float()
            e = energies(F.gelu(xf), F.gelu(xf, approximate="tanh"))
            self.err.add(e.noise)
            self.ref.add(e.signal)

    def merge(self, other: GeluWatch) -> None:
        """Add the inputs ``other`` saw (of the same modules)."""
        self.err.merge(other.err)
        self.ref.merge(other.ref)

    @property
    def seen(self) -> bool:
        """Whether any nonzero GELU input was seen."""
        return float(self.ref) > 0

    def finding(self, modality: Modality) -> Finding:
        """The verdict for this modality."""
        err, ref = float(self.err), float(self.ref)
        rel = math.sqrt(err / ref) if ref > 0 else 0.0
        verdict = (
            f"tanh approximation is safe here (relative error {rel:.2e} < {GELU_SAFE:g})"
            if rel < GELU_SAFE
            else f"keep exact GELU (tanh approximation error {rel:.2e})"
        )
        return Finding(
            kind="gelu_tanh_approx",
            where=f"{len(self.modules)} GELU modules",
            modality=modality,
            value=rel,
            verdict=verdict,
        )
