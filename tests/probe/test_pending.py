"""Pass 2's batches of small calls: when one is full, and what it hands back."""

import torch

from opsnn_quant.probe.pending import PENDING_BYTES, PENDING_ROWS, PendingBatch


def test_a_batch_is_full_at_512_rows_and_joins_its_calls_in_order():
    batch = PendingBatch(step=3)
    x = torch.zeros(100, 16)
    for i in range(5):
        batch.add(x + i, torch.ones(100, 8) * i)
        assert batch.full(16) == (100 * (i + 1) >= PENDING_ROWS)  # 500 rows: not yet
    batch.add(x[:12], torch.ones(12, 8))
    assert PENDING_ROWS == 512 and batch.full(16)
    xs, ys = batch.tensors()
    assert xs.shape == (512, 16) and ys.shape == (512, 8)
    assert xs[100, 0] == 1 and ys[499, 0] == 4  # calls in the order they came


def test_a_batch_of_wide_outputs_is_full_by_its_bytes():
    # A 200k-vocabulary LM head: 4 rows in, 200000 logits out per call; 128 MB of fp32 is 42
    # such calls (Whisper's 51864-token head still closes at 512 rows: 107 MB).
    batch = PendingBatch(step=None)
    calls = 0
    while not batch.full(384):
        batch.add(torch.zeros(4, 384), torch.zeros(4, 200_000))
        calls += 1
    assert calls == -(-PENDING_BYTES // (4 * (384 + 200_000) * 4))
    assert calls * 4 < PENDING_ROWS  # the bytes, not the rows, closed it


def test_a_kept_call_is_a_copy():
    batch = PendingBatch(step=None)
    x = torch.ones(2, 4)
    batch.add(x, x)
    x.zero_()  # the model reuses its buffer
    assert batch.tensors()[0].sum() == 8
