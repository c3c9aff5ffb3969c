"""The t2v task on synthetic videos, through the real metric table and criterion judgement:
the float itself passes everything, its frames shuffled in time or played backwards fail the
temporal criteria (a per-frame CLIP score does not move), a small alternating flicker fails
the flicker bound at a per-frame PSNR that passes; flicker by hand on a 2-frame video; a t2v
suite's checks and refusals; the report's frame strips."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from opsnn_quant.errors import ConfigError, InputError, ShapeError
from opsnn_quant.evaluation.clip_score import ClipScorer
from opsnn_quant.evaluation.evaluate import QualityInputs
from opsnn_quant.evaluation.fid import ClipImageFeatures
from opsnn_quant.evaluation.intervals import judge
from opsnn_quant.evaluation.motion import detect_motion
from opsnn_quant.evaluation.registry import metric, metrics, records_problem, task
from opsnn_quant.evaluation.render import write_report
from opsnn_quant.evaluation.runner import build_report, verdict
from opsnn_quant.evaluation.suite import load_suite, parse_suite
from opsnn_quant.evaluation.t2v import (
    FRAME_PSNR_CAP_DB,
    VideoClip,
    t2v_quality,
    temporal_change,
    temporal_psnr,
    video_pair,
)
from opsnn_quant.evaluation.tasks import TaskInputs

SIDE, FRAMES, STEP = 32, 9, 2
MOTIONS = ("left", "right", "up", "down", "growing", "shrinking")
COLOURS = ((220, 50, 50), (50, 200, 60), (60, 90, 230), (230, 210, 50))
# bounds a team might set: the flicker candidate's per-frame PSNR (38.6 dB) passes 30 dB
THRESHOLDS = {
    "video_psnr_min": 30.0, "video_ssim_min": 0.9, "flicker_delta_max": 1.0,
    "temporal_psnr_min": 25.0, "motion_accuracy_delta_min": -0.05,
}  # fmt: skip
TEMPORAL = ("flicker_delta_max", "temporal_psnr_min")


def synthetic_video(i: int, motion: str) -> np.ndarray:
    """Prompt ``i``'s float video: a coloured 7×7 square moving 2 px per frame (or a disk
    growing or shrinking by 1 px of radius per frame) from a seeded start, over a dark
    background with static noise (±8 grey levels) and a little noise per frame (±2)."""
    rng = np.random.default_rng(1000 + i)
    background = 30 + rng.integers(-8, 9, (SIDE, SIDE, 3))
    colour = np.array(COLOURS[i % len(COLOURS)])
    ys, xs = np.mgrid[0:SIDE, 0:SIDE]
    travel, half = STEP * (FRAMES - 1), 3
    # a start far enough from the edge it moves towards; a disk near the middle
    back = motion in ("left", "up")
    low, high = (
        (half + 1 + travel, SIDE - half - 1) if back else (half + 1, SIDE - half - 1 - travel)
    )
    if motion in ("growing", "shrinking"):
        low, high = 13, 19
    cx, cy = rng.integers(low, high, 2)
    dx, dy = {"left": (-STEP, 0), "right": (STEP, 0), "up": (0, -STEP), "down": (0, STEP)}.get(
        motion, (0, 0)
    )  # fmt: skip
    frames = []
    for t in range(FRAMES):
        frame = background + rng.integers(-2, 3, (SIDE, SIDE, 3))
        if motion in ("growing", "shrinking"):
            r = 3 + (t if motion == "growing" else FRAMES - 1 - t)
            frame[(xs - cx) ** 2 + (ys - cy) ** 2 <= r * r] = colour
        else:
            x, y = cx + dx * t, cy + dy * t
            frame[(abs(xs - x) <= half) & (abs(ys - y) <= half)] = colour
        frames.append(frame)
    return np.stack(frames).astype(np.uint8)  # 14..255: no clipping


def synthetic(n: int) -> tuple[list[np.ndarray], list[str], list[str]]:
    """``n`` float videos (each motion in turn), their motion labels and prompts."""
    labels = [MOTIONS[i % len(MOTIONS)] for i in range(n)]
    prompts = [f"a shape moving {m} #{i}" for i, m in enumerate(labels)]
    return [synthetic_video(i, m) for i, m in enumerate(labels)], labels, prompts


def flickered(video: np.ndarray, level: int = 3) -> np.ndarray:
    """Even frames ``level`` grey levels darker, odd ones ``level`` brighter."""
    sign = np.where(np.arange(video.shape[0]) % 2, level, -level)[:, None, None, None]
    return (video.astype(np.int16) + sign).astype(np.uint8)  # the videos stay in 14..255


def shuffled(video: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The same frames in another order, no frame in its own place."""
    while True:
        order = rng.permutation(video.shape[0])
        if (order != np.arange(video.shape[0])).all():
            return video[order]


