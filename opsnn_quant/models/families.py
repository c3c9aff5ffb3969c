"""The built-in model families, registered in the family table (:mod:`.family`) the way a
team's own family is: ``diffusers-sd`` (UNet pipelines: SD 1.x/2.x, SDXL), ``whisper``
(transformers Whisper) and ``diffusers-dit`` (transformer-denoiser pipelines: SD3, FLUX, PixArt,
Wan), in that order (messages list them so). Imported by :mod:`opsnn_quant.models`.

Detection reads config files only: a diffusers pipeline is a ``model_index.json`` (a UNet
pipeline unless it names a transformer and no UNet), a Whisper model a ``config.json`` whose
``model_type`` is ``whisper``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.models.data import prompts_from, speech_from
from opsnn_quant.models.family import Family, register_family
from opsnn_quant.models.footprint import check_diffusion_memory
from opsnn_quant.models.settings import DiTSettings, SDSettings, WhisperSettings

PIPELINE_INDEX = "model_index.json"
CONFIG = "config.json"


def _json_object(file: Path) -> dict[str, Any]:
    """The JSON object in ``file`` (an array or a scalar: an empty one, detecting nothing).

    Raises:
        ModelLoadError: the file is not JSON.
    """
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{file} is not valid JSON") from exc
    return data if isinstance(data, dict) else {}


def _pipeline_denoiser(path: Path) -> str | None:
    """``transformer`` for a pipeline whose denoiser is a transformer (it names a transformer
    and no UNet), ``unet`` for any other pipeline, None for a directory without an index.

    Raises:
        ModelLoadError: the index is not JSON, or not an object.
    """
    index_file = path / PIPELINE_INDEX
    if not index_file.is_file():
        return None
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{index_file} is not valid JSON") from exc
    if not isinstance(index, dict):
        raise ModelLoadError(f"{index_file} is not a JSON object")

    def named(component: str) -> bool:  # [library, class], not [null, null]
        v = index.get(component)
        return isinstance(v, list) and len(v) == 2 and v[1] is not None

    return "transformer" if named("transformer") and not named("unet") else "unet"


def is_unet_pipeline(path: Path) -> bool:
    """A diffusers pipeline whose denoiser is a UNet (the ``diffusers-sd`` family)."""
    return _pipeline_denoiser(path) == "unet"


def is_transformer_pipeline(path: Path) -> bool:
    """A diffusers pipeline whose denoiser is a transformer (the ``diffusers-dit`` family)."""
    return _pipeline_denoiser(path) == "transformer"


def is_whisper(path: Path) -> bool:
    """A transformers model directory whose ``config.json`` says ``model_type: whisper``.

    Raises:
        ModelLoadError: the config is not JSON.
    """
    config = path / CONFIG
    return config.is_file() and _json_object(config).get("model_type") == "whisper"


def check_pipeline_weights(source: str, path: Path, allow_pickle: bool) -> object:
    """A pipeline's weight files (:func:`~opsnn_quant.models.diffusers_base
    .check_pipeline_weights`, imported when a pipeline is met)."""
    from opsnn_quant.models.diffusers_base import check_pipeline_weights, pipeline_index

    index = pipeline_index(source, path)
    return check_pipeline_weights(source, *index, allow_pickle=allow_pickle)


def check_transformers_weights(source: str, path: Path, allow_pickle: bool) -> object:
    """A transformers model directory's weight files (:func:`~opsnn_quant.models.whisper
    .check_whisper_weights`: its conversion hint loads the directory as Whisper)."""
    from opsnn_quant.models.whisper import check_whisper_weights

    return check_whisper_weights(source, path, allow_pickle=allow_pickle)


# The engine a family's models are usually served by on Ascend (its target without a recipe):
# MindIE-SD for diffusers pipelines, vLLM-Ascend for Whisper.
MINDIE_SD = "ascend910b-mindie-sd"
VLLM_ASCEND = "ascend910b-vllm-ascend"

DIFFUSERS_SD = Family(
    name="diffusers-sd",
    adapter="opsnn_quant.models.diffusers_sd:DiffusersSDAdapter",
    settings=SDSettings,
    detect=is_unet_pipeline,
    layout=PIPELINE_INDEX,
    check_weights=check_pipeline_weights,
    takes="prompts",
    check_records=prompts_from,
    target=MINDIE_SD,
    steps=True,
    recipe="sd15-template",
    suite="sd15-template",
    footprint=check_diffusion_memory,
)
WHISPER = Family(
    name="whisper",
    adapter="opsnn_quant.models.whisper:WhisperAdapter",
    settings=WhisperSettings,
    detect=is_whisper,
    layout=CONFIG,
    check_weights=check_transformers_weights,
    takes="16 kHz audio",
    check_records=speech_from,
    target=VLLM_ASCEND,
    recipe="whisper-template",
    suite="whisper-template",
    # The estimator's backward keeps a whole replayed call's graph: four 1500-frame utterances
    # of a real Whisper base's encoder raised calibrate's peak RSS from 2.3 to 6.2 GB (4.2x a
    # float pass); one at a time 2.9 GB, the same policy.yaml byte for byte (docs/performance.md)
    probe=MappingProxyType({"estimator_batch": {"audio_encoder": 1}}),
)
DIFFUSERS_DIT = Family(
    name="diffusers-dit",
    adapter="opsnn_quant.models.diffusers_dit:DiffusersDiTAdapter",
    settings=DiTSettings,
    detect=is_transformer_pipeline,
    layout=PIPELINE_INDEX,
    check_weights=check_pipeline_weights,
    takes="prompts",
    check_records=prompts_from,
    target=MINDIE_SD,
    steps=True,
    recipe="sd3-template",
    suite="sd15-template",
    footprint=check_diffusion_memory,
)

for _builtin in (DIFFUSERS_SD, WHISPER, DIFFUSERS_DIT):
    register_family(_builtin, replace=True)
