"""The shapes video encoder: the KVD feature space of the shapes-t2v suite.

A :class:`~opsnn_quant.evaluation.video_features.VideoEncoder` (width 16, 64 features) trained
by ``python -m opsnn_quant.zoo.training.train_shapes_video_encoder`` to tell each clip's shape,
colour, size, motion and speed from its frames (one linear head each, not shipped), so that its
features see what the captions fix, motion included. Weights: ``weights/shapes-video-encoder``.
"""

from __future__ import annotations

from pathlib import Path

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.evaluation.video_features import VideoEncoder, load_video_encoder

WEIGHTS_DIR = Path(__file__).parent / "weights" / "shapes-video-encoder"


def load_shapes_video_encoder() -> VideoEncoder:
    """The trained encoder, in eval mode."""
    return load_video_encoder(weights_dir())


def weights_dir() -> Path:
    """The committed directory.

    Raises:
        ModelLoadError: it holds no encoder.
    """
    if not (WEIGHTS_DIR / "model.safetensors").is_file():
        raise ModelLoadError(
            f"no shapes-video-encoder at {WEIGHTS_DIR}; run python -m "
            "opsnn_quant.zoo.training.train_shapes_video_encoder"
        )
    return WEIGHTS_DIR
