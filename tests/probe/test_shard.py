"""A probe whose pass 1 ran over shares of the data (another process's sent pickled) is the
probe over all of it: report, calibration statistics and recorded calls, bit for bit
(opsnn_quant/probe/api.py ``Shard``, opsnn_quant/probe/passes.py ``Watches.merge``)."""

import pickle

import numpy as np
import pytest
import torch

from opsnn_quant.models import load_adapter
from opsnn_quant.probe.api import ProbeConfig, Shard, run_probe, statistics
from tests.tiny_pipelines import save_tiny_sd

pytest.importorskip("diffusers")

PROMPTS = ["a red circle", "a blue square", "a green circle", "a red square", "a big circle"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    path = save_tiny_sd(tmp_path_factory.mktemp("tiny-sd") / "pipe")
    return load_adapter("diffusers-sd", str(path), steps=2, batch_size=2, guidance_scale=4.0)


def _sent(watches):
    return pickle.loads(pickle.dumps(watches))  # what the other process's gather delivers


def test_a_probe_over_shares_is_the_probe_over_all_the_data(adapter):
    cfg = ProbeConfig(max_root_calls=2, fp16_rerun="emulate", estimator_samples=1)
    whole = run_probe(adapter, adapter.forward_loop(PROMPTS), cfg)
    # 3 batches (2 + 2 + 1 prompts): batch 0 here, batches 1 and 2 in two other "processes"
    later = [
        adapter.forward_loop(PROMPTS[2:4], first_batch=1),
        adapter.forward_loop(PROMPTS[4:], first_batch=2),
    ]
    shard = Shard(
        adapter.forward_loop(PROMPTS[:2]),
        lambda: [_sent(statistics(adapter, loop, cfg)) for loop in later],
    )
    shared = run_probe(adapter, adapter.forward_loop(PROMPTS), cfg, shard=shard)

    assert shared.report.model_dump(exclude={"costs"}) == whole.report.model_dump(exclude={"costs"})
    assert shared.statistics.keys() == whole.statistics.keys()
    for name, a in shared.statistics.items():
        b = whole.statistics[name]
        assert (a.calls, a.elements, a.channel_seen) == (b.calls, b.elements, b.channel_seen)
        assert (a.minmax.min, a.minmax.max) == (b.minmax.min, b.minmax.max)
        assert np.array_equal(a.mse.hist, b.mse.hist) and a.mse.radius == b.mse.radius
        assert a.steps.absmax == b.steps.absmax and a.steps.count == b.steps.count
        if b.channel_absmax is not None:
            assert torch.equal(a.channel_absmax, b.channel_absmax)
        if b.moments is not None:
            assert torch.equal(a.moments.xtx, b.moments.xtx)
            assert torch.equal(a.moments.mean(), b.moments.mean())
    for root, calls in whole.root_calls.items():
        (args, _), (args2, _) = calls[0], shared.root_calls[root][0]
        assert all(torch.equal(x, y) for x, y in zip(args, args2, strict=True))


def test_a_share_numbers_its_batches_as_in_the_whole_data(adapter):
    from opsnn_quant.core.stream import current_batch

    seen = []
    h = adapter.model.unet.register_forward_pre_hook(lambda m, a: seen.append(current_batch()))
    try:
        adapter.forward_loop(PROMPTS[2:], first_batch=1)(adapter.model)
    finally:
        h.remove()
    assert seen == [1, 1, 2, 2]  # 2 steps a batch
