"""Hugging Face libraries, offline and quiet: no network at run time, no progress bars of theirs.

A neutral place (models, the zoo and evaluation all load Hugging Face objects).
"""

from __future__ import annotations

import os
import sys
from typing import Any


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
