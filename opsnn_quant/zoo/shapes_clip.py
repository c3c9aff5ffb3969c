"""The shapes CLIP: a small transformers ``CLIPModel`` trained contrastively on the shapes data.

Vision tower: ViT on 32×32 images with 4×4 patches (64 patches + class token), hidden 128,
3 layers, 4 heads. Text tower: hidden 128, 3 layers, 4 heads, 24 positions, the shapes
tokenizer (:mod:`opsnn_quant.zoo.tokenizer_shapes`). Projection 128. Its text tower is also
the text encoder of the shapes text-to-image pipeline.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from opsnn_quant.errors import ModelLoadError

if TYPE_CHECKING:
    import numpy as np
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights" / "shapes-clip"
# Pixels map to [-1, 1]; the processor and the training fast path (pixel_values) agree on it.
IMAGE_MEAN = [0.5, 0.5, 0.5]
IMAGE_STD = [0.5, 0.5, 0.5]


def clip_config(vocab_size: int, bos_token_id: int, eos_token_id: int) -> CLIPConfig:
    """Config of the shapes CLIP for a tokenizer with the given size and special tokens."""
    from transformers import CLIPConfig

    from opsnn_quant.zoo.tokenizer_shapes import MODEL_MAX_LENGTH

    text = {
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "max_position_embeddings": MODEL_MAX_LENGTH,
        "bos_token_id": bos_token_id,
        # Pooling takes the first EOS; the pad token is EOS too, so padding does not move it.
        "eos_token_id": eos_token_id,
        "pad_token_id": eos_token_id,
    }
    vision = {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "image_size": 32,
        "patch_size": 4,
        "num_channels": 3,
    }
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=128)


def image_processor() -> CLIPImageProcessor:
    """The ``CLIPImageProcessor`` saved with the model (32×32, mean/std 0.5)."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": 32},
        do_center_crop=True,
        crop_size={"height": 32, "width": 32},
        do_rescale=True,
        do_normalize=True,
        image_mean=IMAGE_MEAN,
        image_std=IMAGE_STD,
        do_convert_rgb=True,
    )


def pixel_values(images: np.ndarray) -> torch.Tensor:
    """Normalize uint8 ``[n, 32, 32, 3]`` images as the processor does (without resizing).

    Args:
        images: uint8 images already 32×32.

    Returns:
        float32 ``[n, 3, 32, 32]`` in [-1, 1].
    """
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor(IMAGE_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def _directory(path: str | Path | None) -> Path:
    directory = Path(path) if path is not None else WEIGHTS_DIR
    if not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"no shapes-clip model at {directory}; run python -m opsnn_quant.zoo.training.train_shapes clip"
        )
    return directory


def load_shapes_clip(
    torch_dtype: torch.dtype = torch.float32, path: str | Path | None = None
) -> CLIPModel:
    """Load the shapes CLIP offline, in eval mode.

    Args:
        torch_dtype: Dtype of the weights.
        path: Model directory; defaults to the committed ``weights/shapes-clip``.

    Raises:
        ModelLoadError: The directory is missing or incomplete.
    """
    import transformers
    from transformers import CLIPModel

    directory = _directory(path)
    # transformers 5 renamed torch_dtype to dtype.
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    kwargs: dict[str, Any] = {dtype_kw: torch_dtype, "local_files_only": True}
    try:
        model = CLIPModel.from_pretrained(str(directory), **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load shapes-clip from {directory}: {err}") from err
    return model.eval()


def load_shapes_clip_processor(path: str | Path | None = None) -> CLIPProcessor:
    """Load the ``CLIPProcessor`` (shapes tokenizer + 32×32 image processor) offline."""
    from transformers import CLIPProcessor

    directory = _directory(path)
    try:
        return CLIPProcessor.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load the shapes-clip processor: {err}") from err


def retrieval_accuracy(
    model: CLIPModel,
    processor: CLIPProcessor,
    n: int = 256,
    n_candidates: int = 16,
    seed: int = 0,
) -> float:
    """Top-1 accuracy of picking an eval image's caption among ``n_candidates`` captions.

    The candidates are the true caption and ``n_candidates - 1`` other eval captions that do
    not describe the image (see :func:`opsnn_quant.zoo.shapes_data.caption_fits`), drawn with a
    fixed generator. Images and captions go through the processor, as a user's would.

    Args:
        model: A shapes CLIP (or a quantized copy).
        processor: Its processor.
        n: Number of eval images.
        n_candidates: Captions per image, the right one included.
        seed: Seed of the eval data and of the distractor draw.

    Returns:
        Fraction of images whose caption scored highest.
    """
    import numpy as np

    from opsnn_quant.zoo.shapes_data import LABEL_COLUMNS, caption_fits, generate

    images, captions, labels = generate("eval", n, seed=seed)
    pool = sorted(set(captions))
    rng = np.random.default_rng([seed, 16])
    device = next(model.parameters()).device
    with torch.no_grad():
        text_in = processor(text=pool, return_tensors="pt", padding="max_length", truncation=True)
        text = model.get_text_features(**{k: v.to(device) for k, v in text_in.items()})
        img_in = processor(images=list(images), return_tensors="pt")
        pix = img_in["pixel_values"].to(device=device, dtype=model.dtype)
        img = model.get_image_features(pixel_values=pix)
    text = _as_tensor(text).float()
    img = _as_tensor(img).float()
    text = text / text.norm(dim=-1, keepdim=True)
    img = img / img.norm(dim=-1, keepdim=True)
    sims = (img @ text.T).cpu().numpy()
    index = {c: i for i, c in enumerate(pool)}
    correct = 0
    for i in range(n):
        lab: dict[str, Any] = {k: labels[k][i] for k in LABEL_COLUMNS}
        wrong = [j for j, c in enumerate(pool) if not caption_fits(c, lab)]
        picks = rng.choice(len(wrong), size=n_candidates - 1, replace=False)
        cand = [index[captions[i]], *(wrong[p] for p in picks)]
        correct += int(int(np.argmax(sims[i, cand])) == 0)
    return correct / n


def _as_tensor(features: Any) -> torch.Tensor:
    # transformers 5 may return a model output with pooler_output instead of a bare tensor.
    if isinstance(features, torch.Tensor):
        return features
    pooled: torch.Tensor = features.pooler_output
    return pooled


def weights_dir() -> Path:
    """The committed model directory (model and processor files).

    Raises:
        ModelLoadError: It holds no model.
    """
    return _directory(None)
