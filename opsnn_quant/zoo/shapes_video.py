"""Generated shapes videos: 9 frames of 32x32 RGB, one coloured shape in motion, with captions.

A clip shows one shape of the shapes world (:mod:`.shapes_data`: same palette, outlines and
background) moving left, right, up or down, growing or shrinking, slowly or quickly over a
static background. The caption fixes every attribute a judge can check:
``"a small red circle moving left quickly"``, ``"a large blue star growing slowly"``.

Every clip is a pure function of ``(seed, split, index)`` (a fresh ``numpy.random.Generator``
per clip), so a prefix of a split does not depend on how many clips are drawn.

Held-out captions: the 576 captions (2 sizes x 6 colours x 4 shapes x 6 motions x 2 speeds) fall
in two halves by a parity rule on their attribute indices, so that every colour, shape, motion,
size and speed, and every (colour, shape, motion) triple, appears in the training half; the
``eval`` split is the other half, each of its 288 captions once (in a fixed shuffled order),
none of them a training or calibration caption.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import InputError
from opsnn_quant.zoo.shapes_data import COLORS, IMAGE_SIZE, SHAPES, SIZES, background, paint
from opsnn_quant.zoo.shapes_data import jittered_color as _jittered_color

if TYPE_CHECKING:
    import datasets
    import numpy as np

logger = logging.getLogger(__name__)

FRAMES = 9
# caption words of each motion; the label is the first key
MOTIONS: dict[str, str] = {
    "left": "moving left",
    "right": "moving right",
    "up": "moving up",
    "down": "moving down",
    "growing": "growing",
    "shrinking": "shrinking",
}
TRANSLATIONS: dict[str, tuple[int, int]] = {  # (d_row, d_col) per unit of travel
    "left": (0, -1),
    "right": (0, 1),
    "up": (-1, 0),
    "down": (1, 0),
}
SPEEDS: tuple[str, ...] = ("slowly", "quickly")
# pixels per frame of a moving shape, and radius change per frame of a growing one
_STEP: dict[str, float] = {"slowly": 0.75, "quickly": 1.5}
_GROWTH: dict[str, float] = {"slowly": 0.25, "quickly": 0.5}
# radius of a moving shape, and the radius a growing shape starts at / a shrinking one ends at
_RADIUS: dict[str, tuple[float, float]] = {"small": (4.0, 4.6), "large": (5.6, 6.2)}
_GROWTH_START: dict[str, float] = {"small": 3.0, "large": 4.0}
SPLITS: dict[str, int] = {"train": 10, "calibration": 11, "eval": 12}
DEFAULT_SIZES: dict[str, int] = {"train": 20000, "calibration": 256, "eval": 288}
LABEL_COLUMNS: tuple[str, ...] = ("shape", "color", "size", "motion", "speed")


@dataclass(frozen=True)
class ClipSpec:
    """What a caption says."""

    size: str
    color: str
    shape: str
    motion: str
    speed: str

    @property
    def caption(self) -> str:
        """``"a <size> <colour> <shape> <motion words> <speed>"``."""
        return f"a {self.size} {self.color} {self.shape} {MOTIONS[self.motion]} {self.speed}"

    @property
    def held_out(self) -> bool:
        """In the eval half: the parity of the attribute indices' sum (a Latin-square-like
        rule: fixing any four attributes, each value of the fifth is in exactly one half)."""
        k = (
            SIZES.index(self.size)
            + list(COLORS).index(self.color)
            + SHAPES.index(self.shape)
            + list(MOTIONS).index(self.motion)
            + SPEEDS.index(self.speed)
        )
        return k % 2 == 1


def all_specs() -> list[ClipSpec]:
    """Every caption's spec, in attribute order."""
    return [
        ClipSpec(z, c, s, m, v)
        for z in SIZES
        for c in COLORS
        for s in SHAPES
        for m in MOTIONS
        for v in SPEEDS
    ]


def vocabulary() -> list[str]:
    """Every word a caption can contain, in a fixed order."""
    words = ["a", *SIZES, *COLORS, *SHAPES]
    for phrase in MOTIONS.values():
        words += [w for w in phrase.split() if w not in words]
    return words + list(SPEEDS)


