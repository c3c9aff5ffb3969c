"""Block-wise offload (``--max-memory SIZE``, ``model.max_memory``): a model larger than the
memory it may take runs one transformer block at a time.

:class:`BlockOffload` finds a model's repeated blocks (the elements of its outermost
``nn.ModuleList`` s whose elements are containers: ``transformer.transformer_blocks.N``,
``model.encoder.layers.N``, ``unet.down_blocks.N``), keeps as many resident as the budget allows
beside the rest of the model and one block in flight, and writes each other block's tensors
(parameters and buffers) to a safetensors file in its own temporary directory, leaving them on
the ``meta`` device (shapes intact, no storage). The directory carries a lock file naming this
tool, locked for the offloader's life: a run killed (SIGKILL, OOM) leaves its directory behind,
and the next offloader in the same temporary folder removes it (:func:`sweep_orphans`). A forward pre-hook loads the block's tensors
back on entry, a forward hook frees them on exit: the values a forward sees are the bytes the
block held, so every result is the same bits as the in-memory run's.

Code that reads weights outside a forward (quantize's swap and freeze, the exports) opens the
blocks it needs: :meth:`BlockOffload.window` keeps one block open at a time (``touch(name)``
opens the block owning module ``name``, closing the previous one), :meth:`BlockOffload.resident`
opens them all. A block closed after such a use is written again when its tensors changed
(modules swapped, weights frozen to int8, a tensor changed in place), so quantized blocks are
offloaded as well. A backward through the whole model (the probe's attribution) runs under
:meth:`BlockOffload.checkpointed`: each block's forward checkpointed, its weights loaded again
for the recompute, so the graph does not keep every block's weights alive.
:func:`offload_of` gives a model's offloader (None: all in memory).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn

log = logging.getLogger(__name__)

ATTRIBUTE = "_opsnn_offload"
PREFIX = "opsnn-quant-offload-"
# The lock file of an offload directory, and what it says once locked: a directory whose file
# does not say this exactly is not ours (a look-alike, or one still being made) and is left alone.
LOCK_FILE = ".opsnn-quant-offload.lock"
LOCK_TEXT = "opsnn-quant offload directory: block weights of a running model\n"
# set while a checkpointed block recomputes its forward in the backward (see
# BlockOffload.checkpointed): forward hooks there see each of its calls a second time
_RECOMPUTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "opsnn_quant_recomputing", default=False
)


def in_recompute() -> bool:
    """Whether a checkpointed block is recomputing its forward (:meth:`BlockOffload.checkpointed`):
    a forward hook that records calls (the probe's taps) must not count this one again."""
    return _RECOMPUTING.get()


def offload_of(model: nn.Module) -> BlockOffload | None:
    """The offloader attached to ``model`` (None: the model is all in memory)."""
    found = model.__dict__.get(ATTRIBUTE)
    return found if isinstance(found, BlockOffload) else None


def make_offload_dir(directory: Path | None = None) -> tuple[Path, IO[str]]:
    """A new ``opsnn-quant-offload-*`` directory in ``directory`` (None: the system's temporary
    folder) and its lock file, open and locked: held as long as the file stays open. The
    orphans of killed runs in the same folder are removed first (:func:`sweep_orphans`)."""
    root = Path(directory) if directory is not None else Path(tempfile.gettempdir())
    sweep_orphans(root)
    made = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
    try:
        lock = open(made / LOCK_FILE, "x", encoding="utf-8")  # noqa: SIM115 (held by the caller)
        _flock(lock.fileno(), blocking=True)  # locked before it says it is ours
        lock.write(LOCK_TEXT)
        lock.flush()
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise
    return made, lock


def sweep_orphans(root: Path) -> list[Path]:
    """Remove the offload directories in ``root`` whose owner is gone: ours (the lock file says
    :data:`LOCK_TEXT`), owned by this user, not a link, and with no process holding the lock.
    A look-alike without our lock file, or one whose lock is held, is left alone. Returns what
    was removed."""
    removed: list[Path] = []
    try:
        entries = sorted(p for p in root.iterdir() if p.name.startswith(PREFIX))
    except OSError:
        return removed
    for entry in entries:
        if _orphan_removed(entry):
            removed.append(entry)
    for entry in removed:
        log.info("removed %s (the offload files of a run that was killed)", entry)
    return removed


def _orphan_removed(entry: Path) -> bool:
    try:
        st = entry.lstat()
        mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
        if entry.is_symlink() or not entry.is_dir() or not mine:
            return False
        fd = os.open(entry / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # no lock file (a look-alike), a FIFO's open refused, another user's
        return False
    try:
        if not _flock(fd, blocking=False):
            return False  # its run is alive
        with os.fdopen(os.dup(fd), encoding="utf-8") as f:
            if f.read(len(LOCK_TEXT) + 1) != LOCK_TEXT:
                return False  # not ours, or its maker has not said so yet
        shutil.rmtree(entry, ignore_errors=True)  # while locked: no one else takes it meanwhile
        return not entry.exists()
    except OSError:
        return False
    finally:
        os.close(fd)


def _flock(fd: int, *, blocking: bool) -> bool:
    """An exclusive flock on ``fd``; False when another holds it (``blocking`` False)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): never remove another run's directory
        return blocking
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _remove(directory: Path, lock: IO[str]) -> None:
    # the files first, then the lock: a sweep never sees the directory unlocked and half gone
    shutil.rmtree(directory, ignore_errors=True)
    lock.close()


def find_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """The model's blocks, in model order: the elements of each outermost ``nn.ModuleList``
    whose elements hold parameters below them (containers, not bare layers such as the
    ``[Linear, Dropout]`` of an attention's output)."""
    blocks: dict[str, nn.Module] = {}
    taken: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList):
            continue
        if any(name == t or name.startswith(t + ".") for t in taken):
            continue
        elements = [
            (f"{name}.{i}" if name else str(i), m)
            for i, m in enumerate(module)
            if any(True for _ in m.children()) and any(True for _ in m.parameters())
        ]
        if elements:
            taken.append(name)
            blocks.update(elements)
    return blocks


def _tensors(module: nn.Module) -> dict[str, tuple[torch.Tensor, bool]]:
    """Every parameter and buffer below ``module``: name -> (tensor, is a parameter)."""
    out: dict[str, tuple[torch.Tensor, bool]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out[name] = (p, True)
    for name, b in module.named_buffers(remove_duplicate=False):
        out[name] = (b, False)
    return out


def _nbytes(module: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t, _ in _tensors(module).values():
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _set(module: nn.Module, name: str, value: torch.Tensor, param: bool, grad: bool) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if param:  # one Parameter for tied names (an alias's value is passed as the Parameter)
        made = value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=grad)
        owner._parameters[leaf] = made
    else:
        owner._buffers[leaf] = value


Fill = Callable[[str, torch.Tensor], "torch.Tensor | None"]


def _filled(fill: Fill, name: str, like: torch.Tensor) -> torch.Tensor:
    value = fill(name, like)
    if value is None:
        raise RuntimeError(f"offload: no stored value for {name} (built on the meta device)")
    return value.detach().contiguous()


@dataclass
class _Block:
    module: nn.Module
    file: Path
    device: torch.device
    # name -> (is a parameter, alias of: the first name holding the same tensor); each
    # tensor's requires_grad is carried by the tensor the module holds (loaded or meta)
    entries: dict[str, tuple[bool, str]] = field(default_factory=dict)
    loaded: bool = True
    depth: int = 0  # forwards in flight
    opened: bool = False  # open outside a forward (window or resident)
    versions: dict[str, tuple[int, int]] = field(default_factory=dict)


class BlockOffload:
    """Offload a model's blocks beyond ``budget`` bytes to safetensors files in a temporary
    directory (removed by :meth:`close`, or when the offloader is collected).

    Args:
        model: the loaded model (all in memory).
        budget: bytes the model's weights may hold in memory: the blocks that do not fit beside
            the rest of the model and one block in flight are offloaded (in model order, the
            first ones stay).
        directory: where the temporary directory goes (None: the system's temporary folder);
            the directories killed runs left there are removed first.
        fill: a model built on the ``meta`` device (:mod:`opsnn_quant.models.streamed`): the
            value of each ``meta`` tensor (full dotted name, the meta tensor), read one at a
            time. The offloaded blocks' files are written from it, block by block, and the
            rest of the model is filled from it; None: the model is all in memory.
        device: where the blocks load (None: where their parameters are; ``fill``: cpu).

    Attributes:
        loads: blocks loaded from their files so far (forwards and opens).
        offloaded: the names of the offloaded blocks.
    """

    def __init__(
        self,
        model: nn.Module,
        budget: int,
        directory: Path | None = None,
        *,
        fill: Fill | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.model = model
        self.dir, lock = make_offload_dir(directory)
        self._finalizer = weakref.finalize(self, _remove, self.dir, lock)
        self.loads = 0
        self.blocks: dict[str, _Block] = {}
        self._window: str | None = None
        self._recomputed: _Block | None = None  # loaded for a checkpointed backward
        self._handles: list[Any] = []
        found = find_blocks(model)
        sizes = {n: _nbytes(m) for n, m in found.items()}
        resident = _nbytes(model) - sum(sizes.values())
        largest = max(sizes.values(), default=0)
        for i, (name, module) in enumerate(found.items()):
            if resident + sizes[name] + largest <= budget:
                resident += sizes[name]
                continue
            where = device or next(module.parameters()).device
            if where.type == "meta":
                where = torch.device("cpu")
            block = _Block(module, self.dir / f"block{i}.safetensors", where)
            self.blocks[name] = block
            self._write(block, fill, name)
            self._free(block)
            self._handles.append(module.register_forward_pre_hook(self._enter(name), prepend=True))
            self._handles.append(module.register_forward_hook(self._exit(name), always_call=True))
        model.__dict__[ATTRIBUTE] = self
        if fill is not None:
            self._fill_rest(fill)

    def _fill_rest(self, fill: Fill) -> None:
        """Every ``meta`` tensor outside the offloaded blocks, from ``fill`` (tied names: one
        read, one tensor)."""
        made: dict[int, torch.Tensor] = {}
        for name, (t, param) in _tensors(self.model).items():
            if t.device.type != "meta" or self.owner(name) is not None:
                continue
            if id(t) not in made:
                value = _filled(fill, name, t)
                made[id(t)] = nn.Parameter(value, bool(t.requires_grad)) if param else value
            _set(self.model, name, made[id(t)], param, bool(t.requires_grad))

    def place(self, move: Callable[[], None], device: torch.device) -> None:
        """Run ``move`` (an adapter's ``place``: ``.to(device)`` of the model) with the
        offloaded blocks taken out of the model (their ``meta`` tensors cannot move); they load
        on ``device`` from then on."""
        taken: list[tuple[nn.Module, str, nn.Module]] = []
        for name, block in self.blocks.items():
            parent_name, _, leaf = name.rpartition(".")
            parent = self.model.get_submodule(parent_name) if parent_name else self.model
            taken.append((parent, leaf, block.module))
            parent._modules[leaf] = nn.Module()
        try:
            move()
        finally:
            for parent, leaf, module in taken:
                parent._modules[leaf] = module
        for block in self.blocks.values():
            block.device = device

    @property
    def offloaded(self) -> list[str]:
        """The offloaded blocks' names, in model order."""
        return list(self.blocks)

    # ---- one block -----------------------------------------------------------------------

    def _write(self, block: _Block, fill: Fill | None = None, prefix: str = "") -> None:
        from safetensors.torch import save_file

        data: dict[str, torch.Tensor] = {}
        first: dict[int, str] = {}
        block.entries = {}
        for name, (t, param) in _tensors(block.module).items():
            alias = first.setdefault(id(t), name)
            block.entries[name] = (param, alias)
            if alias == name:
                if t.device.type == "meta" and fill is not None:
                    data[name] = _filled(fill, f"{prefix}.{name}", t)
                else:
                    data[name] = t.detach().contiguous()
        save_file(data, str(block.file))
        data.clear()

    def _free(self, block: _Block) -> None:
        metas: dict[str, torch.Tensor] = {}
        tensors = _tensors(block.module)
        for name, (param, alias) in block.entries.items():
            if alias not in metas:
                metas[alias] = torch.empty_like(tensors[alias][0], device="meta")
            # requires_grad as the tensor has it now (a caller may have turned it off)
            _set(block.module, name, metas[alias], param, tensors[alias][0].requires_grad)
        block.loaded = False
        block.versions = {}

    def _load(self, block: _Block) -> None:
        from safetensors import safe_open

        with safe_open(str(block.file), framework="pt", device=str(block.device)) as f:
            values = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open)
        made: dict[str, torch.Tensor] = {}
        now = _tensors(block.module)  # the meta stand-ins: their requires_grad is the one kept
        for name, (param, alias) in block.entries.items():
            grad = now[alias][0].requires_grad
            if alias not in made:
                made[alias] = nn.Parameter(values[alias], grad) if param else values[alias]
            _set(block.module, name, made[alias], param, grad)
        block.loaded = True
        block.versions = self._versions(block)
        self.loads += 1

    @staticmethod
    def _versions(block: _Block) -> dict[str, tuple[int, int]]:
        return {n: (id(t), t._version) for n, (t, _) in _tensors(block.module).items()}

    def _close(self, block: _Block) -> None:
        """Free an opened block, written again first when its tensors changed."""
        block.opened = False
        if block.depth or not block.loaded:
            return
        if self._versions(block) != block.versions:
            self._write(block)
        self._free(block)

    def _open(self, block: _Block) -> None:
        if not block.loaded:
            self._load(block)
        block.opened = True

    def _enter(self, name: str) -> Any:
        def hook(_module: nn.Module, _args: Any) -> None:
            block = self.blocks[name]
            if not block.loaded:
                self._load(block)
            block.depth += 1

        return hook

    def _exit(self, name: str) -> Any:
        def hook(_module: nn.Module, _args: Any, _output: Any) -> None:
            block = self.blocks[name]
            block.depth -= 1
            if block.depth == 0 and not block.opened:
                if self._versions(block) != block.versions:
                    self._write(block)  # a tensor changed in the forward: kept
                self._free(block)

        return hook

    # ---- outside a forward ---------------------------------------------------------------

    def owner(self, module_name: str) -> str | None:
        """The offloaded block holding module ``module_name`` (None: it stays in memory)."""
        for name in self.blocks:
            if module_name == name or module_name.startswith(name + "."):
                return name
        return None

    def touch(self, module_name: str) -> None:
        """Inside :meth:`window`: open the block holding ``module_name`` (closing the block
        opened before), so that its weights can be read or changed outside a forward."""
        name = self.owner(module_name)
        if name == self._window:
            return
        if self._window is not None:
            self._close(self.blocks[self._window])
        self._window = name
        if name is not None:
            self._open(self.blocks[name])

    @contextlib.contextmanager
    def window(self) -> Iterator[BlockOffload]:
        """One block open at a time (:meth:`touch`); the last one closed at the end."""
        try:
            yield self
        finally:
            if self._window is not None:
                self._close(self.blocks[self._window])
            self._window = None

    def stored(self, name: str) -> torch.Tensor:
        """Tensor ``name`` (a full dotted name of a parameter or buffer in an offloaded block)
        without loading its block: read alone from the block's file, or the live tensor while
        the block is loaded. A writer's lazy tensors call this when they write."""
        from safetensors import safe_open

        owner = self.owner(name)
        if owner is None:
            raise KeyError(f"{name} is not in an offloaded block")
        block, rel = self.blocks[owner], name[len(owner) + 1 :]
        if block.loaded:
            return _tensors(block.module)[rel][0].detach()
        alias = block.entries[rel][1]
        with safe_open(str(block.file), framework="pt", device="cpu") as f:
            return f.get_tensor(alias)

    def deferred(self, t: torch.Tensor) -> Callable[[], torch.Tensor] | None:
        """For ``t``, a view of a tensor of a loaded offloaded block (an int8 weight
        reshaped, a float parameter): a function that reads the same values again from the
        block's file (:meth:`stored`) when called, so that a writer need not hold ``t`` (and
        with it the block's storage) until it writes; None for any other tensor."""
        if t.device.type == "meta" or t.numel() == 0:
            return None
        ptr = t.untyped_storage().data_ptr()
        for owner, block in self.blocks.items():
            if not block.loaded:
                continue
            for rel, (value, _) in _tensors(block.module).items():
                if value.device.type == "meta" or value.untyped_storage().data_ptr() != ptr:
                    continue
                if value.dtype != t.dtype or not value.is_contiguous():
                    return None
                offset = int(t.storage_offset()) - int(value.storage_offset())
                return functools.partial(
                    self._view, f"{owner}.{rel}", tuple(t.shape), tuple(t.stride()), offset
                )
        return None

    def _view(
        self, name: str, shape: tuple[int, ...], stride: tuple[int, ...], offset: int
    ) -> torch.Tensor:
        base = self.stored(name)
        return base.as_strided(shape, stride, base.storage_offset() + offset).contiguous()

    @contextlib.contextmanager
    def opened(self, module_name: str) -> Iterator[None]:
        """The block holding ``module_name`` open meanwhile (a lazy tensor computed from a
        module's weights when written); nothing for a module in memory."""
        name = self.owner(module_name)
        block = self.blocks[name] if name is not None else None
        if block is None or block.loaded:
            yield
            return
        self._open(block)
        try:
            yield
        finally:
            self._close(block)

    @contextlib.contextmanager
    def resident(self) -> Iterator[None]:
        """Every block open (an export tracing or writing the whole model); closed after."""
        for block in self.blocks.values():
            self._open(block)
        try:
            yield
        finally:
            for block in self.blocks.values():
                self._close(block)

    @contextlib.contextmanager
    def checkpointed(self) -> Iterator[None]:
        """Meanwhile, each offloaded block's forward runs under activation checkpointing
        (``torch.utils.checkpoint``, non-reentrant), its tensors loaded again from its file
        for the recompute: a forward with gradients through the whole model (the probe's
        attribution) keeps each block's inputs, not the tensors autograd would save inside
        it (its weights among them), so its backward holds one block's weights at a time.
        The recompute repeats the same operations on the same bytes: the same gradients, bit
        for bit, as a backward that kept everything.

        A block loaded for its recompute stays loaded while the backward goes through it
        (gradient hooks there may read its modules' weights: the structured estimator's
        candidates), until the next block's recompute loads or the context ends: at most two
        blocks at a time."""
        for name, block in self.blocks.items():
            block.module.forward = self._checkpointing(name, block.module.forward)
        try:
            yield
        finally:
            for block in self.blocks.values():
                block.module.__dict__.pop("forward", None)  # the class's forward again
            self._free_recomputed()

    def _free_recomputed(self) -> None:
        block, self._recomputed = self._recomputed, None
        if block is not None and block.loaded and block.depth == 0 and not block.opened:
            self._free(block)

    def _checkpointing(self, name: str, forward: Callable[..., Any]) -> Callable[..., Any]:
        from torch.utils.checkpoint import checkpoint

        first: list[int] = [0]  # the block's first forwards in flight (the rest: recomputes)

        def run(*args: Any, **kwargs: Any) -> Any:
            # the first forward: the pre-hook loaded the block; the recompute in the
            # backward: loaded here, kept through the block's backward, freed when the next
            # block's recompute loads (nothing changes in a backward: no write)
            block = self.blocks[name]
            recompute = first[0] == 0
            if not block.loaded:
                if self._recomputed is not block:
                    self._free_recomputed()
                self._load(block)
                self._recomputed = block
            block.depth += 1
            token = _RECOMPUTING.set(True) if recompute else None
            try:
                return forward(*args, **kwargs)
            finally:
                block.depth -= 1
                if token is not None:
                    _RECOMPUTING.reset(token)

        def checkpointed(*args: Any, **kwargs: Any) -> Any:
            first[0] += 1
            try:
                return checkpoint(run, *args, use_reentrant=False, **kwargs)
            finally:
                first[0] -= 1

        return checkpointed

    def close(self) -> None:
        """Load every block back (the model is all in memory again), remove the hooks and the
        temporary directory."""
        for block in self.blocks.values():
            if not block.loaded:
                self._load(block)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.blocks.clear()
        self.model.__dict__.pop(ATTRIBUTE, None)
        self._finalizer()

    def release(self) -> None:
        """Remove the temporary directory (the model is not used any more)."""
        self._finalizer()


@contextlib.contextmanager
def window(model: nn.Module) -> Iterator[BlockOffload | None]:
    """:meth:`BlockOffload.window` of ``model``'s offloader (None: all in memory)."""
    off = offload_of(model)
    if off is None:
        yield None
        return
    with off.window():
        yield off


def resident(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """:meth:`BlockOffload.resident` of ``model``'s offloader (nothing when all in memory)."""
    off = offload_of(model)
    return off.resident() if off is not None else contextlib.nullcontext()


def checkpointed(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """:meth:`BlockOffload.checkpointed` of ``model``'s offloader (nothing when all in
    memory: autograd keeps what it saves, as usual)."""
    off = offload_of(model)
    return off.checkpointed() if off is not None else contextlib.nullcontext()


def touch(off: BlockOffload | None, module_name: str) -> None:
    """``off.touch(module_name)`` where there is an offloader."""
    if off is not None:
        off.touch(module_name)