def t2v_suite(**thresholds: float):
    return parse_suite({
        "name": "synthetic-t2v", "task": "t2v", "seeds": [0],
        "data": {"dataset": "shapes-video", "samples": 4},
        "metrics": {"fid_features": None, "clip": "tiny", "thresholds": thresholds},
    })  # fmt: skip


def judged(base, cand, labels, prompts, clip=None, **thresholds):
    """The criteria of a suite with ``thresholds`` (default :data:`THRESHOLDS`) on the pair,
    judged as the report judges them (value + 95 % interval), by bound; and the figures."""
    q = t2v_quality(base, cand, prompts, motions=labels, clip=clip, confidence=0.95,
                    prompts_count=len(base))  # fmt: skip
    suite = t2v_suite(**(thresholds or THRESHOLDS))
    rows = verdict(suite, q.measured, intervals=q.intervals, labels=q.labels, samples=q.samples)
    return {c.key: c for c in rows}, q


@pytest.fixture(scope="module")
def videos():
    return synthetic(48)


def test_the_synthetic_float_videos_move_as_their_labels_say(videos):
    base, labels, _ = videos
    assert [detect_motion(v) for v in base] == labels


def test_the_float_itself_passes_everything(videos):
    base, labels, prompts = videos
    rows, q = judged(base, [v.copy() for v in base], labels, prompts)
    assert {k: c.status for k, c in rows.items()} == dict.fromkeys(THRESHOLDS, "PASS")
    assert q.measured["video_psnr_median_db"] == math.inf  # identical: as an identical image
    assert q.measured["temporal_psnr_median_db"] == math.inf
    assert (q.measured["video_ssim_mean"], q.measured["flicker_delta"]) == (1.0, 0.0)
    assert q.measured["motion_accuracy_delta"] == 0.0
    flicker = rows["flicker_delta_max"]
    assert (flicker.ci_low, flicker.ci_high, flicker.n) == (0.0, 0.0, 48)
    assert q.samples == 48 and len(q.image_pairs) == 48 and q.image_pairs[0].frames == FRAMES


def test_frames_shuffled_in_time_fail_the_temporal_criteria(videos):
    """Every frame is a float frame: only the order is wrong. Both temporal criteria see it;
    flicker: the shape jumps between frames, so more pixels change per step."""
    base, labels, prompts = videos
    rng = np.random.default_rng(7)
    cand = [shuffled(v, rng) for v in base]
    rows, q = judged(base, cand, labels, prompts)
    for key in TEMPORAL:
        assert rows[key].status == "FAIL", rows[key]
    flicker = rows["flicker_delta_max"]
    # the float changes ~4.5 grey levels per step; shuffled, more than twice that
    assert q.measured["temporal_change_baseline"] == pytest.approx(4.51, abs=0.01)
    assert flicker.ci_low > 4.0 and flicker.value == pytest.approx(5.51, abs=0.01)
    assert rows["temporal_psnr_min"].ci_high < 17.0  # far under 25 dB
    assert rows["motion_accuracy_delta_min"].status == "FAIL"


