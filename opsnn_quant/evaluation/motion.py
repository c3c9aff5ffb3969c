"""Which way the one moving object of a video moves: the detector the t2v motion criterion
reads (:mod:`.t2v`: ``motion_accuracy_delta``).

A video is ``uint8`` frames ``[F, H, W, 3]`` of one object over a plain background (the
shapes-video demo's: a coloured shape over a dark, slightly noisy one). Per frame:

1. the background colour: the per-channel median of the frame's border pixels (one pixel
   wide); the object covers less than half of the border, so the median is the background's;
2. the foreground: the pixels whose largest channel distance from that colour exceeds
   :data:`FOREGROUND_LEVEL` grey levels (background noise stays well under it, a shape's
   colour well above);
3. its centroid (``x`` to the right, ``y`` down, in pixels) and its area (pixels); a frame
   with fewer than :data:`MIN_AREA` foreground pixels shows no object.

The motion (:func:`classify`), from the first to the last frame that show the object:

* the centroid's displacement along the axis it moved most: at least :data:`MIN_SHIFT` of
  the frame's side along that axis is ``left`` / ``right`` / ``up`` / ``down``;
* otherwise the area ratio last / first: at least :data:`GROWTH` is ``growing``, at most
  ``1 / GROWTH`` is ``shrinking``;
* otherwise None: no clear motion (a static object, or fewer than two frames that show one).

Translation is tested first: a shape that leaves through the frame's edge loses area while it
moves, and a growing shape's centroid stays where it is. Pure numpy; deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from opsnn_quant.errors import ShapeError

Motion = Literal["left", "right", "up", "down", "growing", "shrinking"]
MOTIONS: tuple[Motion, ...] = get_args(Motion)

# A pixel is the object's when one channel is this many grey levels from the background's
# colour: far above a dark background's noise (a few levels), far below a shape's contrast.
FOREGROUND_LEVEL = 40
# Fewer foreground pixels than this: no object in the frame (a few stray noisy pixels).
MIN_AREA = 3
# A translation: the centroid moved at least this share of the frame's side along the axis
# (1.6 px on a 32-px frame); less is jitter of the mask's edge.
MIN_SHIFT = 0.05
# Growing / shrinking: the area changed by at least this factor (30 %).
GROWTH = 1.3


@dataclass(frozen=True)
class Track:
    """The object's path through a video.

    Attributes:
        centroids: ``[F, 2]`` (x, y) per frame, in pixels; NaN where the frame shows no object.
        areas: ``[F]`` foreground pixels per frame (0 where it shows no object).
        size: the frame's (height, width).
    """

    centroids: np.ndarray
    areas: np.ndarray
    size: tuple[int, int]


def _frames(video: np.ndarray) -> np.ndarray:
    arr = np.asarray(video)
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ShapeError(f"expected video frames [F, H, W, 3], got shape {arr.shape}")
    return arr


def border_colour(frame: np.ndarray) -> np.ndarray:
    """The background colour of an ``[H, W, 3]`` frame: the per-channel median of its border
    pixels (one pixel wide)."""
    border = np.concatenate([frame[0], frame[-1], frame[1:-1, 0], frame[1:-1, -1]])
    return np.median(border.astype(np.float64), axis=0)


def foreground(frame: np.ndarray, level: float = FOREGROUND_LEVEL) -> np.ndarray:
    """``[H, W]`` mask of the pixels with a channel more than ``level`` grey levels from the
    frame's background colour (:func:`border_colour`)."""
    distance = np.abs(frame.astype(np.float64) - border_colour(frame))
    return np.asarray(distance.max(axis=-1) > level)


def track(video: np.ndarray) -> Track:
    """The centroid and area of the foreground (:func:`foreground`) in each frame of a video
    ``[F, H, W, 3]``.

    Raises:
        ShapeError: not a stack of RGB frames.
    """
    frames = _frames(video)
    n, h, w = frames.shape[:3]
    centroids = np.full((n, 2), np.nan)
    areas = np.zeros(n, dtype=np.int64)
    ys, xs = np.mgrid[0:h, 0:w]
    for t in range(n):
        mask = foreground(frames[t])
        area = int(mask.sum())
        if area < MIN_AREA:
            continue
        areas[t] = area
        centroids[t] = (xs[mask].mean(), ys[mask].mean())
    return Track(centroids, areas, (h, w))


def classify(path: Track) -> Motion | None:
    """The motion of a :class:`Track` (the rules in the module's docstring); None: no clear
    motion."""
    seen = np.flatnonzero(path.areas > 0)
    if seen.size < 2:
        return None
    first, last = seen[0], seen[-1]
    dx, dy = path.centroids[last] - path.centroids[first]
    h, w = path.size
    if abs(dx) >= abs(dy):
        if abs(dx) >= MIN_SHIFT * w:
            return "right" if dx > 0 else "left"
    elif abs(dy) >= MIN_SHIFT * h:
        return "down" if dy > 0 else "up"  # image rows grow downwards
    ratio = path.areas[last] / path.areas[first]
    if ratio >= GROWTH:
        return "growing"
    if ratio <= 1.0 / GROWTH:
        return "shrinking"
    return None


def detect_motion(video: np.ndarray) -> Motion | None:
    """The motion of the object in a video ``[F, H, W, 3]`` (:func:`track`, then
    :func:`classify`); None: no clear motion.

    Raises:
        ShapeError: not a stack of RGB frames.
    """
    return classify(track(video))
