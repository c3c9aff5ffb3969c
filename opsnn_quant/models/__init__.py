"""Model adapters: load a family, name its modalities, run it (see :class:`ModelAdapter`).

Every family is an entry of the family table (:mod:`opsnn_quant.models.family`); the built-in
ones (:mod:`opsnn_quant.models.families`) are registered on import.
"""

from __future__ import annotations

import re
from typing import Any

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.models import families as _builtin  # noqa: F401  (registers the built-ins)
from opsnn_quant.models.base import ModelAdapter, modality_of
from opsnn_quant.models.checks import check_model_files
from opsnn_quant.models.family import (
    Family,
    FamilySettings,
    detect_family,
    family_names,
    get_family,
    layout_family,
    register_family,
    unregister_family,
)
from opsnn_quant.models.settings import check_source_fits, settings_for
from opsnn_quant.sources import Source, resolve_source


def load_adapter(
    family: str | None,
    source: str | Source,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    allow_pickle: bool = False,
    max_memory: int | None = None,
    **settings: Any,
) -> ModelAdapter:
    """Load ``source`` (``zoo:<name>`` or a directory) with the adapter of ``family``.

    Args:
        family: a registered family (:mod:`opsnn_quant.models.family`): ``diffusers-sd``
            (UNet pipelines), ``diffusers-dit`` (transformer-denoiser pipelines: SD3, FLUX,
            PixArt, Wan), ``whisper``, or one a team registered (``generic`` is Python-only:
            build a :class:`~opsnn_quant.models.generic.GenericAdapter`); None: guessed from
            the source (:func:`guess_family`).
        source: model location (a command's resolved :class:`~opsnn_quant.sources.Source`, or
            its text: resolved here, once).
        device: ``cpu``, ``npu``, ``npu:N``, ``cuda`` or ``cuda:N``: the model is placed there
            (every probe statistic, observer and quantized module then runs there).
        dtype: ``float32``, ``float16`` or ``bfloat16``: the model is loaded in it.
        allow_pickle: read weights that exist as pickles only (``*.bin``, ``*.pt``, ``*.pth``,
            ``*.ckpt``), with ``torch.load(weights_only=True)``; False (default): safetensors
            only, a model with pickle weights only is refused before anything loads.
        max_memory: bytes the model may hold in memory: the blocks beyond it are offloaded
            to disk (:class:`~opsnn_quant.models.offload.BlockOffload`); the models of a
            pipeline (denoisers, VAE, text encoders) and a Whisper model are built on the ``meta`` device and their tensors
            read one at a time from their files (:mod:`opsnn_quant.models.streamed`), so that
            the offloaded blocks are never all in memory; None: all in memory.
        **settings: the family's settings fields (steps, guidance_scale, batch_size, ...).

    Raises:
        ModelLoadError: unknown family, a model that cannot be loaded, or pickle-only weights
            without ``allow_pickle``.
        ConfigError: bad settings (a value beyond what the model's config files allow
            included), device or dtype names.
        DeviceUnavailableError: the device is not available here.
    """
    from opsnn_quant.backends.devices import resolve_device, resolve_dtype

    resolved = source if isinstance(source, Source) else resolve_source(source)
    entry = get_family(family or guess_family(resolved), ModelLoadError)
    checked = settings_for(entry.name, settings)
    check_model_files(resolved)  # before the configs' values are read as limits
    check_source_fits(resolved, checked, where="settings.")
    place = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    # --max-memory: the pipeline's models (Whisper: the model) built on the meta device, blocks
    # streamed from the files (opsnn_quant.models.streamed) instead of loaded whole first
    skeletons: list[Any] | None = [] if max_memory is not None else None
    adapter = entry.adapter_class().load(  # a plug-in: it takes the source's text
        resolved.text, checked, torch_dtype, allow_pickle=allow_pickle, skeletons=skeletons
    )
    if max_memory is None:
        adapter.place(place)
        return adapter
    from opsnn_quant.models.offload import BlockOffload

    if not skeletons:
        adapter.place(place)
        BlockOffload(adapter.model, max_memory)
        return adapter
    from opsnn_quant.models.streamed import filler

    off = BlockOffload(adapter.model, max_memory, fill=filler(adapter.model, skeletons))
    off.place(lambda: adapter.place(place), place)
    return adapter


def check_weights(source: Source, *, allow_pickle: bool = False) -> None:
    """Refuse a model directory whose weights are pickles only (unless ``allow_pickle``) from
    its file names, or whose classes, configs or safetensors headers are wrong
    (:func:`~opsnn_quant.models.checks.check_model_files`), before a command reads data or
    prepares an output; the loaders check the same again. Zoo models (safetensors) and paths
    that are no model directory pass: loading says what is wrong with those.

    Raises:
        ModelLoadError: pickle-only weights and ``allow_pickle`` is False; a file the loaders
            read (or an export copies) that is no regular file inside the directory, a weight
            file linked out of it included
            (:func:`~opsnn_quant.models.loader_files.check_model_sources`).
    """
    try:
        _check_weights(source, allow_pickle)
    except OSError as exc:  # a directory we may not walk (--model /proc): one line, not a trace
        where = exc.filename or source.text
        raise ModelLoadError(
            f"cannot read the model directory {source}: {where}: {exc.strerror or exc}"
        ) from exc


def _check_weights(source: Source, allow_pickle: bool) -> None:
    from opsnn_quant.models.loader_files import check_model_sources

    check_model_sources(source)
    check_model_files(source)
    if allow_pickle or source.named or not source.path.is_dir():
        return  # allowed: the loader says which pickles it reads
    family = layout_family(source.path)  # a pipeline's index, a transformers config.json, ...
    if family is not None and family.check_weights is not None:
        family.check_weights(source.text, source.path, allow_pickle)


# what a Hugging Face hub id looks like (owner/name), as opposed to a local path
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_model_source(source: Source) -> None:
    """Refuse a model source that is neither a named source (``zoo:NAME``) nor an existing path,
    saying how to fetch a hub id (nothing downloads at run time).

    Raises:
        ModelLoadError: no such model here.
    """
    if source.named or source.path.exists():
        return
    if _HUB_ID.match(source.text):
        raise ModelLoadError(
            f"model {source} does not exist here; it looks like a Hugging Face hub id, and "
            f"nothing downloads at run time: `huggingface-cli download {source} --local-dir "
            "DIR` on a machine with access, then pass DIR"
        )
    raise ModelLoadError(f"model {source} does not exist")


def guess_family(source: Source) -> str:
    """Family from a named source's provider (``zoo:NAME``) or a model directory's files (the
    first registered family whose ``detect`` says yes)."""
    from opsnn_quant.sources import named_family

    if source.named:
        family = named_family(source)
        if family:
            return family
        source = Source(str(source.path))  # a provider that does not say: its directory's files
    found = detect_family(source.path)
    if found is not None:
        return found.name
    check_model_source(source)
    raise ModelLoadError(f"cannot tell the model family of {source}; pass --family")


__all__ = [
    "Family",
    "FamilySettings",
    "ModelAdapter",
    "check_model_source",
    "check_weights",
    "family_names",
    "get_family",
    "guess_family",
    "load_adapter",
    "modality_of",
    "register_family",
    "unregister_family",
]