def test_a_per_frame_clip_score_does_not_see_shuffled_frames(tiny_clip):
    """The same shuffle through the suite's CLIP: the CLIP score (each frame's against the
    prompt, averaged over frames) is the float's to rounding, so its criterion passes, while
    the temporal criteria fail."""
    model, processor = tiny_clip
    clip = VideoClip(ClipScorer(model, processor, "tiny"),
                     ClipImageFeatures(model, "tiny", mean=(0.5,) * 3, std=(0.5,) * 3))  # fmt: skip
    base, labels, prompts = synthetic(12)
    rng = np.random.default_rng(7)
    cand = [shuffled(v, rng) for v in base]
    rows, q = judged(base, cand, labels, prompts, clip, clip_score_delta_min=-0.5,
                     clip_temp_delta_min=-0.01, **THRESHOLDS)  # fmt: skip
    assert q.measured["clip_score_delta"] == pytest.approx(0.0, abs=1e-9)
    assert q.measured["clip_score_baseline"] > 0
    assert rows["clip_score_delta_min"].status == "PASS"
    assert [rows[k].status for k in TEMPORAL] == ["FAIL", "FAIL"]
    # CLIP-Temp of the float against itself: exactly no change
    same, _ = judged(base, base, labels, prompts, clip, clip_temp_delta_min=-0.01)
    assert (same["clip_temp_delta_min"].value, same["clip_temp_delta_min"].status) == (0.0, "PASS")
    assert 0 < q.measured["clip_temp_baseline"] <= 1


def test_an_alternating_flicker_fails_flicker_at_a_per_frame_psnr_that_passes(videos):
    """Frames alternately 3 grey levels darker and brighter: every frame is 20 log10(255/3) =
    38.59 dB from the float's (passes 30 dB); every frame step changes by 6 grey levels."""
    base, labels, prompts = videos
    rows, q = judged(base, [flickered(v) for v in base], labels, prompts)
    assert q.measured["video_psnr_median_db"] == pytest.approx(20 * math.log10(255 / 3))
    assert rows["video_psnr_min"].status == "PASS"
    assert rows["video_ssim_min"].status == "PASS"
    # every frame difference is off by exactly 6: its PSNR is 20 log10(255/6) = 32.57 dB
    assert q.measured["temporal_psnr_median_db"] == pytest.approx(20 * math.log10(255 / 6))
    flicker = rows["flicker_delta_max"]
    assert flicker.status == "FAIL"
    # under 6: where the float's step already moved a pixel the same way, |d ± 6| < |d| + 6
    assert 4.3 < flicker.ci_low <= flicker.value <= flicker.ci_high < 4.4
    assert rows["motion_accuracy_delta_min"].status == "PASS"


def test_frames_played_backwards_fail_motion_correctness(videos):
    base, labels, prompts = videos
    rows, q = judged(base, [v[::-1] for v in base], labels, prompts)
    motion = rows["motion_accuracy_delta_min"]
    # every video's motion is found reversed: left -> right, growing -> shrinking
    measured = q.measured
    assert (measured["motion_accuracy_baseline"], measured["motion_accuracy_candidate"]) == (1, 0)
    assert (motion.value, motion.ci_low, motion.ci_high) == (-1.0, -1.0, -1.0)
    assert motion.status == "FAIL"
    # reversal keeps every |frame step|: the flicker figure is blind to it, the
    # frame-difference PSNR is not
    assert rows["flicker_delta_max"].value == 0.0 and rows["flicker_delta_max"].status == "PASS"
    assert rows["temporal_psnr_min"].status == "FAIL"


def test_flicker_and_frame_difference_psnr_by_hand():
    """A 2-frame 4×4 video: the float's second frame lights one pixel of 16 by 64 grey levels
    (temporal change 64 / 16 = 4); the candidate is 3 brighter in frame 0, 3 darker in 1."""
    base = np.full((2, 4, 4, 3), 20, np.uint8)
    base[1, 0, 0] = 84
    cand = base.astype(np.int16)
    cand[0] += 3
    cand[1] -= 3
    cand = cand.astype(np.uint8)
    assert temporal_change(base) == 4.0
    # the candidate's steps: 81 - 23 = 58 at that pixel, 17 - 23 = -6 at the 15 others
    assert temporal_change(cand) == (58 + 15 * 6) / 16 == 9.25
    # every step is off by -6: MSE 36
    assert temporal_psnr(base, cand) == pytest.approx(20 * math.log10(255 / 6))
    pair = video_pair(0, base, cand)
    assert pair.psnr_db == pytest.approx(20 * math.log10(255 / 3))  # both frames off by 3
    assert (pair.frames, pair.mae, pair.max_abs) == (2, 3.0, 3)
    q = t2v_quality([base], [cand], ["a"], confidence=0.95)
    assert q.measured["flicker_delta"] == 9.25 - 4.0
    assert q.intervals is not None and q.intervals["flicker_delta"].low == 5.25
    # one frame identical: it counts as the cap in the video's mean, not as inf
    half = cand.copy()
    half[1] = base[1]
    assert video_pair(0, base, half).psnr_db == pytest.approx(
        (20 * math.log10(255 / 3) + FRAME_PSNR_CAP_DB) / 2
    )
    single = t2v_quality([base[:1]], [cand[:1]], ["a"], confidence=0.95)
    assert "flicker_delta" not in single.measured and temporal_change(base[:1]) is None


