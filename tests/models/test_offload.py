"""Block-wise offload (``--max-memory``): blocks on the meta device between forwards, the same
outputs, changes written back, the temporary files removed."""

from __future__ import annotations

import torch
from torch import nn

from opsnn_quant.models.offload import (
    BlockOffload,
    checkpointed,
    find_blocks,
    in_recompute,
    offload_of,
    resident,
    window,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.ModuleList([nn.Linear(8, 2), nn.Dropout(0.0)])  # bare layers: no block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head[0](h)


def _on_meta(module: nn.Module) -> bool:
    return all(t.device.type == "meta" for t in [*module.parameters(), *module.buffers()])


def test_blocks_are_the_outermost_module_lists_containers():
    assert list(find_blocks(Net())) == ["blocks.0", "blocks.1", "blocks.2"]


def test_offloaded_blocks_run_one_at_a_time_with_the_same_outputs(tmp_path):
    torch.manual_seed(0)
    net, x = Net().eval(), torch.randn(3, 4)
    want = net(x)
    off = BlockOffload(net, budget=1, directory=tmp_path)  # nothing fits: every block goes
    assert offload_of(net) is off and off.offloaded == ["blocks.0", "blocks.1", "blocks.2"]
    assert all(_on_meta(b) for b in net.blocks) and not _on_meta(net.embed)
    seen: list[bool] = []
    hook = net.blocks[1].fc.register_forward_hook(
        lambda m, a, o: seen.append(m.weight.device.type == "cpu" and _on_meta(net.blocks[0]))
    )
    assert torch.equal(net(x), want)
    hook.remove()
    assert seen == [True]  # block 1 loaded, block 0 freed again
    assert off.loads == 3 and all(_on_meta(b) for b in net.blocks)
    off.release()
    assert not off.dir.exists()


def test_a_budget_keeps_the_blocks_that_fit(tmp_path):
    net = Net()
    block = sum(t.numel() * 4 for t in net.blocks[0].parameters())
    rest = sum(t.numel() * 4 for t in net.parameters()) - 3 * block
    off = BlockOffload(net, budget=rest + 2 * block, directory=tmp_path)
    assert off.offloaded == ["blocks.1", "blocks.2"]  # block 0 and one in flight fit


def test_changes_outside_a_forward_are_written_back(tmp_path):
    net = Net().eval()
    off = BlockOffload(net, budget=1, directory=tmp_path)
    with window(net) as opened:
        assert opened is off
        off.touch("blocks.2.fc")
        net.blocks[2].fc.weight.data.mul_(0)  # in place
        net.blocks[2].fc.register_buffer("extra", torch.ones(2))  # a new tensor
        off.touch("blocks.0.norm")  # closes block 2
        assert _on_meta(net.blocks[2]) and not _on_meta(net.blocks[0])
    assert _on_meta(net.blocks[0])
    with resident(net):
        assert not any(_on_meta(b) for b in net.blocks)
        assert torch.count_nonzero(net.blocks[2].fc.weight) == 0
        assert torch.equal(net.blocks[2].fc.extra, torch.ones(2))
    off.close()  # all in memory again, hooks and files gone
    assert not any(_on_meta(b) for b in net.blocks) and offload_of(net) is None
    assert not off.dir.exists()


def _input_gradient(net: nn.Module, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    net(x).backward(v)
    assert x.grad is not None
    return x.grad


def test_a_checkpointed_backward_holds_one_block_and_gives_the_same_gradient(tmp_path):
    torch.manual_seed(0)
    net, x, v = Net().eval(), torch.randn(3, 4), torch.randn(3, 2)
    for p in net.parameters():
        p.requires_grad_(False)  # as the probe's attribution: gradients of activations only
    want = _input_gradient(net, x, v)
    off = BlockOffload(net, budget=1, directory=tmp_path)
    loaded: list[int] = []
    load = off._load

    def counting(block):  # how many blocks hold real tensors once one more has loaded
        load(block)
        loaded.append(sum(not _on_meta(b) for b in net.blocks))

    off._load = counting  # type: ignore[method-assign]
    # Without checkpointing, the backward needs no load: the graph kept every block's
    # weight alive (on meta in the module, in memory in autograd's saved tensors).
    assert torch.equal(_input_gradient(net, x, v), want) and len(loaded) == 3
    loaded.clear()
    seen: list[bool] = []  # a hook inside a block: the first run, then the recompute's
    hook = net.blocks[1].fc.register_forward_hook(lambda m, a, o: seen.append(in_recompute()))
    with checkpointed(net):
        got = _input_gradient(net, x, v)
    hook.remove()
    assert seen == [False, True] and not in_recompute()
    assert torch.equal(got, want)  # bit for bit: the recompute repeats the same operations
    # three loads for the forward, three for the backward's recomputes: the graph kept no
    # weight, and one block at a time held real tensors
    assert len(loaded) == 6 and max(loaded) == 1
    assert all(_on_meta(b) for b in net.blocks)
    assert "forward" not in net.blocks[0].__dict__  # the class's forward again
    loaded.clear()
    assert torch.equal(_input_gradient(net, x, v), want) and len(loaded) == 3  # plain again
    with checkpointed(Net()):  # a model all in memory: nothing to do
        pass
