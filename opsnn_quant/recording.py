"""Recording root-module calls for offline replay: a seeded reservoir of detached copies,
splitting a recorded call into smaller batches where that is safe, and the float outputs of the
recorded calls of every modality root (what the probe, the AMCT hand-off and evaluation share)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from opsnn_quant.core.stream import CallCounter, priority
from opsnn_quant.core.tensors import first_tensor
from opsnn_quant.core.timesteps import at_step, current_step
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.types import ForwardLoop, Modality

Call = tuple[tuple, dict]  # one recorded call of a module: (args, kwargs)


@dataclass
class RootRecorder:
    """Seeded reservoir of a root module's calls (deep copies of args/kwargs).

    A bottom-k sample (:mod:`opsnn_quant.core.stream`): the call at position ``(batch, ordinal)``
    draws its priority from ``(seed, batch, ordinal)`` and the ``max_calls`` calls of smallest
    priority are kept, in the order they came; so the calls kept depend on the data only, and
    the reservoirs of several shares of the data merge (:meth:`merge`) into one pass's.

    ``accept`` (e.g. :meth:`ModelAdapter.recordable`) filters the calls offered; ``refused``
    counts those it turned down.
    """

    name: str
    max_calls: int
    seed: int = 0
    accept: Callable[[tuple, dict], bool] | None = None
    calls: list[tuple[tuple, dict]] = field(default_factory=list)
    steps: list[int | None] = field(default_factory=list)  # the denoising step of each call
    priority: list[float] = field(default_factory=list)  # of each kept call
    seen: int = 0
    refused: int = 0
    failed: str | None = None
    # With keep_outputs, outputs[i] is call i's first floating output (fp32 copy), taken by
    # forward_hook as the call returns: what replaying it would give, without the replay.
    keep_outputs: bool = False
    outputs: list[torch.Tensor | None] = field(default_factory=list)
    counter: CallCounter = field(default_factory=CallCounter)

    def __post_init__(self) -> None:
        self._slot: int | None = None  # where the call now running was kept (None: not kept)

    def forward_pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Offer each call of the root module (register with ``with_kwargs=True``)."""
        self.offer(args, kwargs)

    def forward_hook(self, module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        """Keep the output of a call :meth:`offer` kept (register with ``with_kwargs=True``)."""
        slot, self._slot = self._slot, None
        if slot is None or not self.keep_outputs:
            return
        y = first_tensor(out)
        self.outputs[slot] = None if y is None else y.detach().float().clone()

    def offer(self, args: tuple, kwargs: dict) -> None:
        """Consider one call for the reservoir."""
        self._slot = None
        if self.accept is not None and not self.accept(args, kwargs):
            self.refused += 1
            return
        self.seen += 1
        drawn = priority(self.seed, self.counter.next())
        if self.failed is not None:
            return
        full = len(self.calls) >= self.max_calls
        if full and (not self.priority or drawn >= max(self.priority)):
            return  # ties: the earlier call stays
        try:
            snap = detached_copy((args, kwargs))
        except Exception as exc:  # an argument that cannot be copied (e.g. a live stream)
            self._fail(f"call arguments of '{self.name}' cannot be copied: {exc}")
            return
        if full:
            self._drop(self._largest())
        self.calls.append(snap)
        self.steps.append(current_step())
        self.priority.append(drawn)
        self.outputs.append(None)
        self._slot = len(self.calls) - 1

    def merge(self, other: RootRecorder) -> None:
        """Add the reservoir ``other`` kept of the data that follows this one's."""
        self.seen += other.seen
        self.refused += other.refused
        if self.failed is not None:
            return
        if other.failed is not None:
            self._fail(other.failed)
            return
        for i in range(len(other.calls)):
            if len(self.calls) >= self.max_calls:
                if not self.priority or other.priority[i] >= max(self.priority):
                    continue
                self._drop(self._largest())
            self.calls.append(other.calls[i])
            self.steps.append(other.steps[i])
            self.priority.append(other.priority[i])
            self.outputs.append(other.outputs[i])

    def portable(self) -> RootRecorder:
        """This reservoir without its filter (a bound method of the adapter), to send to
        another process."""
        return dataclasses.replace(self, accept=None)

    def _largest(self) -> int:
        """The kept call of largest priority (of those, the latest)."""
        top = max(self.priority)
        return max(i for i, p in enumerate(self.priority) if p == top)

    def _drop(self, i: int) -> None:
        for kept in (self.calls, self.steps, self.priority, self.outputs):
            del kept[i]

    def _fail(self, why: str) -> None:
        self.failed = why
        for kept in (self.calls, self.steps, self.priority, self.outputs):
            kept.clear()


def detached_copy(obj: Any) -> Any:
    """A copy of a call's arguments with every tensor detached and cloned (containers kept)."""

    def detach(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return o.detach().clone()
        if isinstance(o, dict):
            items = {k: detach(v) for k, v in o.items()}
            try:  # keep the mapping's own type (transformers' ModelOutput is indexable by position)
                return type(o)(**items)
            except TypeError:
                return items
        if isinstance(o, tuple) and not hasattr(o, "_fields"):
            return tuple(detach(v) for v in o)
        if isinstance(o, list):
            return [detach(v) for v in o]
        return copy.deepcopy(o)

    return detach(obj)


def split_batch(call: Call, max_batch: int | None) -> list[Call]:
    """``call`` split into chunks of at most ``max_batch`` samples, or ``[call]`` when it cannot
    be split safely (or ``max_batch`` is None).

    Splittable: every tensor in the arguments (also inside tuples, lists and dicts, e.g. a
    ``(encoder_hidden_states,)`` tuple) has the same leading (batch) size B > max_batch, or is
    0-d; everything else is a plain scalar, string or None. Anything else (a KV cache object)
    keeps the call whole: slicing it would need model knowledge.
    """
    if max_batch is None:
        return [call]
    batch = batch_size(call)
    if batch is None or batch <= max_batch:
        return [call]
    return [
        _map_tensors(call, partial(_rows, i, i + max_batch)) for i in range(0, batch, max_batch)
    ]


def sample_subset(call: Call, keep: int | None) -> Call:
    """``call`` on ``keep`` samples evenly spread over its batch (indices ``i * B // keep``: a
    guidance pair's unconditional and conditional halves both), or whole when it cannot be
    split (see :func:`split_batch`), has no more samples, or ``keep`` is None."""
    batch = batch_size(call)
    if keep is None or batch is None or batch <= keep:
        return call
    index = torch.tensor([i * batch // keep for i in range(keep)])
    return _map_tensors(call, partial(_pick, index))


def batch_size(call: Call) -> int | None:
    """The one leading size of every batched tensor in ``call``, or None when the call cannot be
    sliced by samples safely (see :func:`split_batch`)."""
    leaves: list[Any] = []

    def collect(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, tuple | list) and not hasattr(v, "_fields"):
            for x in v:
                collect(x)
        else:
            leaves.append(v)

    collect(call)
    sizes = {v.shape[0] for v in leaves if isinstance(v, torch.Tensor) and v.dim() > 0}
    plain = all(
        isinstance(v, torch.Tensor) or v is None or isinstance(v, bool | int | float | str)
        for v in leaves
    )
    return next(iter(sizes)) if plain and len(sizes) == 1 else None


def _rows(start: int, end: int, t: torch.Tensor) -> torch.Tensor:
    return t[start:end]


def _pick(index: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return t.index_select(0, index.to(t.device))


def _map_tensors(v: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``v`` with ``fn`` applied to every batched (non 0-d) tensor, containers kept."""
    if isinstance(v, torch.Tensor):
        return fn(v) if v.dim() > 0 else v
    if isinstance(v, dict):
        items = {k: _map_tensors(x, fn) for k, x in v.items()}
        try:  # keep the mapping's own type (a ModelOutput is also indexed by position)
            return type(v)(**items)
        except TypeError:
            return items
    if isinstance(v, tuple | list) and not hasattr(v, "_fields"):
        return type(v)(_map_tensors(x, fn) for x in v)
    return v


def replay(
    root: nn.Module,
    call: tuple[tuple, dict],
    step: int | None = None,
    max_batch: int | None = None,
) -> torch.Tensor:
    """Run ``root`` on a fresh copy of a recorded call, at the denoising ``step`` it was
    recorded at; its first floating output. With ``max_batch``, a call that splits
    (:func:`split_batch`) runs in chunks of that many samples, their outputs concatenated:
    a 1500-frame Whisper encoder call of four utterances peaks at a quarter of the memory."""
    chunks = split_batch(call, max_batch)
    outs = []
    for chunk in chunks:
        args, kwargs = detached_copy(chunk)  # a fresh copy: replays may mutate caches
        with at_step(step):
            y = first_tensor(root(*args, **kwargs))
        if y is None:
            raise RuntimeError("the root module returned no floating tensor")
        outs.append(y)
    return outs[0] if len(outs) == 1 else torch.cat(outs)


@dataclass
class RecordedRoots:
    """Recorded calls of each root module and their float outputs.

    Attributes:
        calls: root name -> recorded calls.
        outputs: root name -> the float output of each recorded call.
        modalities: root name -> its modality.
        steps: root name -> the denoising step of each call (None outside a sampling loop).
        batch: root name -> samples per chunk its calls are replayed in (:func:`replay`'s
            ``max_batch``; a root left out: whole calls).
    """

    calls: dict[str, list[tuple[tuple, dict]]]
    outputs: dict[str, list[torch.Tensor]]
    modalities: dict[str, Modality] = field(default_factory=dict)
    steps: dict[str, list[int | None]] = field(default_factory=dict)
    batch: dict[str, int] = field(default_factory=dict)  # root -> samples per replayed chunk

    def steps_of(self, root: str) -> list[int | None]:
        """The denoising step of each recorded call of ``root`` (None outside a sampling loop)."""
        return self.steps.get(root) or [None] * len(self.calls.get(root, []))

    def roots_of(self, modality: Modality) -> list[str]:
        """The recorded roots of ``modality``."""
        return [r for r, m in self.modalities.items() if m == modality and r in self.calls]


@torch.no_grad()
def record_roots(
    adapter: ModelAdapter,
    loop: ForwardLoop,
    max_calls: int = 8,
    seed: int = 1,
    batch: Callable[[str], int | None] | None = None,
) -> RecordedRoots:
    """Run ``loop`` on the float model, recording up to ``max_calls`` calls per root
    (``batch``: modality name -> samples per chunk they are replayed in, None: whole)."""
    named = dict(adapter.model.named_modules())
    roots = {r: m for r, m in adapter.roots().items() if r in named}
    recorders = {
        r: RootRecorder(r, max_calls, seed, adapter.record_filter(r), keep_outputs=True)
        for r in roots
    }
    handles = []
    for r, rec in recorders.items():
        handles.append(named[r].register_forward_pre_hook(rec.forward_pre_hook, with_kwargs=True))
        handles.append(named[r].register_forward_hook(rec.forward_hook, with_kwargs=True))
    try:
        loop(adapter.model)
    finally:
        for h in handles:
            h.remove()
    calls = {r: rec.calls for r, rec in recorders.items() if rec.calls}
    steps = {r: recorders[r].steps for r in calls}
    chunks = {r: batch(roots[r].value) if batch is not None else None for r in calls}
    outputs = {r: _outputs_of(named[r], recorders[r], chunks[r]) for r in calls}
    return RecordedRoots(calls, outputs, roots, steps, _known(chunks))


def _known(chunks: dict[str, int | None]) -> dict[str, int]:
    return {r: n for r, n in chunks.items() if n is not None}


def _outputs_of(root: nn.Module, rec: RootRecorder, max_batch: int | None) -> list[torch.Tensor]:
    """The float output of each kept call: as it returned in the loop (a call whose output was
    not seen, e.g. it raised inside the loop's own handling, is replayed)."""
    return [
        y if y is not None else replay(root, call, step, max_batch).float()
        for call, step, y in zip(rec.calls, rec.steps, rec.outputs, strict=True)
    ]
