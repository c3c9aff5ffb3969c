"""Error-compensating rounding of per-channel int8 weights (GPTQ) and bias correction.

GPTQ (Frantar et al., 2022, Algorithm 1) rounds a Linear's weight one input column at a time and
spreads each column's rounding error over the columns not yet rounded, weighted by the inverse
Hessian of the layer's squared output error, ``H = 2 X^T X / n`` over calibration inputs ``X``.
Here the scales are fixed first, exactly as round-to-nearest computes them
(``max|W_n| / 127`` per output channel): the result is an ordinary symmetric per-channel int8
weight with the same scales, so every engine (QuantBatchMatmulV3, MindIE-SD's and vLLM-Ascend's
W8A8 Linears, ATC's QDQ) runs it unchanged; only which integer each weight rounds to differs.

Order of operations (the reference implementation's, ``gptq.py`` ``fasterquant``): columns whose
Hessian diagonal is zero (inputs never nonzero) are decoupled (diagonal 1); columns are visited
by decreasing Hessian diagonal (``act_order``); the diagonal is damped by ``damp`` times its mean;
the upper Cholesky factor of ``H^-1`` gives each column's update row; updates are applied lazily
per block of columns. Computed in float64, on the weight's device.

Bias correction (Nagel et al., 2019, "Data-Free Quantization", section 4.2): the quantized
weight shifts the expected output by ``(W_q - W) E[x]``; subtracting that from the bias removes
it (with static activations the bias lives in the int32 ``quant_bias``).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from opsnn_quant.core.memory import TrimBudget
from opsnn_quant.core.stream import current_batch
from opsnn_quant.errors import CalibrationError

log = logging.getLogger(__name__)

DEFAULT_DAMP = 0.01
DEFAULT_BLOCK = 128
# GPTQ rounds a weight's rows in chunks of at most this many bytes of float64 (see gptq_round)
ROW_CHUNK_BYTES = 64 * 2**20
# the heap's freed pages after GPTQ's roundings: trimmed every 64 MiB of them (see gptq_round)
_TRIMS = TrimBudget(64 << 20)


class InputMoments:
    """Streaming first and second moments of a Linear's (M, K) inputs: the mean row (bias
    correction) and, when ``gram``, ``X^T X`` (GPTQ's Hessian, K x K).

    Both are summed so that the order of the calls (or of shares of the data merged with
    :meth:`merge`) does not show in the result: within one data batch
    (:func:`opsnn_quant.core.stream.current_batch`; a batch is never split between processes) the
    calls' ``X^T X`` accumulate in fp32 (``addmm``, as the reference implementation's), and each
    batch's fp32 sum is added into a float64 sum, where a sum of fp32 terms is exact unless the
    terms of one entry span more than 2^29 (12 K^2 bytes per Linear: the float64 sum and the
    batch's fp32 one); each call's row sums (float64) go into a compensated float64 sum (a
    second float64 vector holds its rounding errors: ~106 bits).

    The K x K sums are allocated at the first rows (a module never called takes none), and
    :meth:`spill` moves the float64 one to a file (:class:`MomentStore`) once collecting is
    over: then every read of :attr:`xtx` loads it back, and nothing is kept in memory. Moments
    that :meth:`stream_to` a store keep only the open batch's fp32 sum in memory (4 K^2 bytes):
    each closed batch is added into the float64 sum in the file (read, the same ``+=``,
    written back), so the file holds the bits the in-memory sum would.

    Args:
        channels: K.
        gram: also accumulate ``X^T X``.
    """

    def __init__(self, channels: int, gram: bool = True) -> None:
        self.channels = channels
        self.gram = gram
        self.reset()

    def reset(self) -> None:
        """Forget everything collected."""
        self.rows = 0
        self.total = torch.zeros(self.channels, dtype=torch.float64)
        self.total_error = torch.zeros(self.channels, dtype=torch.float64)
        self._sum: torch.Tensor | None = None  # float64 X^T X of the closed batches (lazy)
        self._open: torch.Tensor | None = None  # this batch's fp32 X^T X
        self._open_batch: int | None = None
        self._load: Callable[[], torch.Tensor] | None = None  # X^T X spilled to a file
        self._store: MomentStore | None = None  # streaming: closed batches go to its file

    @property
    def xtx(self) -> torch.Tensor | None:
        """``X^T X`` of every row so far (float64; None without ``gram``)."""
        if not self.gram:
            return None
        self._close_batch()
        if self._load is not None:
            return self._load()
        return self._gram_sum()

    @property
    def spilled(self) -> bool:
        """Whether ``X^T X`` lives in a file and takes no more rows (see :meth:`spill`)."""
        return self._load is not None and self._store is None

    def stream_to(self, store: MomentStore) -> None:
        """From now on, add each closed batch's ``X^T X`` into a float64 sum in a file of
        ``store`` (the same bits as in memory), keeping only the open batch's fp32 sum;
        :meth:`spill` ends it. Only before the first rows."""
        if self.rows or self._load is not None:
            raise CalibrationError("input moments stream to a file from their first rows only")
        if self.gram:
            self._store = store

    def _gram_sum(self) -> torch.Tensor:
        """The float64 sum, allocated (zeros, on the totals' device) at its first use."""
        if self._sum is None:
            k = self.channels
            self._sum = torch.zeros(k, k, dtype=torch.float64, device=self.total.device)
        return self._sum

    @torch.no_grad()
    def spill(self, store: MomentStore) -> None:
        """Close the open batch and move ``X^T X`` to a file of ``store``: read back whole on
        each use of :attr:`xtx` (the same float64 bits), nothing more collected or merged."""
        if self.gram and self._store is not None:  # streamed: the file has it all once closed
            self._close_batch()
            if self._load is None:  # never called: the zeros an in-memory sum would hold
                self._load = self._store.write(self._gram_sum())
                self._sum = None
            self._store = None
        elif self.gram and self._load is None:
            self._close_batch()
            self._load = store.write(self._gram_sum())
            self._sum = None

    @torch.no_grad()
    def collect(self, x2d: torch.Tensor) -> None:
        """Add (M, K) rows."""
        if self.spilled:
            raise CalibrationError("input moments spilled to a file take no more rows")
        x = x2d.detach().reshape(-1, self.channels)
        self._to(x.device)
        xf = x.to(torch.float32)
        self._add_total(xf.sum(dim=0, dtype=torch.float64), None)
        if self.gram:
            batch = current_batch() or 0
            if batch != self._open_batch:
                self._close_batch()
                self._open_batch = batch
            if self._open is None:
                k = self.channels
                self._open = torch.zeros(k, k, dtype=torch.float32, device=x.device)
            self._open.addmm_(xf.T, xf)
        self.rows += x.shape[0]

    @torch.no_grad()
    def merge(self, other: InputMoments) -> None:
        """Add the moments of ``other`` (the same K)."""
        if self._load is not None or self._store is not None:
            raise CalibrationError("input moments in a file take no more rows")
        if self.rows == 0:
            self._to(other.total.device)
        self._add_total(other.total, other.total_error)
        if self.gram and other.gram:
            theirs = other.xtx
            assert theirs is not None
            self._close_batch()
            total = self._gram_sum()
            total += theirs.to(total.device)
        self.rows += other.rows

    def _close_batch(self) -> None:
        """Add the open batch's fp32 sum into the float64 one (streaming: the file's)."""
        if self._open is None:
            return
        if self._store is None:
            total = self._gram_sum()
            total += self._open.to(total.device, torch.float64)
        else:
            # the file's sum, or the zeros the in-memory one starts from: the same additions
            total = self._gram_sum() if self._load is None else self._load()
            total += self._open.to(total.device, torch.float64)
            self._load = self._store.write(total, replacing=self._load)
            self._sum = None
            del total
        self._open = None
        self._open_batch = None

    def _to(self, device: torch.device) -> None:
        if self.total.device != device:
            self._close_batch()
            self.total, self.total_error = self.total.to(device), self.total_error.to(device)
            self._sum = None if self._sum is None else self._sum.to(device)

    def _add_total(self, value: torch.Tensor, error: torch.Tensor | None) -> None:
        """``total += value`` with the rounding error kept (Knuth's TwoSum)."""
        value = value.to(self.total.device)
        s = self.total + value
        v = s - self.total
        self.total_error += (self.total - (s - v)) + (value - v)
        if error is not None:
            self.total_error += error.to(self.total.device)
        self.total = s

    def mean(self, smooth: torch.Tensor | None = None) -> torch.Tensor:
        """``E[x]`` (float64), of ``x / smooth`` when given."""
        m = (self.total + self.total_error) / max(self.rows, 1)
        return m if smooth is None else m / smooth.to(m)

    def hessian(self, smooth: torch.Tensor | None = None) -> torch.Tensor:
        """``2 X^T X / n`` (float64), of the inputs ``x / smooth`` when given:
        ``H_ij / (s_i s_j)``."""
        if self.xtx is None:
            raise CalibrationError("no second moments were collected (gram=False)")
        h = 2.0 * self.xtx.to(torch.float64) / max(self.rows, 1)
        if smooth is None:
            return h
        s = smooth.to(h)
        return h / (s.unsqueeze(1) * s.unsqueeze(0))


# odd multipliers of the hash, below 2^28: six products of 32-bit patterns sum below 2^62 (no
# overflow of the int64 arithmetic, the same on every platform)
_MIX = torch.tensor([0x9E3779B, 0x85EBCA7, 0xC2B2AE3, 0x27D4EB3, 0x165667B, 0xD3A2645])


@torch.no_grad()
def row_halves(x2d: torch.Tensor) -> torch.Tensor:
    """A bool per (M, K) row: its half (a hash of the float32 bits of its first values)."""
    k = min(x2d.shape[1], _MIX.numel())
    bits = x2d[:, :k].to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    h = (bits * _MIX[:k].to(bits.device)).sum(dim=1)
    h = h ^ (h >> 29) ^ (h >> 13)
    return (h & 1).bool()


class SplitMoments:
    """The input moments of one Linear (or a conv's im2col rows) in two halves of its rows
    (:func:`row_halves`). The probe measures a GPTQ candidate on each half through the one
    fitted on the other (:mod:`opsnn_quant.probe.crossfit`); quantize() collects its own pass
    the same way, so that its :meth:`merged` sums, and the integers GPTQ picks from them, are
    the probe's bit for bit.

    Args:
        channels: K.
        gram: also accumulate ``X^T X``.
    """

    def __init__(self, channels: int, gram: bool = True) -> None:
        self.channels = channels
        self.halves = (InputMoments(channels, gram), InputMoments(channels, gram))

    @torch.no_grad()
    def collect(self, rows: torch.Tensor) -> None:
        """Add (M, K) rows, each to its half."""
        second = row_halves(rows)
        self.halves[0].collect(rows[~second])
        self.halves[1].collect(rows[second])

    @property
    def spilled(self) -> bool:
        """Whether both halves' ``X^T X`` live in files (see :meth:`spill`)."""
        return all(h.spilled for h in self.halves)

    def spill(self, store: MomentStore) -> None:
        """Move both halves' ``X^T X`` to files of ``store`` (:meth:`InputMoments.spill`)."""
        for half in self.halves:
            half.spill(store)

    def stream_to(self, store: MomentStore) -> None:
        """Both halves' closed batches into files of ``store`` (:meth:`InputMoments.stream_to`)."""
        for half in self.halves:
            half.stream_to(store)

    def merged(self) -> InputMoments:
        """The moments of all rows (what quantize() fits the deployed module on). Of spilled
        halves, moments whose ``X^T X`` is summed from the files at each read (the same
        operations, so the same bits): nothing K x K is held until then."""
        a, b = self.halves
        if not (a.gram and self.spilled):
            out = InputMoments(a.channels, a.gram)
            out.merge(a)
            out.merge(b)
            return out
        out = InputMoments(a.channels, gram=False)
        out.merge(a)
        out.merge(b)
        out.gram = True
        out._load = partial(_merged_xtx, a, b)
        return out

    def merge(self, other: SplitMoments) -> None:
        """Add the moments of ``other`` (the same K), half by half."""
        for mine, theirs in zip(self.halves, other.halves, strict=True):
            mine.merge(theirs)

    def mean(self, smooth: torch.Tensor | None = None) -> torch.Tensor:
        """``E[x]`` of all rows (see :meth:`InputMoments.mean`)."""
        return self.merged().mean(smooth)

    def hessian(self, smooth: torch.Tensor | None = None) -> torch.Tensor:
        """``2 X^T X / n`` of all rows (see :meth:`InputMoments.hessian`)."""
        return self.merged().hessian(smooth)

    def fitted_for(self, half: int) -> InputMoments:
        """The moments a candidate measured on rows of ``half`` is fitted on: the other half's
        (all rows when the other half is empty: too little data to split)."""
        other = self.halves[1 - half]
        return other if other.rows else self.merged()


def _merged_xtx(a: InputMoments, b: InputMoments) -> torch.Tensor:
    """``X^T X`` of two spilled halves, summed as :meth:`SplitMoments.merged` sums them."""
    first, second = a.xtx, b.xtx
    assert first is not None and second is not None
    total = torch.zeros(a.channels, a.channels, dtype=torch.float64, device=a.total.device)
    total += first.to(total.device)
    total += second.to(total.device)
    return total


class MomentStore:
    """A temporary directory that tensors are spilled to (input moments:
    :meth:`InputMoments.spill`, :meth:`InputMoments.stream_to`; the probe's parked candidate
    weights): one raw file per tensor, read back whole on each use; the directory goes when the
    last reader of it is gone.

    Args:
        directory: where to make the temporary directory (None: the system's default).
    """

    def __init__(self, directory: str | None = None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="opsnn-quant-moments-", dir=directory)
        self._count = 0
        self.bytes = 0

    @torch.no_grad()
    def write(
        self, tensor: torch.Tensor, replacing: Callable[[], torch.Tensor] | None = None
    ) -> Callable[[], torch.Tensor]:
        """Write ``tensor`` to a file of its own (``replacing``: over the file that reader of
        this store reads, a tensor of the same size); returns what reads it back (same dtype,
        shape and device)."""
        host = tensor.detach().to("cpu").contiguous()
        if isinstance(replacing, partial) and replacing.args[:1] == (self,):
            # a new file renamed over the old one: a tensor read from the old one maps it (a
            # private mapping: truncating that file under it would fault), ``tensor`` included
            path = replacing.args[1]
            fresh = path.with_suffix(".new")
            host.numpy().tofile(fresh)
            os.replace(fresh, path)
        else:
            path = Path(self._dir.name) / f"{self._count}.bin"
            self._count += 1
            self.bytes += host.numel() * host.element_size()
            host.numpy().tofile(path)
        return partial(_read, self, path, tuple(host.shape), host.dtype, tensor.device)


def _read(
    store: MomentStore,
    path: Path,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """One spilled tensor, read back (``store`` keeps its directory alive)."""
    numel = 1
    for d in shape:
        numel *= d
    flat = torch.from_file(str(path), shared=False, size=numel, dtype=dtype)
    return flat.reshape(shape).to(device)


# Either form of the moments a module is fitted on: collected in halves by its own pass, or
# merged (seeded from the probe's statistics).
Moments = InputMoments | SplitMoments


@torch.no_grad()
def gptq_round(
    w: torch.Tensor,
    scale: torch.Tensor,
    hessian: torch.Tensor,
    damp: float = DEFAULT_DAMP,
    block: int = DEFAULT_BLOCK,
    act_order: bool = True,
) -> torch.Tensor:
    """GPTQ's int8 weight for fixed per-channel scales.

    Args:
        w: (N, K) float weight (already smoothed where SmoothQuant applies).
        scale: (N,) per-output-channel scales (as round-to-nearest computes them).
        hessian: (K, K) ``2 X^T X / n`` of the inputs the weight multiplies.
        damp: diagonal damping, a fraction of the mean diagonal (raised tenfold, up to three
            times, when the damped Hessian is still not positive definite).
        block: columns updated together (lazy batch updates; the result does not depend on it
            beyond rounding of the float64 sums).
        act_order: visit columns by decreasing Hessian diagonal.

    Returns:
        int8 (N, K).

    Raises:
        CalibrationError: shapes that do not fit, or a Hessian no damping makes invertible.
    """
    try:
        return _gptq_round(w, scale, hessian, damp, block, act_order)
    finally:
        # its float64 copies (K x K, N x K, a few of each) are freed: give the pages back once
        # 64 MiB of them add up, or the heap keeps them and every module's GPTQ leaves its
        # holes (a model's depth of them); a trim per call was 1.1 of a demo calibrate's 55 s
        # (627 roundings of small modules, ~1.4 ms each)
        n, k = w.shape
        _TRIMS.add(8 * (6 * k * k + 2 * n * k))


def _gptq_round(
    w: torch.Tensor,
    scale: torch.Tensor,
    hessian: torch.Tensor,
    damp: float,
    block: int,
    act_order: bool,
) -> torch.Tensor:
    """:func:`gptq_round` (its arguments)."""
    n, k = w.shape
    if scale.shape != (n,) or hessian.shape != (k, k):
        raise CalibrationError(
            f"GPTQ: weight {tuple(w.shape)}, scale {tuple(scale.shape)} and Hessian "
            f"{tuple(hessian.shape)} do not fit"
        )
    h = hessian.detach().to(torch.float64).clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0  # an input never seen: its column is rounded alone
    perm = (
        torch.argsort(torch.diagonal(h), descending=True, stable=True)
        if act_order
        else torch.arange(k, device=h.device)
    )
    h = h[perm][:, perm]
    upper = _inverse_cholesky(h, damp)
    del h
    # the integers as they are rounded (exact in int8: clamped to [-128, 127])
    q = torch.empty((n, k), dtype=torch.int8, device=w.device)
    # Rows are independent in GPTQ (one Hessian, errors spread along a row's columns only):
    # rounded in chunks of at most ROW_CHUNK_BYTES of float64 weight, so that its copies and
    # the block updates' temporaries stay a few chunks' size, not the weight's (Whisper's
    # 51865 x 512 vocabulary projection: 212 MB per float64 copy, 0.5 GB at once unchunked).
    rows = max(1, ROW_CHUNK_BYTES // (8 * k))
    for r1 in range(0, n, rows):
        r2 = min(r1 + rows, n)
        _round_rows(w[r1:r2], scale[r1:r2], perm, upper, block, q[r1:r2])
    return q[:, torch.argsort(perm)]


def _round_rows(
    w: torch.Tensor,
    scale: torch.Tensor,
    perm: torch.Tensor,
    upper: torch.Tensor,
    block: int,
    q: torch.Tensor,
) -> None:
    """GPTQ on rows ``w`` (R, K) with the permuted inverse's upper factor: their integers, in
    the permuted column order, into ``q`` (R, K)."""
    k = w.shape[1]
    # one float64 copy of the rows, permuted (indexing copies: the caller's stays as it is)
    weight = w.detach()[:, perm].to(torch.float64)
    s = scale.detach().to(torch.float64)
    columns = _columns_numpy if weight.device.type == "cpu" else _columns_torch
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        err1 = columns(weight[:, i1:i2].clone(), upper[i1:i2, i1:i2], s, q[:, i1:i2])
        weight[:, i2:] -= err1 @ upper[i1:i2, i2:]


def _columns_torch(
    w1: torch.Tensor, u1: torch.Tensor, s: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:
    """One block's columns in order: each rounded (into ``q``), its error spread over the
    block's later columns of ``w1`` (updated in place); returns the scaled errors."""
    err1 = torch.zeros_like(w1)
    for i in range(w1.shape[1]):
        col = w1[:, i]
        qi = torch.round(col / s).clamp(-128, 127)
        q[:, i] = qi
        err = (col - qi * s) / u1[i, i]
        w1[:, i:] -= err.unsqueeze(1) * u1[i, i:].unsqueeze(0)
        err1[:, i] = err
    return err1


def _columns_numpy(
    w1: torch.Tensor, u1: torch.Tensor, s: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:
    """:func:`_columns_torch` on a CPU in NumPy: the same float64 operations in the same order
    (elementwise: each IEEE-rounded alike, whatever the layout; ``rint`` and ``round`` both
    round half to even; a product and a difference are two roundings in both), so the same
    bits, at a fraction of torch's per-call overhead on one column of N values (the loop is K
    steps of ~10 small operations: most of the probe's GPTQ time on small models).

    The block is held transposed (a column of the weight is a contiguous row), and the
    temporaries are allocated once: each step's rank-1 update then runs over contiguous
    memory, 1.3-1.9x faster than on the strided columns at N >= 1152 (the loop is memory-bound:
    N x block / 2 products and differences per column). The block's matmul stays in torch (its
    summation order is torch's BLAS')."""
    wt = np.ascontiguousarray(w1.numpy().T)  # (block, N)
    u, sn = u1.numpy(), s.numpy()
    b, n = wt.shape
    err_t = np.empty((b, n))
    q_t = np.empty((b, n))  # the integers, as float64 (exact), written into ``q`` at the end
    tmp = np.empty((b, n))
    e = np.empty(n)
    for i in range(b):
        col, qi = wt[i], q_t[i]
        np.divide(col, sn, out=qi)
        np.rint(qi, out=qi)
        np.clip(qi, -128, 127, out=qi)
        np.multiply(qi, sn, out=e)
        np.subtract(col, e, out=e)
        np.divide(e, u[i, i], out=err_t[i])
        # the later columns of the block: w[:, j] -= err * u[i, j], j >= i
        t = tmp[: b - i]
        np.multiply(u[i, i:][:, None], err_t[i][None, :], out=t)
        np.subtract(wt[i:], t, out=wt[i:])
    q.copy_(torch.from_numpy(q_t.T))
    return torch.from_numpy(np.ascontiguousarray(err_t.T))


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """The upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``."""
    k = h.shape[0]
    mean_diag = float(torch.diagonal(h).mean())
    eye = torch.eye(k, dtype=h.dtype, device=h.device)
    for attempt in range(4):
        lam = damp * 10.0**attempt
        chol, info = torch.linalg.cholesky_ex(h + lam * mean_diag * eye)
        if int(info) == 0:
            inv = torch.cholesky_inverse(chol)
            upper, info = torch.linalg.cholesky_ex(inv, upper=True)
            if int(info) == 0:
                if attempt:
                    log.info("GPTQ: Hessian damped with %.3g of its mean diagonal", lam)
                return upper
    raise CalibrationError("GPTQ: the calibration inputs' Hessian is not positive definite")


@torch.no_grad()
def corrected_bias(
    bias: torch.Tensor | None,
    w: torch.Tensor,
    w_q: torch.Tensor,
    scale: torch.Tensor,
    mean: torch.Tensor,
) -> torch.Tensor:
    """``bias - (W_q s - W) E[x]``: the bias that removes the quantized weight's expected output
    shift (float32, (N,); a module without bias gets the correction alone).

    Args:
        bias: (N,) float bias or None.
        w: (N, K) float weight (smoothed where SmoothQuant applies).
        w_q: (N, K) int8 weight.
        scale: (N,) its per-channel scales.
        mean: (K,) ``E[x]`` of the inputs ``w`` multiplies.
    """
    n, k = w.shape
    m = mean.to(torch.float64)
    s = scale.detach().to(torch.float64)
    shift = torch.empty(n, dtype=torch.float64, device=w.device)
    # in row chunks (as gptq_round): three float64 copies of a vocabulary projection's weight
    # at once were 0.6 GB, Whisper-base's peak
    rows = max(1, ROW_CHUNK_BYTES // (8 * k))
    for r1 in range(0, n, rows):
        r2 = min(r1 + rows, n)
        wd = w[r1:r2].detach().to(torch.float64)
        deq = w_q[r1:r2].to(torch.float64) * s[r1:r2].unsqueeze(1)
        shift[r1:r2] = (deq - wd) @ m.to(wd)
    base = torch.zeros_like(shift) if bias is None else bias.detach().to(torch.float64)
    return (base - shift).to(torch.float32)
