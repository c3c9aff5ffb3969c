"""Out-of-sample errors for candidates fitted to the calibration inputs (GPTQ's Hessian).

A GPTQ candidate chooses its integers against the Hessian of the very inputs the probe then
measures it on: in sample, its error looks far better than on other data (whisper-tiny.en's
decoder Linears, 192 calibration rows for K = 384: 30x below round to nearest in sample, 2.4x on
held-out utterances). So the probe keeps the input moments in two halves and measures each row
through the candidate fitted on the other half: an out-of-sample error, from half the data
(slightly pessimistic: the deployed module is fitted on all of it).

A row's half is a hash of its values, not of its position: the probe measures on replayed and
re-batched calls (small calls are joined, samples strided), where positions differ from pass 1,
and the same row must land in the same half in both.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from opsnn_quant.quant.gptq import SplitMoments, row_halves

__all__ = ["SplitMoments", "crossfit_pixels", "crossfit_rows", "row_halves"]


@torch.no_grad()
def crossfit_rows(
    x: torch.Tensor, run: Callable[[int, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """A Linear's output on ``x`` (..., K) with each row run by ``run(half, rows)``: the
    candidate fitted for that half (:meth:`SplitMoments.fitted_for`)."""
    rows = x.reshape(-1, x.shape[-1])
    second = row_halves(rows)
    parts = [(h, mask) for h, mask in ((0, ~second), (1, second)) if bool(mask.any())]
    outs = [(mask, run(h, rows[mask])) for h, mask in parts]
    first = outs[0][1]
    y = first.new_empty((rows.shape[0], first.shape[-1]))
    for mask, out in outs:
        y[mask] = out
    return y.reshape(*x.shape[:-1], first.shape[-1])


@torch.no_grad()
def crossfit_pixels(rows: torch.Tensor, run: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """A conv's (B, O, OH, OW) output with each output pixel from the candidate fitted for the
    half of its im2col row (``rows``, (B * OH * OW, K) in output-pixel order); ``run(half)``
    gives the whole map through that half's candidate."""
    second = row_halves(rows)
    if not bool(second.any()):
        return run(0)
    if bool(second.all()):
        return run(1)
    y0, y1 = run(0), run(1)
    b, _, oh, ow = y0.shape
    return torch.where(second.view(b, 1, oh, ow).to(y0.device), y1, y0)
