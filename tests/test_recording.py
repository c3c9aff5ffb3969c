"""Recorded root calls: splitting a call into batches only where that is safe."""

import torch

from opsnn_quant.recording import split_batch


def test_batch_split_only_where_it_is_safe():
    x, t = torch.randn(5, 4), torch.tensor(5)
    parts = split_batch(((x,), {"t": t, "flag": True, "none": None}), 2)
    assert [p[0][0].shape[0] for p in parts] == [2, 2, 1]
    assert torch.equal(parts[1][0][0], x[2:4]) and parts[1][1]["t"] is t and parts[1][1]["flag"]
    assert len(split_batch(((x,), {}), None)) == 1  # not asked
    assert len(split_batch(((x,), {}), 5)) == 1  # already small enough
    cache = object()  # e.g. a KV cache: cannot be sliced without model knowledge
    assert len(split_batch(((x,), {"past_key_values": cache}), 1)) == 1
    assert len(split_batch(((x, torch.randn(2, 4)), {}), 1)) == 1  # mixed leading sizes
    # Nested structures (an encoder-output tuple, a ModelOutput-like mapping) split leaf by leaf.
    from transformers.modeling_outputs import BaseModelOutput

    enc = torch.randn(5, 3, 2)
    ids = torch.arange(10).reshape(5, 2)
    nested = ((), {"encoder_outputs": (enc,), "extra": BaseModelOutput(last_hidden_state=enc),
                   "decoder_input_ids": ids, "use_cache": False})  # fmt: skip
    parts = split_batch(nested, 2)
    assert [p[1]["decoder_input_ids"].shape[0] for p in parts] == [2, 2, 1]
    assert torch.equal(parts[2][1]["encoder_outputs"][0], enc[4:])
    assert isinstance(parts[1][1]["extra"], BaseModelOutput)
    assert torch.equal(parts[1][1]["extra"][0], enc[2:4]) and parts[0][1]["use_cache"] is False
    assert len(split_batch(((), {"encoder_outputs": (enc,), "ids": ids[:4]}), 1)) == 1


def test_a_sample_subset_spreads_over_the_batch():
    from opsnn_quant.recording import sample_subset

    x = torch.arange(8.0).reshape(8, 1)  # a guidance pair: samples 0-3 unconditional, 4-7 not
    ctx = torch.arange(16.0).reshape(8, 2)
    t = torch.tensor(7)
    (args, kwargs) = sample_subset(((x,), {"ctx": (ctx,), "t": t}), 2)
    assert args[0].reshape(-1).tolist() == [0.0, 4.0]  # one of each half
    assert kwargs["ctx"][0].tolist() == [[0.0, 1.0], [8.0, 9.0]] and kwargs["t"] is t
    assert sample_subset(((x,), {}), 3)[0][0].reshape(-1).tolist() == [0.0, 2.0, 5.0]  # i*8//3
    call = ((x,), {})
    assert sample_subset(call, 8) is call and sample_subset(call, None) is call
    mixed = ((x, torch.randn(2, 4)), {})
    assert sample_subset(mixed, 1) is mixed  # no one batch size: kept whole


def test_recorded_outputs_are_taken_in_the_loop_and_equal_a_replay():
    from torch import nn

    from opsnn_quant.models.generic import GenericAdapter
    from opsnn_quant.recording import record_roots, replay

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    data = [torch.randn(3, 4) for _ in range(5)]
    adapter = GenericAdapter(model, {"": "other"}, lambda m: [m(x) for x in data])
    runs: list[int] = []
    model.register_forward_pre_hook(lambda m, a: runs.append(1))
    rec = record_roots(adapter, adapter.forward_loop(), max_calls=2, seed=3)
    assert len(runs) == 5  # the loop's five calls, no replay
    (root,) = rec.calls
    assert len(rec.calls[root]) == 2 and len(rec.outputs[root]) == 2
    for call, out in zip(rec.calls[root], rec.outputs[root], strict=True):
        assert torch.equal(out, replay(model, call).float())
        # and it is the output of that very input
        assert any(torch.equal(call[0][0], x) for x in data)


def _offer_batches(rec, batches):
    from opsnn_quant.core.stream import at_batch

    for i in batches:
        with at_batch(i):
            for j in range(3):  # three calls a batch
                rec.offer((torch.tensor([10.0 * i + j]),), {})


def test_the_reservoir_keeps_the_calls_of_smallest_priority_in_their_order():
    from opsnn_quant.core.stream import priority
    from opsnn_quant.recording import RootRecorder

    rec = RootRecorder("root", max_calls=4, seed=9)
    _offer_batches(rec, range(5))
    positions = [(i, j + 1) for i in range(5) for j in range(3)]
    drawn = sorted(positions, key=lambda p: priority(9, p))[:4]
    expected = [10.0 * i + (j - 1) for i, j in sorted(drawn)]
    assert [float(call[0][0]) for call in rec.calls] == expected
    assert rec.seen == 15


def test_reservoirs_of_shares_merge_into_the_reservoir_of_all_the_data():
    from opsnn_quant.recording import RootRecorder

    whole = RootRecorder("root", max_calls=4, seed=9)
    _offer_batches(whole, range(6))
    parts = [RootRecorder("root", max_calls=4, seed=9) for _ in range(3)]
    for part, batches in zip(parts, (range(0, 1), range(1, 4), range(4, 6)), strict=True):
        _offer_batches(part, batches)
    merged = parts[0]
    merged.merge(parts[1].portable())
    merged.merge(parts[2])
    assert [float(c[0][0]) for c in merged.calls] == [float(c[0][0]) for c in whole.calls]
    assert merged.priority == whole.priority and merged.seen == whole.seen == 18