def test_bad_inputs_are_refused():
    v = np.zeros((3, 8, 8, 3), np.uint8)
    with pytest.raises(InputError, match="1 baseline and 2 candidate videos"):
        t2v_quality([v], [v, v], ["a"])
    with pytest.raises(InputError, match="2 motions"):
        t2v_quality([v], [v], ["a"], motions=["left", "right"])
    with pytest.raises(ShapeError, match="video 0: baseline"):
        t2v_quality([v], [v[:2]], ["a"])
    with pytest.raises(ShapeError, match=r"expected video frames"):
        t2v_quality([v[0]], [v[0]], ["a"])


def test_the_metric_table_and_the_task():
    entry = task("t2v")
    assert (entry.outputs, entry.unit, entry.seeded, entry.reference_images) == (
        "videos", "prompts", True, True,  # data.reference: dataset, the KVD's reference videos
    )  # fmt: skip
    assert entry.fidelity(t2v_suite()) == "video_psnr_median_db"
    expected = {
        "video_psnr_median_db": (">=", "video_psnr_min", 18.0),
        "video_ssim_mean": (">=", "video_ssim_min", 0.6),
        "flicker_delta": ("<=", "flicker_delta_max", 1.0),
        "temporal_psnr_median_db": (">=", "temporal_psnr_min", 15.0),
        "clip_score_delta": (">=", "clip_score_delta_min", -0.5),  # t2i's, on frames
        "clip_temp_delta": (">=", "clip_temp_delta_min", -0.01),
        "motion_accuracy_delta": (">=", "motion_accuracy_delta_min", -0.05),
        "kvd_delta": ("<=", "kvd_delta_max", 0.02),
    }
    table = {m.key: (m.comparator, m.bound, m.default_bound) for m in metrics("t2v")}
    assert {k: v for k, v in table.items() if not metric(k).speed} == expected
    assert metric("clip_score_delta").applies_to("t2i")
    assert not metric("video_psnr_median_db").applies_to("t2i")


def test_a_t2v_suite_file_validates(tmp_path):
    path = tmp_path / "shapes-video.yaml"
    path.write_text(
        "schema_version: 1\nname: shapes-video\ntask: t2v\nseeds: [0, 1]\n"
        "data: {dataset: shapes-video, split: eval, samples: 24}\n"
        "metrics:\n  clip: shapes-clip\n  fid_features: null\n  thresholds:\n"
        "    video_psnr_min: 20\n    video_ssim_min: 0.7\n    flicker_delta_max: 1.0\n"
        "    temporal_psnr_min: 17\n    clip_score_delta_min: -0.5\n"
        "    clip_temp_delta_min: -0.01\n    motion_accuracy_delta_min: -0.05\n"
    )
    suite = load_suite(path)
    assert suite.task == "t2v" and suite.metrics.thresholds.get("flicker_delta_max") == 1.0


