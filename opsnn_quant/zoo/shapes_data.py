"""Generated shapes dataset: 32×32 RGB images of one or two coloured shapes with captions.

Every sample is a pure function of ``(seed, split, index)``: the generator seeds a fresh
``numpy.random.Generator`` per sample, so a prefix of a split does not depend on how many
samples are drawn, and re-running gives byte-identical images.

Held-out combinations: a fixed sixth of the ``(colour, shape, position)`` triples never appears
in ``train`` or ``calibration`` (in any shape of an image); every ``eval`` sample's first shape is
one of them, so evaluation prompts are never seen in training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import InputError

if TYPE_CHECKING:
    import datasets
    import numpy as np

logger = logging.getLogger(__name__)

IMAGE_SIZE = 32
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star")
# Well separated in RGB so that a judge (and a small VAE) cannot mix them up.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 235),
    "yellow": (235, 215, 40),
    "purple": (160, 60, 210),
    "white": (235, 235, 235),
}
SIZES: tuple[str, ...] = ("small", "large")
# Nominal (row, col) centre of each position.
POSITIONS: dict[str, tuple[int, int]] = {
    "top left": (8, 8),
    "top right": (8, 24),
    "bottom left": (24, 8),
    "bottom right": (24, 24),
    "center": (16, 16),
}
# Two-shape images use corners only, so that two large shapes never overlap.
CORNERS: tuple[str, ...] = ("top left", "top right", "bottom left", "bottom right")
# Radius ranges in pixels.
_RADII: dict[str, tuple[float, float]] = {"small": (4.5, 5.5), "large": (7.0, 7.8)}
SPLITS: dict[str, int] = {"train": 0, "calibration": 1, "eval": 2}
DEFAULT_SIZES: dict[str, int] = {"train": 20000, "calibration": 512, "eval": 1024}
LABEL_COLUMNS: tuple[str, ...] = (
    "shape",
    "color",
    "size",
    "position",
    "n_shapes",
    "shape2",
    "color2",
    "size2",
    "position2",
)


def _is_held_out(color: str, shape: str, position: str) -> bool:
    # A Latin-square-like rule: each (shape, position) pair loses exactly one colour and each
    # (colour, shape) pair at most one position, so every attribute value stays in training.
    c = list(COLORS).index(color)
    s = SHAPES.index(shape)
    p = list(POSITIONS).index(position)
    return (c + 2 * s + p) % len(COLORS) == 0


HELD_OUT: frozenset[tuple[str, str, str]] = frozenset(
    (c, s, p) for c in COLORS for s in SHAPES for p in POSITIONS if _is_held_out(c, s, p)
)


def vocabulary() -> list[str]:
    """Every word that a caption can contain, in a fixed order."""
    words = ["a", "and", "at", "the"]
    words += list(SIZES) + list(COLORS) + list(SHAPES)
    for position in POSITIONS:
        words += [w for w in position.split() if w not in words]
    return words


@dataclass(frozen=True)
class ShapeSpec:
    """One drawn shape."""

    shape: str
    color: str
    size: str
    position: str


def _shape_caption(spec: ShapeSpec, with_size: bool, with_position: bool) -> str:
    words = ["a"] + ([spec.size] if with_size else []) + [spec.color, spec.shape]
    if with_position:
        words += ["at", "the", spec.position]
    return " ".join(words)


def _polygon(shape: str, row: float, col: float, radius: float) -> tuple[Any, Any]:
    import numpy as np

    if shape == "square":
        h = radius * 0.85  # a square of half-side r looks bigger than a disk of radius r
        return np.array([row - h, row - h, row + h, row + h]), np.array(
            [col - h, col + h, col + h, col - h]
        )
    if shape == "triangle":
        angles = np.deg2rad([-90.0, 30.0, 150.0])
        r: Any = radius * 1.3
    elif shape == "star":
        angles = np.deg2rad(-90.0 + 36.0 * np.arange(10))
        r = np.where(np.arange(10) % 2 == 0, radius * 1.2, radius * 0.5)
    else:  # pragma: no cover - guarded by SHAPES
        raise ValueError(shape)
    return row + r * np.sin(angles), col + r * np.cos(angles)


def _draw(image: np.ndarray, spec: ShapeSpec, rng: np.random.Generator) -> None:
    r0, c0 = POSITIONS[spec.position]
    row = r0 + rng.uniform(-1.0, 1.0)
    col = c0 + rng.uniform(-1.0, 1.0)
    radius = rng.uniform(*_RADII[spec.size])
    paint(image, spec.shape, row, col, radius, jittered_color(spec.color, rng))


def jittered_color(color: str, rng: np.random.Generator) -> list[int]:
    """The palette colour ``color`` with each channel moved by up to 12 levels."""
    jitter = rng.integers(-12, 13, size=3)
    return [min(255, max(0, v + int(j))) for v, j in zip(COLORS[color], jitter, strict=True)]


def paint(
    image: np.ndarray, shape: str, row: float, col: float, radius: float, rgb: list[int]
) -> None:
    """Fill ``shape`` of nominal ``radius`` centred at (``row``, ``col``) with ``rgb``, clipped
    to the image (also the frames of :mod:`.shapes_video`)."""
    from skimage import draw

    size = (image.shape[0], image.shape[1])
    if shape == "circle":
        rr, cc = draw.disk((row, col), radius, shape=size)
    else:
        pr, pc = _polygon(shape, row, col, radius)
        rr, cc = draw.polygon(pr, pc, shape=size)
    image[rr, cc] = rgb


def background(rng: np.random.Generator) -> np.ndarray:
    """A dark, slightly tinted, faintly noisy 32x32 background (also the videos')."""
    return _background(rng)


def _background(rng: np.random.Generator) -> np.ndarray:
    import numpy as np

    # Dark, slightly tinted grey with faint noise: "lightly textured" but never close to a palette
    # colour, so the colour of a shape is unambiguous.
    base = rng.uniform(15.0, 60.0) + rng.uniform(-6.0, 6.0, size=3)
    noise = rng.normal(0.0, rng.uniform(0.0, 4.0), size=(IMAGE_SIZE, IMAGE_SIZE, 3))
    return np.clip(np.rint(base + noise), 0, 255).astype(np.uint8)


def _pick(rng: np.random.Generator, items: tuple[str, ...] | list[str]) -> str:
    return items[int(rng.integers(len(items)))]


def _spec(rng: np.random.Generator, positions: tuple[str, ...], held_out: bool | None) -> ShapeSpec:
    """Draw a shape spec; ``held_out`` True/False forces the triple in/out of HELD_OUT."""
    while True:
        spec = ShapeSpec(
            shape=_pick(rng, SHAPES),
            color=_pick(rng, list(COLORS)),
            size=_pick(rng, SIZES),
            position=_pick(rng, positions),
        )
        inside = (spec.color, spec.shape, spec.position) in HELD_OUT
        if held_out is None or inside == held_out:
            return spec


def sample(split: str, index: int, seed: int = 0) -> tuple[np.ndarray, str, dict[str, Any]]:
    """Generate one sample.

    Args:
        split: ``train``, ``calibration`` or ``eval``.
        index: Sample index inside the split.
        seed: Dataset seed.

    Returns:
        ``(image uint8 [32, 32, 3], caption, labels)``; labels hold :data:`LABEL_COLUMNS`.
    """
    import numpy as np

    split_id = _split_id(split)
    rng = np.random.default_rng([seed, split_id, index])
    is_eval = split == "eval"
    two = rng.random() < (0.25 if is_eval else 0.3)
    first = _spec(rng, CORNERS if two else tuple(POSITIONS), held_out=is_eval)
    specs = [first]
    if two:
        while True:
            # Eval may pair its held-out shape with any second shape; train never sees one.
            second = _spec(rng, CORNERS, held_out=None if is_eval else False)
            if second.position != first.position and (second.shape, second.color) != (
                first.shape,
                first.color,
            ):
                break
        specs.append(second)
    image = _background(rng)
    for spec in specs:
        _draw(image, spec, rng)

    if two:
        # Eval captions always name positions so that the held-out triple is what is asked for.
        with_position = is_eval or rng.random() < 0.6
        with_size = rng.random() < 0.5
        caption = " and ".join(_shape_caption(s, with_size, with_position) for s in specs)
    elif is_eval:
        caption = _shape_caption(first, with_size=True, with_position=True)
    else:
        u = rng.random()
        with_size = u < 0.5 or 0.7 <= u < 0.85
        with_position = u < 0.7
        caption = _shape_caption(first, with_size, with_position)

    second_spec = specs[1] if two else None
    labels: dict[str, Any] = {
        "shape": first.shape,
        "color": first.color,
        "size": first.size,
        "position": first.position,
        "n_shapes": len(specs),
        "shape2": second_spec.shape if second_spec else "",
        "color2": second_spec.color if second_spec else "",
        "size2": second_spec.size if second_spec else "",
        "position2": second_spec.position if second_spec else "",
    }
    return image, caption, labels


def _split_id(split: str) -> int:
    if split not in SPLITS:
        raise InputError(f"unknown shapes split {split!r}; use one of: {', '.join(SPLITS)}")
    return SPLITS[split]


def generate(
    split: str, n: int, seed: int = 0, start: int = 0
) -> tuple[np.ndarray, list[str], dict[str, list[Any]]]:
    """Generate ``n`` samples as arrays (the fast path for training).

    Args:
        split: ``train``, ``calibration`` or ``eval``.
        n: Number of samples.
        seed: Dataset seed.
        start: Index of the first sample.

    Returns:
        ``(images uint8 [n, 32, 32, 3], captions, labels column -> values)``.
    """
    import numpy as np

    _split_id(split)
    images = np.empty((n, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    captions: list[str] = []
    labels: dict[str, list[Any]] = {k: [] for k in LABEL_COLUMNS}
    for i in range(n):
        images[i], caption, lab = sample(split, start + i, seed)
        captions.append(caption)
        for k in LABEL_COLUMNS:
            labels[k].append(lab[k])
    return images, captions, labels


def load_split(split: str, limit: int | None = None, seed: int = 0) -> datasets.Dataset:
    """Generate a split as a ``datasets.Dataset``.

    Args:
        split: ``train`` (20000), ``calibration`` (512) or ``eval`` (1024 samples).
        limit: Generate only the first ``limit`` samples (a larger one gives the whole split,
            as a file source gives all its lines).
        seed: Dataset seed; the same seed gives byte-identical images.

    Returns:
        Columns ``image`` (``datasets.Image``), ``caption`` and the labels of
        :data:`LABEL_COLUMNS` (``shape``/``color``/``size``/``position`` of the first shape).

    Raises:
        InputError: Unknown split or negative limit.
    """
    import datasets

    _split_id(split)
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    # Bounded by the split's size: the generator would make any number of samples, and a
    # limit is "at most", not "this many" (10**11 asked numpy for 279 TiB).
    n = DEFAULT_SIZES[split] if limit is None else min(limit, DEFAULT_SIZES[split])
    images, captions, labels = generate(split, n, seed)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "caption": datasets.Value("string"),
            **{k: datasets.Value("int32" if k == "n_shapes" else "string") for k in LABEL_COLUMNS},
        }
    )
    data = {"image": list(images), "caption": captions, **labels}
    return datasets.Dataset.from_dict(data, features=features)


def save_split(split: str, path: str | Path, limit: int | None = None, seed: int = 0) -> Path:
    """Generate a split and write it with ``Dataset.save_to_disk``.

    Args:
        split: ``train``, ``calibration`` or ``eval``.
        path: Output directory (``datasets.load_from_disk`` reads it back).
        limit: Generate only the first ``limit`` samples.
        seed: Dataset seed.

    Returns:
        The output directory.
    """
    out = Path(path)
    load_split(split, limit=limit, seed=seed).save_to_disk(str(out))
    logger.info("wrote shapes split %s to %s", split, out)
    return out


def parse_caption(caption: str) -> list[dict[str, str]]:
    """Parse a generated caption into one dict per named shape.

    Args:
        caption: A caption as :func:`sample` writes it.

    Returns:
        Per shape: ``shape``, ``color`` and, where the caption names them, ``size`` and
        ``position``.

    Raises:
        InputError: The caption is not in the generator's grammar.
    """
    out: list[dict[str, str]] = []
    for part in caption.split(" and "):
        words = part.split()
        if len(words) < 3 or words[0] != "a":
            raise InputError(f"not a shapes caption: {caption!r}")
        desc: dict[str, str] = {}
        rest = words[1:]
        if rest[0] in SIZES:
            desc["size"], rest = rest[0], rest[1:]
        if len(rest) < 2 or rest[0] not in COLORS or rest[1] not in SHAPES:
            raise InputError(f"not a shapes caption: {caption!r}")
        desc["color"], desc["shape"], rest = rest[0], rest[1], rest[2:]
        if rest:
            position = " ".join(rest[2:])
            if rest[:2] != ["at", "the"] or position not in POSITIONS:
                raise InputError(f"not a shapes caption: {caption!r}")
            desc["position"] = position
        out.append(desc)
    return out


def caption_fits(caption: str, labels: dict[str, Any]) -> bool:
    """Whether ``caption`` is a true description of the image with ``labels``.

    Used to keep retrieval distractors honest: a caption that names the same shapes (in any
    order, with or without sizes/positions) is not a wrong answer.
    """
    shapes = [{k: labels[k] for k in ("shape", "color", "size", "position")}]
    if int(labels.get("n_shapes", 1)) == 2:
        shapes.append({k: labels[k + "2"] for k in ("shape", "color", "size", "position")})
    described = parse_caption(caption)
    if len(described) != len(shapes):
        return False
    remaining = list(shapes)
    for desc in described:
        match = next((s for s in remaining if all(s[k] == v for k, v in desc.items())), None)
        if match is None:
            return False
        remaining.remove(match)
    return True
