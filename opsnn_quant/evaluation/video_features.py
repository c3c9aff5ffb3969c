"""The feature space of the video distribution criterion (KVD): a small 3-D convolutional encoder.

FVD takes its distances in the features of I3D (a Kinetics-trained 3-D ConvNet); KVD is KID's
unbiased kernel MMD² (:mod:`.kid`) in the same kind of features. No Kinetics network fits a
package that runs offline on a CPU, so a suite names a small encoder of this class trained on
its own domain (``metrics.video_features``: a zoo name, ``shapes-video-encoder``, or a local
directory holding ``config.json`` and ``model.safetensors``), as the shapes suites take FD/KID
in the shapes CLIP's image space. Its figures are comparable only with figures in the same
encoder's features.

The network: four 3-D convolutions (space /8, time /2; SiLU between) and the mean over space and
time of the last map, times ``scale``: ``config.json`` ``{"width": W, "features": D, "scale": s}``.
KID's kernel ``(x·y / d + 1)³`` expects features of order one (Inception's pool features are);
``scale`` is one over the features' RMS on the encoder's training clips, so that the kernel
neither explodes nor flattens whatever the network's own magnitudes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from opsnn_quant.errors import ConfigError

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
FEATURE_BATCH = 64


class VideoEncoder(nn.Module):
    """uint8 videos ``[n, F, H, W, 3]`` -> features ``[n, D]``."""

    def __init__(self, width: int = 16, features: int = 64, scale: float = 1.0) -> None:
        super().__init__()
        w = width
        self.width, self.out_features, self.scale = width, features, scale
        self.body = nn.Sequential(
            nn.Conv3d(3, w, 3, stride=(1, 2, 2), padding=1),
            nn.SiLU(),
            nn.Conv3d(w, 2 * w, 3, stride=(1, 2, 2), padding=1),
            nn.SiLU(),
            nn.Conv3d(2 * w, 4 * w, 3, stride=(2, 2, 2), padding=1),
            nn.SiLU(),
            nn.Conv3d(4 * w, features, 3, stride=1, padding=1),
        )

    @staticmethod
    def prepare(videos: torch.Tensor) -> torch.Tensor:
        """uint8 ``[n, F, H, W, 3]`` -> float ``[n, 3, F, H, W]`` in [-1, 1]."""
        return videos.float().div(127.5).sub(1.0).permute(0, 4, 1, 2, 3)

    def forward(self, videos: torch.Tensor) -> torch.Tensor:
        """The features of each video (the mean over space and time of the last map, scaled)."""
        return self.body(self.prepare(videos)).mean(dim=(2, 3, 4)) * self.scale

    def config(self) -> dict[str, Any]:
        """What :func:`load_video_encoder` rebuilds the network from."""
        return {"width": self.width, "features": self.out_features, "scale": self.scale}


def load_video_encoder(directory: str | Path) -> VideoEncoder:
    """The encoder saved in ``directory`` (``config.json`` + ``model.safetensors``), in eval mode.

    Raises:
        ConfigError: missing files, or weights that do not fit the config.
    """
    from safetensors.torch import load_file

    d = Path(directory)
    try:
        config = json.loads((d / CONFIG).read_text())
        model = VideoEncoder(
            width=int(config["width"]),
            features=int(config["features"]),
            scale=float(config.get("scale", 1.0)),
        )
        model.load_state_dict(load_file(str(d / WEIGHTS)))
    except (OSError, KeyError, TypeError, ValueError, RuntimeError) as err:
        raise ConfigError(
            f"metrics.video_features: cannot load a video encoder from {d}: {err}"
        ) from None
    return model.eval().requires_grad_(False)


def save_video_encoder(model: VideoEncoder, directory: str | Path) -> Path:
    """Write ``model`` as :func:`load_video_encoder` reads it (the body's tensors only)."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(d / WEIGHTS))
    (d / CONFIG).write_text(json.dumps(model.config(), indent=1) + "\n")
    return d


def suite_video_encoder(name: str | None) -> tuple[VideoEncoder, str] | None:
    """A suite's ``metrics.video_features`` loaded, with its label; None: none named."""
    if name is None:
        return None
    if Path(name).is_dir():
        return load_video_encoder(name), Path(name).name
    from opsnn_quant.sources import model_path

    source = name if ":" in name else f"zoo:{name}"
    return load_video_encoder(model_path(source)), name


@torch.no_grad()
def video_features(encoder: nn.Module, videos: list[np.ndarray]) -> torch.Tensor:
    """``[n, D]`` float64 features of uint8 videos ``[F, H, W, 3]``, in batches."""
    rows = []
    for start in range(0, len(videos), FEATURE_BATCH):
        batch = torch.from_numpy(np.stack(videos[start : start + FEATURE_BATCH]))
        rows.append(encoder(batch).double())
    return torch.cat(rows)