def _eval_order(seed: int) -> list[ClipSpec]:
    import numpy as np

    held = [s for s in all_specs() if s.held_out]
    order = np.random.default_rng([seed, SPLITS["eval"], 999]).permutation(len(held))
    return [held[int(i)] for i in order]


def _train_spec(rng: np.random.Generator) -> ClipSpec:
    train = [s for s in all_specs() if not s.held_out]
    return train[int(rng.integers(len(train)))]


def render(spec: ClipSpec, rng: np.random.Generator) -> np.ndarray:
    """The clip of ``spec``: uint8 ``(FRAMES, 32, 32, 3)``, its start drawn from ``rng`` so that
    the whole motion stays inside the frame."""
    import numpy as np

    bg = background(rng)
    rgb = _jittered_color(spec.color, rng)
    frames = np.empty((FRAMES, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    t = np.arange(FRAMES, dtype=np.float64)
    if spec.motion in TRANSLATIONS:
        radius = rng.uniform(*_RADIUS[spec.size])
        travel = _STEP[spec.speed] * (FRAMES - 1)
        d_row, d_col = TRANSLATIONS[spec.motion]
        margin = radius * 1.3 + 1.0  # the star's and triangle's points reach 1.2-1.3 r
        # start so that start + travel * direction stays within [margin, 32 - margin]
        lo, hi = margin, IMAGE_SIZE - margin
        row0 = _start(rng, lo, hi, d_row * travel)
        col0 = _start(rng, lo, hi, d_col * travel)
        rows = row0 + d_row * _STEP[spec.speed] * t
        cols = col0 + d_col * _STEP[spec.speed] * t
        radii = np.full(FRAMES, radius)
    else:
        small = _GROWTH_START[spec.size]
        change = _GROWTH[spec.speed] * t
        radii = small + (change if spec.motion == "growing" else change[::-1])
        margin = float(radii.max()) * 1.3 + 1.0  # the star's and triangle's points reach 1.2-1.3 r
        rows = np.full(FRAMES, rng.uniform(margin, IMAGE_SIZE - margin))
        cols = np.full(FRAMES, rng.uniform(margin, IMAGE_SIZE - margin))
    for f in range(FRAMES):
        frames[f] = bg
        paint(frames[f], spec.shape, float(rows[f]), float(cols[f]), float(radii[f]), rgb)
    return frames


def _start(rng: np.random.Generator, lo: float, hi: float, travel: float) -> float:
    # a start from which start + travel stays in [lo, hi] (travel 0: anywhere in it)
    return float(rng.uniform(lo - min(travel, 0.0), hi - max(travel, 0.0)))


def sample(split: str, index: int, seed: int = 0) -> tuple[np.ndarray, str, dict[str, Any]]:
    """One clip.

    Args:
        split: ``train``, ``calibration`` or ``eval``.
        index: Clip index inside the split (``eval``: below 288, each caption once).
        seed: Dataset seed.

    Returns:
        ``(frames uint8 [9, 32, 32, 3], caption, labels)``; labels hold :data:`LABEL_COLUMNS`.
    """
    import numpy as np

    if split not in SPLITS:
        raise InputError(f"unknown shapes-video split {split!r}; use one of: {', '.join(SPLITS)}")
    rng = np.random.default_rng([seed, SPLITS[split], index])
    if split == "eval":
        order = _eval_order(seed)
        if not 0 <= index < len(order):
            raise InputError(f"shapes-video eval has {len(order)} clips, asked for #{index}")
        spec = order[index]
    else:
        spec = _train_spec(rng)
    frames = render(spec, rng)
    labels = {k: getattr(spec, k) for k in LABEL_COLUMNS}
    return frames, spec.caption, labels


def any_caption_clips(n: int, seed: int = 0) -> tuple[np.ndarray, dict[str, list[Any]]]:
    """``n`` clips of captions drawn from all 576 (both halves), each from its own stream (not a
    split: the clips of a feature encoder, which must not learn the halves' parity rule as a
    shortcut from four attributes to the fifth). Returns ``(clips, column -> labels)``."""
    import numpy as np

    specs = all_specs()
    clips = np.empty((n, FRAMES, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    labels: dict[str, list[Any]] = {k: [] for k in LABEL_COLUMNS}
    for i in range(n):
        rng = np.random.default_rng([seed, _ANY_STREAM, i])
        spec = specs[int(rng.integers(len(specs)))]
        clips[i] = render(spec, rng)
        for k in LABEL_COLUMNS:
            labels[k].append(getattr(spec, k))
    return clips, labels


_ANY_STREAM = 13  # beside SPLITS' ids


def generate(
    split: str, n: int, seed: int = 0, start: int = 0
) -> tuple[np.ndarray, list[str], dict[str, list[Any]]]:
    """``n`` clips as arrays: ``(frames uint8 [n, 9, 32, 32, 3], captions, column -> labels)``."""
    import numpy as np

    clips = np.empty((n, FRAMES, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    captions: list[str] = []
    labels: dict[str, list[Any]] = {k: [] for k in LABEL_COLUMNS}
    for i in range(n):
        clips[i], caption, lab = sample(split, start + i, seed)
        captions.append(caption)
        for k in LABEL_COLUMNS:
            labels[k].append(lab[k])
    return clips, captions, labels


def load_split(split: str, limit: int | None = None, seed: int = 0) -> datasets.Dataset:
    """A split as a ``datasets.Dataset``: columns ``prompt`` (the caption), ``video`` (the
    clip as nested uint8 lists, ``[9][32][32][3]``) and :data:`LABEL_COLUMNS`.

    Args:
        split: ``train`` (20000), ``calibration`` (256) or ``eval`` (288 clips).
        limit: At most this many clips (the split's size bounds it).
        seed: Dataset seed; the same seed gives byte-identical clips.

    Raises:
        InputError: Unknown split or negative limit.
    """
    import datasets

    if split not in SPLITS:
        raise InputError(f"unknown shapes-video split {split!r}; use one of: {', '.join(SPLITS)}")
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    n = DEFAULT_SIZES[split] if limit is None else min(limit, DEFAULT_SIZES[split])
    clips, captions, labels = generate(split, n, seed)
    features = datasets.Features(
        {
            "prompt": datasets.Value("string"),
            "video": datasets.Array4D(shape=(FRAMES, IMAGE_SIZE, IMAGE_SIZE, 3), dtype="uint8"),
            **{k: datasets.Value("string") for k in LABEL_COLUMNS},
        }
    )
    return datasets.Dataset.from_dict(
        {"prompt": captions, "video": list(clips), **labels}, features=features
    )


def parse_caption(caption: str) -> ClipSpec:
    """The spec a caption of :func:`sample` states.

    Raises:
        InputError: Not in the generator's grammar.
    """
    words = caption.split()
    by_phrase = {phrase: m for m, phrase in MOTIONS.items()}
    if len(words) < 6 or words[0] != "a" or words[-1] not in SPEEDS:
        raise InputError(f"not a shapes-video caption: {caption!r}")
    motion = by_phrase.get(" ".join(words[4:-1]))
    size, color, shape = words[1:4]
    if motion is None or size not in SIZES or color not in COLORS or shape not in SHAPES:
        raise InputError(f"not a shapes-video caption: {caption!r}")
    return ClipSpec(size, color, shape, motion, words[-1])


def split_records(split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """A split as records ``prompt``, ``video`` (uint8 ``[9, 32, 32, 3]``) and the labels:
    the rows of :func:`load_split` without building a ``datasets.Dataset``.

    Args, Raises: as :func:`load_split`.
    """
    if split not in SPLITS:
        raise InputError(f"unknown shapes-video split {split!r}; use one of: {', '.join(SPLITS)}")
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    n = DEFAULT_SIZES[split] if limit is None else min(limit, DEFAULT_SIZES[split])
    clips, captions, labels = generate(split, n, seed)
    return [
        {"prompt": captions[i], "video": clips[i], **{k: labels[k][i] for k in LABEL_COLUMNS}}
        for i in range(n)
    ]
