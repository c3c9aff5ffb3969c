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


# ---- issue 58 §9: offload directories carry a lock; the next run removes a killed run's ----

_KILLED = """
import os, signal, sys
from pathlib import Path
import torch
from torch import nn
from opsnn_quant.models.offload import BlockOffload

net = nn.Sequential(nn.ModuleList([nn.Sequential(nn.Linear(8, 8)) for _ in range(2)]))
off = BlockOffload(net, budget=1, directory=Path(sys.argv[1]))
print(off.dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no finalizer, no atexit: the files stay
"""


def _offload_dirs(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("opsnn-quant-offload-"))


def test_the_offload_files_of_a_killed_run_are_removed_by_the_next_run(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _KILLED, str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr
    left = tmp_path / proc.stdout.strip()
    assert left.parent == tmp_path and any(left.glob("block*.safetensors"))  # what a kill left
    off = BlockOffload(Net(), budget=1, directory=tmp_path)  # the next run
    assert not left.exists()
    assert _offload_dirs(tmp_path) == [off.dir.name]
    off.close()
    assert _offload_dirs(tmp_path) == []


def test_a_live_run_and_a_look_alike_are_left_alone(tmp_path):
    import fcntl
    import os

    from opsnn_quant.models.offload import LOCK_FILE, make_offload_dir, sweep_orphans

    live, lock = make_offload_dir(tmp_path)  # another run's, alive (its lock held)
    (live / "block0.safetensors").write_bytes(b"w")
    look_alike = tmp_path / "opsnn-quant-offload-mine"  # a user's, named like ours: no lock file
    look_alike.mkdir()
    (look_alike / "data.bin").write_bytes(b"precious")
    forged = tmp_path / "opsnn-quant-offload-forged"  # a lock file that does not say it is ours
    forged.mkdir()
    (forged / LOCK_FILE).write_text("something else\n")
    linked = tmp_path / "opsnn-quant-offload-link"  # a link to an orphan is not followed
    (tmp_path / "elsewhere").mkdir()
    orphan, orphan_lock = make_offload_dir(tmp_path / "elsewhere")
    orphan_lock.close()
    linked.symlink_to(orphan, target_is_directory=True)
    assert sweep_orphans(tmp_path) == []
    assert (live / "block0.safetensors").read_bytes() == b"w"
    assert (look_alike / "data.bin").read_bytes() == b"precious" and (forged / LOCK_FILE).exists()
    assert orphan.is_dir() and linked.is_symlink()
    # the same lock taken by another open file (what another process holds) keeps it too
    lock.close()
    fd = os.open(live / LOCK_FILE, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    assert sweep_orphans(tmp_path) == []
    os.close(fd)
    assert sweep_orphans(tmp_path) == [live]  # its owner gone: removed
    assert _offload_dirs(tmp_path) == [
        "opsnn-quant-offload-forged", "opsnn-quant-offload-link", "opsnn-quant-offload-mine"
    ]  # fmt: skip
