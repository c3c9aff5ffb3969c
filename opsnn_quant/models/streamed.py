"""Streamed loading under ``--max-memory``: the large component is built on the ``meta`` device
and its tensors are read one at a time from its own safetensors files, so that the blocks
:class:`~opsnn_quant.models.offload.BlockOffload` offloads never sit in memory all at once.

A *skeleton* is the component built the way its library's ``from_pretrained`` builds it
(config, default dtype, ``eval()``, ``_name_or_path``; transformers models: tied weights, a
generation config), with every parameter on ``meta`` (accelerate's ``init_empty_weights``: buffers made in
``__init__`` stay real). :class:`StreamedSource` then gives each tensor from the files, cast to
the skeleton's dtype where it is floating (as ``from_pretrained`` casts), and
:class:`BlockOffload` (``fill=``) writes the offloaded blocks' files straight from it and fills
the rest of the model. A component whose files do not name exactly its tensors (renamed legacy
keys, keep-in-fp32 modules, pickles) gets no skeleton: it loads whole as before, and is offloaded
after.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """``from_pretrained``'s ``_set_default_torch_dtype``: modules made meanwhile take ``dtype``."""
    before = torch.get_default_dtype()
    if dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


class StreamedSource:
    """The tensors of one component's safetensors files, read one at a time.

    Attributes:
        module: the skeleton (parameters on ``meta``).
        files: tensor name (the module's ``state_dict`` name) -> the file holding it.
    """

    def __init__(self, module: nn.Module, files: dict[str, Path]) -> None:
        self.module = module
        self.files = files

    def get(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """Tensor ``name`` from its file, in ``like``'s dtype where both are floating."""
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as f:
            t = f.get_tensor(name)
        if t.is_floating_point() and like.is_floating_point() and t.dtype != like.dtype:
            t = t.to(like.dtype)
        return t


def _built(make: Callable[[], Any], dtype: torch.dtype, directory: Path) -> Any:
    """``make()`` on the meta device (parameters only) in ``dtype``; None where a model's
    ``__init__`` cannot run there (it then loads whole)."""
    import accelerate

    try:
        with _default_dtype(dtype), accelerate.init_empty_weights():
            return make()
    except Exception as exc:
        log.info("%s: not built on the meta device (%s); loaded whole", directory, exc)
        return None


def _file_map(files: list[Path]) -> dict[str, Path] | None:
    from opsnn_quant.core.safetensors_header import read_safetensors_header

    where: dict[str, Path] = {}
    for path in files:
        for name in read_safetensors_header(path).tensors:
            if name in where:
                return None
            where[name] = path
    return where


def _covered(module: nn.Module, files: dict[str, Path]) -> bool:
    """The files hold exactly the module's state (tied names: one of them), shapes equal."""
    from opsnn_quant.core.safetensors_header import read_safetensors_header

    state = module.state_dict(keep_vars=True)
    shapes: dict[str, tuple[int, ...]] = {}
    for path in set(files.values()):
        for name, entry in read_safetensors_header(path).tensors.items():
            shapes[name] = tuple(entry.shape)
    if set(shapes) - set(state):
        return False
    groups: dict[int, list[str]] = {}
    for name, t in state.items():
        groups.setdefault(id(t), []).append(name)
    for names in groups.values():
        present = [n for n in names if n in shapes]
        if not present:
            return False
        if any(shapes[n] != tuple(state[n].shape) for n in present):
            return False
    return True


def diffusers_skeleton(
    cls: Any, directory: Path, dtype: torch.dtype, name_or_path: str
) -> StreamedSource | None:
    """A diffusers model class's skeleton from ``directory`` (a pipeline component), as
    ``ModelMixin.from_pretrained`` builds it; None where it cannot stream (see the module)."""

    from opsnn_quant.models.checks import weight_files

    if getattr(cls, "_keep_in_fp32_modules", None):
        return None
    files = weight_files(directory)
    where = _file_map(files) if files else None
    if not where:
        return None
    config = cls.load_config(str(directory))
    model = _built(lambda: cls.from_config(config), dtype, directory)
    if model is None:
        return None
    if getattr(model, "_from_deprecated_attn_block", False) or not _covered(model, where):
        return None
    model.register_to_config(_name_or_path=name_or_path)
    return StreamedSource(model.eval(), where)


def transformers_skeleton(
    cls: Any, directory: Path, dtype: torch.dtype, name_or_path: str
) -> StreamedSource | None:
    """A transformers model class's skeleton from ``directory`` as transformers 5's
    ``from_pretrained`` builds it (config in ``dtype``, tied weights, every parameter trainable,
    ``eval()``; a generation config where the directory has one); None where it cannot stream."""
    import transformers

    from opsnn_quant.models.checks import weight_files

    if int(transformers.__version__.split(".")[0]) < 5:
        return None  # what from_pretrained does differs before 5: loaded whole
    if getattr(cls, "_keep_in_fp32_modules", None) and dtype != torch.float32:
        return None
    files = weight_files(directory)
    where = _file_map(files) if files else None
    if not where:
        return None
    config = cls.config_class.from_pretrained(str(directory), local_files_only=True)
    config.dtype = dtype
    model = _built(lambda: cls(config), dtype, directory)
    if model is None:
        return None
    model.tie_weights()
    for p in model.parameters():  # transformers 5's from_pretrained makes every one anew
        p.requires_grad_(True)
    has_generation = getattr(model, "generation_config", None) is not None
    if has_generation and (directory / "generation_config.json").is_file():
        model.generation_config = transformers.GenerationConfig.from_pretrained(
            str(directory), local_files_only=True
        )
    model.config.name_or_path = name_or_path
    if not _covered(model, where):
        return None
    return StreamedSource(model.eval(), where)


def whisper_skeleton(directory: Path, dtype: torch.dtype) -> StreamedSource | None:
    """``WhisperForConditionalGeneration``'s skeleton from ``directory`` as ``from_pretrained``
    builds it (config in ``dtype``, generation config, tied head); None where it cannot stream."""
    import transformers

    cls = transformers.WhisperForConditionalGeneration
    return transformers_skeleton(cls, directory, dtype, str(directory))


def filler(model: nn.Module, sources: list[StreamedSource]) -> Any:
    """``BlockOffload``'s ``fill``: a tensor of ``model`` (its full dotted name) from the source
    of the skeleton holding it; None for a tensor outside every skeleton."""
    prefixes: list[tuple[str, StreamedSource]] = []
    for name, module in model.named_modules():
        for s in sources:
            if module is s.module:
                prefixes.append((f"{name}." if name else "", s))
    aliases: dict[int, dict[str, str]] = {}
    for _prefix, s in prefixes:
        state = s.module.state_dict(keep_vars=True)
        by_id: dict[int, str] = {}
        for n in state:
            if n in s.files:
                by_id.setdefault(id(state[n]), n)
        aliases[id(s)] = {n: by_id.get(id(t), n) for n, t in state.items()}

    def fill(name: str, like: torch.Tensor) -> torch.Tensor | None:
        for prefix, s in prefixes:
            if name.startswith(prefix):
                key = aliases[id(s)].get(name[len(prefix) :])
                if key is not None and key in s.files:
                    return s.get(key, like)
        return None

    return fill
