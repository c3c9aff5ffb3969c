"""Positions of calls in the data and the seeded draws keyed by them (opsnn_quant/core/stream.py)."""

import hashlib
import struct

import torch

from opsnn_quant.core.stream import CallCounter, at_batch, current_batch, priorities, priority


def test_positions_count_calls_within_each_batch():
    counter = CallCounter()
    seen = []
    assert current_batch() is None
    seen.append(counter.next())  # outside a loop: batch 0
    with at_batch(3):
        assert current_batch() == 3
        seen += [counter.next(), counter.next()]
    with at_batch(4):
        seen.append(counter.next())
    assert current_batch() is None
    assert seen == [(0, 1), (3, 1), (3, 2), (4, 1)]


def test_draws_depend_on_seed_and_position_only():
    # the key: blake2b (8 bytes, little endian) of the little-endian int64s (seed, *position),
    # shifted right once; the draw its top 53 bits over 2^53
    digest = hashlib.blake2b(struct.pack("<3q", 7, 2, 5), digest_size=8).digest()
    key = int.from_bytes(digest, "little") >> 1
    assert priority(7, (2, 5)) == (key >> 10) / 2.0**53
    assert 0.0 <= priority(7, (2, 5)) < 1.0
    assert priority(7, (2, 5)) != priority(8, (2, 5)) != priority(7, (5, 2))
    rows = priorities(7, (2, 5), 100)
    assert rows.dtype == torch.float64 and rows.shape == (100,)
    assert torch.equal(rows, priorities(7, (2, 5), 100))  # no hidden state
    assert torch.equal(rows[:10], priorities(7, (2, 5), 10))  # row r's draw whatever the count
    assert not torch.equal(rows, priorities(7, (2, 6), 100))
