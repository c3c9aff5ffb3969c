"""The motion detector of the t2v motion criterion on hand-built frames: a square moving 2 px
per frame, a growing disk, a static one; centroids and areas computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opsnn_quant.errors import ShapeError
from opsnn_quant.evaluation.motion import (
    FOREGROUND_LEVEL,
    border_colour,
    classify,
    detect_motion,
    foreground,
    track,
)

SIDE = 32
BACKGROUND = (20, 24, 28)
RED = (220, 40, 40)


def blank(frames: int = 9, side: int = SIDE) -> np.ndarray:
    return np.broadcast_to(np.array(BACKGROUND, np.uint8), (frames, side, side, 3)).copy()


def moving_square(dx: int, dy: int, *, frames: int = 9, start=(20, 12), half: int = 3):
    """A 7×7 red square whose centre starts at ``start`` (x, y) and moves (dx, dy) per frame."""
    video = blank(frames)
    for t in range(frames):
        x, y = start[0] + dx * t, start[1] + dy * t
        video[t, max(y - half, 0) : y + half + 1, max(x - half, 0) : x + half + 1] = RED
    return video


def disk(radii, centre=(16, 16)) -> np.ndarray:
    video = blank(len(radii))
    ys, xs = np.mgrid[0:SIDE, 0:SIDE]
    for t, r in enumerate(radii):
        video[t][(xs - centre[0]) ** 2 + (ys - centre[1]) ** 2 <= r * r] = RED
    return video


def test_a_square_moving_left_is_left_and_reversed_right():
    video = moving_square(-2, 0)  # centre x 20, 18, ..., 4
    path = track(video)
    assert path.areas.tolist() == [49] * 9
    # the centroid of a 7×7 square is its centre pixel
    assert path.centroids[:, 0].tolist() == [20.0 - 2 * t for t in range(9)]
    assert path.centroids[:, 1].tolist() == [12.0] * 9
    assert detect_motion(video) == "left"
    assert detect_motion(video[::-1]) == "right"


def test_vertical_motion_reads_down_the_rows():
    # y grows downwards: a shape whose row index grows moves down
    assert detect_motion(moving_square(0, 2, start=(12, 6))) == "down"
    assert detect_motion(moving_square(0, -2, start=(12, 24))) == "up"
    # the dominant axis decides a diagonal
    assert detect_motion(moving_square(-2, 1, start=(24, 8))) == "left"


def test_a_growing_disk_grows_a_shrinking_one_shrinks_a_static_one_stays():
    growing = disk(range(3, 12))
    path = track(growing)
    assert path.areas[0] == 29  # the lattice points within radius 3: 1 + 4 + 8 + 4 + 8 + 4
    assert path.centroids[0].tolist() == [16.0, 16.0]  # symmetric about its centre
    assert detect_motion(growing) == "growing"
    assert detect_motion(growing[::-1]) == "shrinking"
    assert detect_motion(disk([5] * 9)) is None
    # one pixel of jitter is below MIN_SHIFT (5 % of 32 px = 1.6 px) and keeps the area
    jitter = np.concatenate([disk([5] * 5, centre=(16, 16)), disk([5] * 4, centre=(17, 16))])
    assert detect_motion(jitter) is None


def test_no_object_no_motion():
    empty = blank(9)
    path = track(empty)
    assert path.areas.tolist() == [0] * 9 and bool(np.isnan(path.centroids).all())
    assert detect_motion(empty) is None
    # only one frame shows the object: nothing to compare it with
    once = blank(9)
    once[4] = moving_square(0, 0, frames=1)[0]
    assert detect_motion(once) is None
    # frames without the object at either end: the first and last frames that show it count
    partial = moving_square(2, 0, start=(6, 16))
    partial[0] = partial[-1] = BACKGROUND
    assert detect_motion(partial) == "right"


def test_a_shape_leaving_through_the_edge_still_moves():
    # the square is cut by the left edge in the last frames: its area falls below 1/1.3 of
    # the first frame's, but its centroid moved 14 px left: translation is tested first
    video = moving_square(-2, 0, start=(14, 16))
    path = track(video)
    assert path.areas[-1] < path.areas[0] / 1.3
    assert detect_motion(video) == "left"


def test_background_and_foreground_by_hand():
    frame = np.full((4, 5, 3), 10, np.uint8)
    frame[0, 0] = (200, 10, 10)  # one border pixel off: the median ignores it
    frame[1:3, 1:3] = (10, 10, 10 + FOREGROUND_LEVEL + 1)  # one channel just past the level
    frame[2, 3] = (10, 10 + FOREGROUND_LEVEL, 10)  # at the level: background
    assert border_colour(frame).tolist() == [10.0, 10.0, 10.0]
    mask = foreground(frame)
    assert mask.sum() == 5 and bool(mask[1:3, 1:3].all()) and bool(mask[0, 0])
    assert not mask[2, 3]
    path = track(frame[None].repeat(2, axis=0))
    assert path.areas.tolist() == [5, 5]
    # (0, 0) and the 2×2 block at x, y in {1, 2}: x mean (0 + 1 + 2 + 1 + 2) / 5
    assert path.centroids[0].tolist() == pytest.approx([6 / 5, 6 / 5])
    assert classify(path) is None


def test_not_a_video_is_refused():
    with pytest.raises(ShapeError, match=r"expected video frames \[F, H, W, 3\]"):
        track(np.zeros((8, 8, 3), np.uint8))
    assert math.isnan(track(blank(2)).centroids[0, 0])
