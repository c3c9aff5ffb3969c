"""The shapes video clips: what each caption says is what the frames show; splits are disjoint."""

from __future__ import annotations

import numpy as np
import pytest

from opsnn_quant import zoo
from opsnn_quant.errors import InputError
from opsnn_quant.zoo import shapes_data as sd
from opsnn_quant.zoo import shapes_video as sv


def _foreground(frames: np.ndarray) -> np.ndarray:
    # the shape's pixels: far from the frame's (static) background, whose mode is its median
    bg = np.median(frames[0].reshape(-1, 3), axis=0)
    return np.abs(frames.astype(int) - bg).sum(axis=-1) > 90


def _centroid_and_area(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mask = _foreground(frames)
    rows, cols = np.indices(mask.shape[1:])
    area = mask.sum(axis=(1, 2))
    centroid = np.stack(
        [(mask * rows).sum(axis=(1, 2)) / area, (mask * cols).sum(axis=(1, 2)) / area], 1
    )
    return centroid, area


def test_caption_grammar_covers_every_attribute_and_halves_disjointly():
    specs = sv.all_specs()
    assert len(specs) == 2 * 6 * 4 * 6 * 2 == 576
    held = [s for s in specs if s.held_out]
    assert len(held) == 288
    train = [s for s in specs if not s.held_out]
    # every (colour, shape, motion) triple and every attribute value is trained on
    assert {(s.color, s.shape, s.motion) for s in train} == {
        (c, s, m) for c in sd.COLORS for s in sd.SHAPES for m in sv.MOTIONS
    }
    assert sv.ClipSpec("small", "red", "circle", "left", "slowly").held_out is False  # 0+0+0+0+0
    assert sv.ClipSpec("small", "red", "circle", "left", "quickly").held_out is True  # 0+...+1
    for spec in specs:
        assert sv.parse_caption(spec.caption) == spec
    assert sv.ClipSpec("large", "blue", "star", "growing", "slowly").caption == (
        "a large blue star growing slowly"
    )


@pytest.mark.parametrize(
    "bad", ["a red circle moving left", "a small red circle moving sideways slowly", ""]
)
def test_parse_caption_refuses_other_text(bad):
    with pytest.raises(InputError, match="not a shapes-video caption"):
        sv.parse_caption(bad)


def test_eval_split_is_every_held_out_caption_once_and_never_trained():
    _, captions, labels = sv.generate("eval", 288)
    assert len(set(captions)) == 288
    assert all(sv.parse_caption(c).held_out for c in captions)
    # training and calibration clips draw from the other half only (so never an eval caption)
    _, train, _ = sv.generate("train", 300)
    _, calib, _ = sv.generate("calibration", 100)
    assert not any(sv.parse_caption(c).held_out for c in train + calib)
    assert not set(captions) & (set(train) | set(calib))
    assert labels["motion"][0] == sv.parse_caption(captions[0]).motion
    with pytest.raises(InputError, match="288 clips"):
        sv.sample("eval", 288)


def test_clips_are_pure_functions_of_seed_split_index():
    a, ca, _ = sv.generate("train", 6, seed=3, start=10)
    b, cb, _ = sv.generate("train", 2, seed=3, start=14)
    assert np.array_equal(a[4:], b) and ca[4:] == cb
    c, _, _ = sv.generate("train", 6, seed=4, start=10)
    assert not np.array_equal(a, c)
    assert a.shape == (6, sv.FRAMES, 32, 32, 3) and a.dtype == np.uint8


def test_frames_show_the_captioned_motion_at_the_captioned_speed():
    clips, captions, labels = sv.generate("train", 96, seed=1)
    for frames, caption, motion, speed in zip(
        clips, captions, labels["motion"], labels["speed"], strict=True
    ):
        centroid, area = _centroid_and_area(frames)
        assert (area > 0).all(), caption  # the shape never leaves the frame
        shift = centroid[-1] - centroid[0]
        if motion in sv.TRANSLATIONS:
            d_row, d_col = sv.TRANSLATIONS[motion]
            travel = {"slowly": 6.0, "quickly": 12.0}[speed]  # 0.75 or 1.5 px per frame x 8
            # the centroid of a rasterised shape moves with it to within a pixel
            assert shift == pytest.approx([d_row * travel, d_col * travel], abs=1.0), caption
            assert area.max() - area.min() <= 0.25 * area.mean(), caption
        else:
            grow = area[-1] / area[0]
            assert (grow > 1.5) if motion == "growing" else (grow < 1 / 1.5), caption
            assert np.abs(shift).max() <= 1.0, caption
        # the background is the same in every frame where the shape never is
        never = ~_foreground(frames).any(axis=0)
        assert (frames[:, never] == frames[0, never]).all()


def test_zoo_dataset_and_records_agree():
    records = zoo.records("shapes-video", "eval", limit=3)
    ds = zoo.dataset("shapes-video", "eval", limit=3)
    clips, captions, labels = sv.generate("eval", 3)
    for i, rec in enumerate(records):
        assert rec["prompt"] == captions[i] == ds[i]["prompt"]
        assert np.array_equal(rec["video"], clips[i])
        assert np.array_equal(np.asarray(ds[i]["video"], dtype=np.uint8), clips[i])
        assert rec["motion"] == labels["motion"][i] == ds[i]["motion"]
    assert "shapes-video" in zoo.datasets()
    with pytest.raises(InputError, match="unknown shapes-video split"):
        zoo.records("shapes-video", "test")