@pytest.mark.parametrize(
    ("thresholds", "data", "clip", "match"),
    [
        ({"wer_delta_max_points": 0.5}, {}, "tiny",
         r"thresholds \['wer_delta_max_points'\] do not apply to task 't2v'"),
        ({"psnr_min": 20}, {}, "tiny", r"thresholds \['psnr_min'\] do not apply to task 't2v'"),
        ({"video_ssim_min": 1.5}, {}, "tiny",
         "metrics.thresholds.video_ssim_min: Input should be less than or equal to 1"),
        ({"flicker_delta_max": -1}, {}, "tiny",
         "metrics.thresholds.flicker_delta_max: Input should be greater than or equal to 0"),
        ({"flicker_delta_maks": 1}, {}, "tiny", "did you mean 'flicker_delta_max'"),
        ({"clip_score_delta_min": -0.5, "clip_temp_delta_min": -0.01}, {}, None,
         "clip_score_delta_min, clip_temp_delta_min needs metrics.clip"),
        ({"motion_accuracy_delta_min": -0.05}, {"folder": "videos"}, "tiny",
         "motion_accuracy_delta_min needs records with a 'motion' label, but data.folder's "
         "prompts.txt holds prompts only"),
        ({"kvd_delta_max": 0.02}, {}, "tiny",
         r"kvd_delta_max needs metrics.video_features .* and data.reference: dataset"),
        ({"kvd_delta_max": 0.02}, {"reference": "dataset"}, "tiny",
         r"kvd_delta_max needs metrics.video_features \(a video encoder"),
    ],
)  # fmt: skip
def test_bad_t2v_suites_are_refused_in_one_message(thresholds, data, clip, match):
    source = data if "folder" in data else {"dataset": "shapes-video", **data}
    with pytest.raises(ConfigError, match=match):
        parse_suite({
            "name": "bad", "task": "t2v", "data": source,
            "metrics": {"fid_features": None, "clip": clip, "thresholds": thresholds},
        }, "bad.yaml")  # fmt: skip


def test_records_without_a_motion_label_are_refused_before_anything_is_generated():
    suite = t2v_suite(motion_accuracy_delta_min=-0.05)
    prompts_only = [{"prompt": "a red circle moving left"}] * 2
    with pytest.raises(ConfigError, match=(
        "suite synthetic-t2v: motion_accuracy_delta_min needs a 'motion' label in every "
        "record; record 0 has none \\(its columns: prompt\\)"
    )):  # fmt: skip
        QualityInputs.load(suite, None, prompts_only)  # type: ignore[arg-type]  # no model read
    odd = [{"prompt": "p", "motion": "left"}, {"prompt": "q", "motion": "rotating"}]
    assert records_problem(suite, odd) == (
        "motion_accuracy_delta_min: record 1's motion 'rotating' is not one the detector finds "
        "(left, right, up, down, growing, shrinking)"
    )
    # a suite that does not bound it reads no label
    assert records_problem(t2v_suite(flicker_delta_max=1.0), prompts_only) is None


def test_the_task_compares_every_seed_of_every_prompt(videos):
    """Through the task's own compare: 2 seeds of 6 prompts (seed-major), the records' labels
    repeated per seed; the interval resamples the 6 prompts."""
    base, labels, prompts = videos
    n = 6
    suite = parse_suite({
        "name": "two-seeds", "task": "t2v", "seeds": [0, 100],
        "data": {"dataset": "shapes-video", "samples": n},
        "metrics": {"fid_features": None, "thresholds": {"motion_accuracy_delta_min": -0.05}},
    })  # fmt: skip
    records = [{"prompt": p, "motion": m} for p, m in zip(prompts[:n], labels[:n], strict=True)]
    inputs = TaskInputs(suite, records, prompts[:n], [], None, None)
    # seed 100's float videos: videos 6..11, whose motions are prompts 0..5's (6 motions in
    # turn); the candidate plays seed 100's backwards
    float_videos = base[: 2 * n]
    cand = base[:n] + [v[::-1] for v in base[n : 2 * n]]
    q = task("t2v").compare(inputs, float_videos, cand, None, 0.95)
    assert q.samples == n and q.intervals is not None
    assert [p.seed for p in sorted(q.image_pairs, key=lambda p: p.index)] == [
        *range(n), *range(100, 100 + n)
    ]  # fmt: skip
    assert (q.measured["motion_accuracy_baseline"], q.measured["motion_accuracy_candidate"]) == (
        1.0, 0.5,
    )  # fmt: skip
    # every prompt: seed 0 right, seed 100 wrong, so every resample's delta is -0.5
    interval = q.intervals["motion_accuracy_delta"]
    assert (interval.low, interval.high, interval.n) == (-0.5, -0.5, n)
    assert judge(interval, -0.05, ">=")[0] == "FAIL"


