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
