"""Hugging Face libraries, offline and quiet: no network at run time, no progress bars of theirs.

A neutral place (models, the zoo and evaluation all load Hugging Face objects).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def set_offline_env() -> None:
    """Forbid every Hugging Face library from touching the network in this process."""
    for var in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "DIFFUSERS_OFFLINE",
    ):
        os.environ[var] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def quiet_progress_bars() -> None:
    """Turn off the loading bars of the Hugging Face libraries already imported.

    Their environment switches are read once, at import; this also covers a process that
    imported them before (a test session, a notebook).
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        import transformers

        transformers.utils.logging.disable_progress_bar()
    if "diffusers" in sys.modules:
        import diffusers

        diffusers.utils.logging.disable_progress_bar()


def transformers_dtype(dtype: object) -> dict[str, Any]:
    """The ``from_pretrained`` keyword for a dtype: ``dtype`` in transformers 5, ``torch_dtype``
    before (given explicitly: transformers 5 otherwise keeps a checkpoint's stored dtype)."""
    import transformers

    major = int(transformers.__version__.split(".")[0])
    return {"dtype" if major >= 5 else "torch_dtype": dtype}


# ---- untrusted checkpoints -----------------------------------------------------------------------

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
"""Weight files that are Python pickles: loading one runs the unpickler on the user's bytes."""


def pickle_only_files(directory: Path) -> list[Path]:
    """The pickle weight files of ``directory`` when it holds no ``*.safetensors`` (else none).

    Only the directory's own files count (a component's, as ``save_pretrained`` lays them out).
    """
    if not directory.is_dir():
        return []
    files = sorted(p for p in directory.iterdir() if p.is_file())
    if any(p.suffix == ".safetensors" for p in files):
        return []
    return [p for p in files if p.suffix in PICKLE_SUFFIXES]


def check_pickle_weights(
    source: str, root: Path, directories: Sequence[Path], *, allow_pickle: bool, convert: str
) -> bool:
    """Refuse a model some of whose ``directories`` hold pickle weights only, unless allowed.

    Called before any weight loads: the answer comes from the file names alone.

    Args:
        source: the model as the user named it (for the message).
        root: the model directory (the files are named relative to it).
        directories: the model's weight directories (a pipeline's components, or the model's).
        allow_pickle: read pickle-only weights anyway (with :func:`weights_only_torch_load`).
        convert: a command line that converts the model to safetensors (for the message).

    Returns:
        True when pickle weights will be read (``allow_pickle`` and some directory holds
        nothing else): load with ``use_safetensors=None`` inside :func:`weights_only_torch_load`;
        False: load with ``use_safetensors=True``.

    Raises:
        ModelLoadError: pickle-only weights and ``allow_pickle`` is False.
    """
    from opsnn_quant.errors import ModelLoadError

    pickled = [f for d in directories for f in pickle_only_files(d)]
    names = ", ".join(str(_relative(f, root)) for f in pickled)
    if not pickled or allow_pickle:
        if pickled:
            log.warning(
                "%s: reading pickle weights (%s) with torch.load(weights_only=True), as allowed",
                source,
                names,
            )
        return bool(pickled)
    raise ModelLoadError(
        f"{source} has pickle weights only ({names}), no safetensors: convert it once, e.g. "
        f"{convert}, or pass --allow-pickle (recipe: model.allow_pickle: true) to read them "
        "with torch.load(weights_only=True)"
    )


def _relative(path: Path, root: Path) -> Path:
    try:
        return path.relative_to(root)
    except ValueError:
        return path


@contextlib.contextmanager
def weights_only_torch_load() -> Iterator[None]:
    """Every ``torch.load`` inside reads tensors only (``weights_only=True``), whatever its caller
    asked: a pickle weight file never runs code of its own (the libraries ask for it already;
    this holds for every version of them).

    The libraries' messages about falling back to the pickles ("Defaulting to unsafe
    serialization") are silenced meanwhile: they would say otherwise, and
    :func:`check_pickle_weights` has said which files are read.
    """
    import torch

    original = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    loggers = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    levels = [lg.level for lg in loggers]
    torch.load = load
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        torch.load = original
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
