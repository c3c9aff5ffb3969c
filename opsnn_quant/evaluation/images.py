"""Image batches in the layouts the metrics want, from whatever a pipeline returned.

Pipelines hand back PIL images, ``uint8`` or ``[0, 1]`` float NHWC arrays (diffusers
``output_type="np"``), or tensors. Every metric here works on ``uint8`` pixels, the form images
are saved and viewed in, so that "how far did the quantized image move" is measured on what a
user actually sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from opsnn_quant.errors import ShapeError

ImageBatch = np.ndarray | torch.Tensor | Sequence[Any]


def _float_to_uint8(x: np.ndarray) -> np.ndarray:
    # Same rounding as diffusers' numpy_to_pil: (x * 255).round().
    return np.clip(np.round(x.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)


def as_uint8_nhwc(images: ImageBatch) -> np.ndarray:
    """Convert a batch of RGB images to a ``uint8`` ``[N, H, W, 3]`` array.

    Accepted: a list of PIL images or HWC arrays; a NHWC or NCHW array or tensor, either
    ``uint8`` (0..255) or floating point in ``[0, 1]``. Channel order is detected from the
    axis of size 3 (NCHW is assumed only when the last axis is not 3).

    Raises:
        ShapeError: Not a batch of 3-channel images.
    """
    if isinstance(images, torch.Tensor):
        arr = images.detach().cpu().numpy()
    elif isinstance(images, np.ndarray):
        arr = images
    else:
        items = [np.asarray(im.convert("RGB")) if hasattr(im, "convert") else np.asarray(im)
                 for im in images]  # fmt: skip
        if not items:
            raise ShapeError("empty image list")
        arr = np.stack(items)
    if arr.ndim == 3:  # a single image
        arr = arr[None]
    if arr.ndim != 4:
        raise ShapeError(f"expected a batch of images [N, H, W, 3], got shape {arr.shape}")
    if arr.shape[-1] != 3 and arr.shape[1] == 3:
        arr = arr.transpose(0, 2, 3, 1)
    if arr.shape[-1] != 3:
        raise ShapeError(f"expected RGB images with 3 channels, got shape {arr.shape}")
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if np.issubdtype(arr.dtype, np.floating):
        return _float_to_uint8(arr)
    if np.issubdtype(arr.dtype, np.integer):
        return np.clip(arr, 0, 255).astype(np.uint8)
    raise ShapeError(f"unsupported image dtype {arr.dtype}")


def as_uint8_nchw(images: ImageBatch) -> torch.Tensor:
    """Like :func:`as_uint8_nhwc` but a ``uint8`` ``[N, 3, H, W]`` tensor (torchmetrics' layout)."""
    return torch.from_numpy(as_uint8_nhwc(images)).permute(0, 3, 1, 2).contiguous()
