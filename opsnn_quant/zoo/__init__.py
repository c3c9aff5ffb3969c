"""Offline demo zoo: small trained models and generated datasets, loaded without any network.

Loading contract (used by adapters, recipes and tests)::

    opsnn_quant.zoo.list()                    # names of the models
    opsnn_quant.zoo.load("shapes-t2i")        # diffusers StableDiffusionPipeline
    opsnn_quant.zoo.load("shapes-dit")        # diffusers StableDiffusion3Pipeline (no T5)
    opsnn_quant.zoo.load("shapes-t2v")        # diffusers WanPipeline (9 frames of 32x32)
    opsnn_quant.zoo.load("shapes-clip")       # transformers CLIPModel (+ zoo.shapes_clip.load_shapes_clip_processor)
    opsnn_quant.zoo.load("whisper-tiny.en")   # transformers WhisperForConditionalGeneration
    opsnn_quant.zoo.load("whisper-base")      # the same, multilingual (Mandarin: language="zh")
    opsnn_quant.zoo.dataset("shapes", "eval") # datasets.Dataset
    opsnn_quant.zoo.dataset("shapes-video", "eval")  # clips with prompts and motion labels

Each entry is resolved lazily so that ``import opsnn_quant`` never imports diffusers/transformers.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opsnn_quant.core.hub import quiet_progress_bars, set_offline_env
from opsnn_quant.errors import ModelLoadError

# name -> "module:function"; the function takes no argument (or keyword options) and returns the model.
_MODELS: dict[str, str] = {
    "shapes-t2i": "opsnn_quant.zoo.shapes_pipeline:load_shapes_t2i",
    "shapes-clip": "opsnn_quant.zoo.shapes_clip:load_shapes_clip",
    "shapes-dit": "opsnn_quant.zoo.shapes_dit:load_shapes_dit",
    "shapes-t2v": "opsnn_quant.zoo.shapes_t2v:load_shapes_t2v",
    "shapes-video-encoder": "opsnn_quant.zoo.shapes_video_encoder:load_shapes_video_encoder",
    "whisper-tiny.en": "opsnn_quant.zoo.whisper:load_whisper_tiny_en",
    "whisper-base": "opsnn_quant.zoo.whisper:load_whisper_base",
}

# name -> "module:function"; the function takes no argument and returns the model's directory
# (a diffusers pipeline or a transformers model directory; what the adapters load).
_DIRS: dict[str, str] = {
    "shapes-t2i": "opsnn_quant.zoo.shapes_pipeline:weights_dir",
    "shapes-clip": "opsnn_quant.zoo.shapes_clip:weights_dir",
    "shapes-dit": "opsnn_quant.zoo.shapes_dit:weights_dir",
    "shapes-t2v": "opsnn_quant.zoo.shapes_t2v:weights_dir",
    "shapes-video-encoder": "opsnn_quant.zoo.shapes_video_encoder:weights_dir",
    "whisper-tiny.en": "opsnn_quant.zoo.whisper:ensure_converted",
    "whisper-base": "opsnn_quant.zoo.whisper:base_dir",
}

# name -> "module:function"; the function takes ``split`` and returns a datasets.Dataset.
_DATASETS: dict[str, str] = {
    "shapes": "opsnn_quant.zoo.shapes_data:load_split",
    "shapes-video": "opsnn_quant.zoo.shapes_video:load_split",
    "speech": "opsnn_quant.zoo.speech_data:load_split",
    "speech-zh": "opsnn_quant.zoo.speech_zh:load_split",
}
# Datasets that give records directly (no ``datasets.Dataset`` to build and convert back).
_RECORDS: dict[str, str] = {
    "shapes-video": "opsnn_quant.zoo.shapes_video:split_records",
    "speech": "opsnn_quant.zoo.speech_data:split_records",
    "speech-zh": "opsnn_quant.zoo.speech_zh:split_records",
}


def _resolve(table: dict[str, str], name: str, kind: str) -> Callable[..., Any]:
    if name not in table:
        known = ", ".join(sorted(table))
        raise ModelLoadError(f"unknown zoo {kind} {name!r}; known: {known}")
    module_name, func_name = table[name].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, func_name)


def list() -> builtins.list[str]:
    """Names of the zoo models, sorted."""
    return sorted(_MODELS)


def datasets() -> builtins.list[str]:
    """Names of the zoo datasets, sorted."""
    return sorted(_DATASETS)


def load(name: str, **kwargs: Any) -> Any:
    """Load a zoo model offline.

    Args:
        name: One of :func:`list`.
        **kwargs: Passed to the entry's loader (e.g. ``torch_dtype``).

    Returns:
        The model in the class real users quantize (diffusers pipeline, transformers model).

    Raises:
        ModelLoadError: The name is unknown or the model cannot be loaded.
    """
    set_offline_env()
    quiet_progress_bars()
    return _resolve(_MODELS, name, "model")(**kwargs)


def model_dir(name: str) -> Path:
    """The directory of zoo model ``name`` in its library's standard layout (converted first
    where the zoo keeps it in another form).

    Raises:
        ModelLoadError: The name is unknown or the model cannot be prepared.
    """
    return Path(_resolve(_DIRS, name, "model")())


def dataset(name: str, split: str, **kwargs: Any) -> Any:
    """Load a zoo dataset split offline as a ``datasets.Dataset``.

    Args:
        name: One of :func:`datasets`.
        split: ``train``, ``calibration`` or ``eval`` (entries may offer more).
        **kwargs: Passed to the entry's loader (e.g. ``limit``).
    """
    set_offline_env()
    return _resolve(_DATASETS, name, "dataset")(split, **kwargs)


def records(name: str, split: str, limit: int | None = None) -> builtins.list[dict[str, Any]]:
    """A zoo dataset split offline as records (dicts), the rows of :func:`dataset`.

    Args:
        name: One of :func:`datasets`.
        split: As :func:`dataset`.
        limit: The first ``limit`` records.
    """
    if name in _RECORDS:
        set_offline_env()
        return _resolve(_RECORDS, name, "dataset")(split, limit=limit)
    return [dict(r) for r in dataset(name, split, limit=limit)]