def test_the_report_shows_each_video_pair_as_frame_strips(videos, tmp_path):
    from PIL import Image

    base, labels, prompts = videos
    cand = [flickered(v) for v in base]
    q = t2v_quality(base, cand, prompts, motions=labels, confidence=0.95, prompts_count=48)
    report = build_report(t2v_suite(**THRESHOLDS), q, created="").with_outputs(base, cand)
    assert report.verdict == "FAIL"
    out = write_report(report, tmp_path / "report")
    strips = sorted((out / "plots").glob("pair-*.png"))
    assert len(strips) == 6  # a few pairs: MAX_VIDEO_PAIRS
    first = q.image_pairs[0].index
    img = np.asarray(Image.open(io.BytesIO((out / "plots" / f"pair-{first:04d}.png").read_bytes())))
    # 8 of the 9 frames (0, 1, 2, 3, 5, 6, 7, 8), 2-px gaps, a 4-px gap between the rows,
    # everything doubled (32-px frames are shown at 64)
    assert img.shape[:2] == (2 * (32 + 4 + 32), 2 * (8 * 32 + 7 * 2))
    assert (img[0, 0, :3] == base[first][0, 0, 0]).all()  # top row: the float
    assert (img[2 * 36, 0, :3] == cand[first][0, 0, 0]).all()  # bottom row: the candidate
    assert (img[0, 2 * 5 * 34, :3] == base[first][6, 0, 0]).all()  # the 6th strip frame is 6
    html = (out / "report.html").read_text()
    assert "Video pairs: baseline frames (top row) above candidate frames (bottom row)" in html
    assert "Video pairs (worst mean per-frame PSNR first)" in html
    assert html.count("<figure><img alt='pair ") == 6
    md = (out / "report.md").read_text()
    assert f"](plots/pair-{first:04d}.png)" in md and "## Video pairs: baseline frames" in md
    assert '"frames": 9' in (out / "report.json").read_text()


def _encoder():
    import torch

    from opsnn_quant.evaluation.video_features import VideoEncoder

    torch.manual_seed(0)  # a random 3-D conv feature space: enough to see the pipeline work
    return VideoEncoder(width=8, features=32).eval()


def test_kvd_is_zero_for_the_float_itself_and_sees_a_damaged_candidate():
    from opsnn_quant.evaluation.t2v import VideoReference

    base, labels, prompts = synthetic(24)
    # the reference: other renders of the same prompts (the dataset's own clips)
    reference = VideoReference(
        _encoder(), "random-3d", [synthetic_video(500 + i, m) for i, m in enumerate(labels)]
    )
    same = t2v_quality(base, base, prompts, reference=reference, confidence=0.95)
    assert same.measured["kvd_delta"] == 0.0  # the same features, the same kernel rows
    # a colour cast (the whole video 50 grey levels brighter): every video off the reference's
    cast = [np.clip(v.astype(int) + 50, 0, 255).astype(np.uint8) for v in base]
    bad = t2v_quality(base, cast, prompts, reference=reference, confidence=0.95)
    delta, interval = bad.measured["kvd_delta"], bad.intervals["kvd_delta"]
    assert delta > 0 and interval.low > 0, (delta, interval)  # the whole interval above zero
    assert any(r.metric.startswith("KVD vs reference [random-3d]") for r in bad.quality)
    # without a reference, the report says there is no distribution criterion
    assert any("no distribution criterion" in n for n in t2v_quality(base, base, prompts).notes)


def test_video_encoder_round_trips_through_its_directory(tmp_path):
    import torch

    from opsnn_quant.evaluation.video_features import (
        load_video_encoder,
        save_video_encoder,
        video_features,
    )

    enc = _encoder()
    loaded = load_video_encoder(save_video_encoder(enc, tmp_path / "enc"))
    videos, _, _ = synthetic(3)
    a, b = video_features(enc, videos), video_features(loaded, videos)
    assert a.shape == (3, 32) and a.dtype == torch.float64 and torch.equal(a, b)
    (tmp_path / "enc" / "config.json").write_text('{"width": 16, "features": 32}')
    with pytest.raises(ConfigError, match="cannot load a video encoder"):
        load_video_encoder(tmp_path / "enc")
