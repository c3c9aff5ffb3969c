"""CLIP score of images against their prompts with torchmetrics ``CLIPScore`` and a local CLIP.

torchmetrics 1.9 loads a CLIP by name only when the name contains ``"openai"`` (a Hub id, i.e.
network), and with transformers 5 its ``get_image_features``/``get_text_features`` return a
model output where torchmetrics expects a tensor. It also accepts ``model_name_or_path`` as a
callable returning ``(model, processor)``: :class:`TensorCLIP` is that model, a thin wrapper
whose feature methods return tensors, around any transformers ``CLIPModel`` loaded offline.

Score definition (Hessel et al. 2021): ``100 * max(cos(image, text), 0)`` per image, averaged.
torchmetrics' ``CLIPScore.compute`` clamps the *mean* instead of each image; the two agree
unless some image scores below zero, so each image is scored by its own ``update`` on a fresh
state (its ``score`` state is then that image's ``100 * cos``), clamped, and averaged here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from opsnn_quant.errors import InputError, MissingDependencyError, ModelLoadError
from opsnn_quant.evaluation.images import ImageBatch, as_uint8_nchw

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'opsnn-quant[eval]'"


def _as_tensor(features: Any) -> torch.Tensor:
    if isinstance(features, torch.Tensor):
        return features
    # transformers 5: BaseModelOutputWithPooling whose pooler_output is the projected embedding.
    return cast(torch.Tensor, features.pooler_output)


class TensorCLIP(nn.Module):
    """A ``CLIPModel`` whose ``get_image_features``/``get_text_features`` return tensors.

    Exposes ``config`` because torchmetrics reads ``config.text_config.max_position_embeddings``
    to truncate long captions.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.clip = model.eval()
        self.config = model.config

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Projected image embeddings ``[N, P]``."""
        dtype = next(self.clip.parameters()).dtype
        with torch.no_grad():
            out = self.clip.get_image_features(pixel_values=pixel_values.to(dtype))  # type: ignore[operator]
        return _as_tensor(out).float()

    def get_text_features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Projected text embeddings ``[N, P]``."""
        with torch.no_grad():
            out = self.clip.get_text_features(input_ids=input_ids, attention_mask=attention_mask)  # type: ignore[operator]
        return _as_tensor(out).float()


def load_local_clip(path: str | Path, *, allow_pickle: bool = False) -> tuple[nn.Module, Any]:
    """Load a transformers ``CLIPModel`` and ``CLIPProcessor`` from a local directory, offline.

    The weights load from safetensors only; pickle-only weights (``pytorch_model.bin``, ...)
    are refused before anything loads unless ``allow_pickle`` (then read with
    ``torch.load(weights_only=True)``).

    Raises:
        ModelLoadError: The directory does not hold a loadable CLIP model and processor, or
            holds pickle weights only and ``allow_pickle`` is False.
    """
    import contextlib

    import torch
    from transformers import CLIPModel, CLIPProcessor

    from opsnn_quant.core.hub import (
        check_pickle_weights,
        transformers_dtype,
        weights_only_torch_load,
    )

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"{directory} is not a Hugging Face CLIP directory (no config.json)")
    pickled = check_pickle_weights(
        str(directory),
        directory,
        [directory],
        allow_pickle=allow_pickle,
        convert=f'python -c "from transformers import CLIPModel as M; '
        f"M.from_pretrained('{directory}').save_pretrained('{directory}')\"",
    )
    try:
        with weights_only_torch_load() if pickled else contextlib.nullcontext():
            model = CLIPModel.from_pretrained(
                str(directory),
                local_files_only=True,
                use_safetensors=None if pickled else True,
                **transformers_dtype(torch.float32),
            )
        processor = CLIPProcessor.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load a CLIP model from {directory}: {err}") from err
    return model.eval(), processor


@dataclass
class ClipScoreResult:
    """CLIP scores of a set of images against their prompts.

    Attributes:
        mean: Mean of the per-image scores (the CLIP score of the set).
        per_image: ``100 * max(cos, 0)`` for each image, in input order.
        model: Label of the CLIP used (scores from different CLIPs are not comparable).
    """

    mean: float
    per_image: list[float] = field(default_factory=list)
    model: str = ""

    @property
    def n(self) -> int:
        """Number of images."""
        return len(self.per_image)


class ClipScorer:
    """Scores images against prompts with torchmetrics ``CLIPScore`` on a local CLIP.

    Args:
        model: A transformers ``CLIPModel`` (loaded offline by the caller or :meth:`from_dir`).
        processor: Its ``CLIPProcessor`` (tokenizer + image processor).
        label: Name of the CLIP for the report, e.g. ``"shapes-clip"``.
    """

    def __init__(self, model: nn.Module, processor: Any, label: str) -> None:
        try:
            from torchmetrics.multimodal.clip_score import CLIPScore
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(f"CLIP score needs torchmetrics: {INSTALL_HINT}") from err
        wrapped = TensorCLIP(model)
        loader: Callable[[], tuple[nn.Module, Any]] = lambda: (wrapped, processor)  # noqa: E731
        # no sync: rank 0 scores every rank's images alone (see opsnn_quant.distributed)
        self.metric = CLIPScore(model_name_or_path=cast(Any, loader), sync_on_compute=False)
        self.label = label

    @classmethod
    def from_dir(
        cls, path: str | Path, label: str | None = None, *, allow_pickle: bool = False
    ) -> ClipScorer:
        """A scorer on a local Hugging Face CLIP directory (see :func:`load_local_clip`)."""
        model, processor = load_local_clip(path, allow_pickle=allow_pickle)
        return cls(model, processor, label or Path(path).name)

    def score(self, images: ImageBatch, prompts: Sequence[str]) -> ClipScoreResult:
        """CLIP score of each image against its prompt, and their mean.

        Args:
            images: N RGB images (see :func:`~opsnn_quant.evaluation.images.as_uint8_nhwc`).
            prompts: N prompts, in the same order.

        Raises:
            InputError: Counts differ or there are no images.
        """
        pixels = as_uint8_nchw(images)
        if pixels.shape[0] != len(prompts):
            raise InputError(f"{pixels.shape[0]} images but {len(prompts)} prompts")
        if not prompts:
            raise InputError("CLIP score needs at least one image")
        per_image = []
        for i in range(pixels.shape[0]):
            # One image per update on a fresh state: ``score`` is then that image's 100·cos.
            self.metric.reset()
            self.metric.update(pixels[i : i + 1], [str(prompts[i])])
            per_image.append(max(float(self.metric.score), 0.0))
        self.metric.reset()
        return ClipScoreResult(mean=sum(per_image) / len(per_image), per_image=per_image,
                               model=self.label)  # fmt: skip
