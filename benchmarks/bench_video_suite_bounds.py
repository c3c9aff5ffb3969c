"""Where the shapes-t2v suite's bounds come from: the float model's own noise, and damage.

The float ``shapes-t2v`` pipeline generates the suite's prompts at seed 0 (the baseline); then

* the same float model at other seeds (``--reseeds``): a candidate that is exactly as good as
  the float, drawn differently. A distribution-like criterion (motion accuracy, CLIP score,
  CLIP-Temp, flicker, KVD) must pass these: its bound sits above their 95 % upper ends
  (pair-by-pair figures such as PSNR cannot be re-seeded: a re-seeded video is another video);
* damage that every bound must catch: the float at half its denoising steps; its own videos
  with frames shuffled in time, played backwards, or with +-3 grey levels of alternating
  flicker (the three proofs of the temporal criteria, on the real model's videos).

Each row is :func:`opsnn_quant.evaluation.t2v.t2v_quality` with the suite's CLIP, video encoder,
reference clips and motion labels, 95 % paired bootstrap intervals. Backend: cpu (float).

    python benchmarks/bench_video_suite_bounds.py [--samples 256] [--reseeds 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import opsnn_quant as oq


def _videos(adapter, prompts, seed, steps=None):
    if steps is not None:
        adapter.settings = adapter.settings.model_copy(update={"steps": steps})
    return adapter.generate(prompts, seed=seed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--reseeds", type=int, default=3)
    args = p.parse_args()
    oq.set_reproducible()
    from opsnn_quant.evaluation.clip_score import ClipScorer
    from opsnn_quant.evaluation.fid import ClipImageFeatures
    from opsnn_quant.evaluation.t2i import suite_clip
    from opsnn_quant.evaluation.t2v import VideoClip, VideoReference, t2v_quality
    from opsnn_quant.evaluation.video_features import suite_video_encoder

    suite = oq.load_suite("shapes-t2v")
    records = oq.load_records("zoo:shapes-video/eval", args.samples)
    prompts = [r["prompt"] for r in records]
    motions = [r["motion"] for r in records]
    g = suite.generation
    adapter = oq.load_adapter("diffusers-dit", "zoo:shapes-t2v", steps=g.steps,
                              guidance_scale=g.guidance_scale, batch_size=g.batch_size,
                              height=g.height, width=g.width, num_frames=g.num_frames,
                              max_sequence_length=16)  # fmt: skip
    model, processor, label = suite_clip(suite.metrics.clip)
    clip = VideoClip(ClipScorer(model, processor, label),
                     ClipImageFeatures.from_processor(model, processor, label))  # fmt: skip
    encoder, name = suite_video_encoder(suite.metrics.video_features)
    reference = VideoReference(encoder, name, [np.asarray(r["video"]) for r in records])
    t0 = time.monotonic()
    base = _videos(adapter, prompts, 0)
    print(f"float generation of {len(prompts)} videos: {time.monotonic() - t0:.0f} s")
    rng = np.random.default_rng(0)

    def shuffle(v):
        while True:
            order = rng.permutation(len(v))
            if (order != np.arange(len(v))).all():
                return v[order]

    def flicker(v):
        sign = np.where(np.arange(len(v)) % 2, 3, -3)[:, None, None, None]
        return np.clip(v.astype(np.int16) + sign, 0, 255).astype(np.uint8)

    rows = [(f"float, seed {1000 * s}", _videos(adapter, prompts, 1000 * s))
            for s in range(1, args.reseeds + 1)]  # fmt: skip
    rows.append(
        (f"float, {g.steps // 2} of {g.steps} steps", _videos(adapter, prompts, 0, g.steps // 2))
    )
    rows += [("frames shuffled in time", [shuffle(v) for v in base]),
             ("played backwards", [v[::-1].copy() for v in base]),
             ("alternating flicker +-3", [flicker(v) for v in base])]  # fmt: skip
    keys = ("video_psnr_median_db", "video_ssim_mean", "temporal_psnr_median_db", "flicker_delta",
            "clip_score_delta", "clip_temp_delta", "motion_accuracy_delta", "kvd_delta")  # fmt: skip
    print(f"baseline: float seed 0; {len(prompts)} prompts (95 % intervals)")
    print("| candidate | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for title, cand in rows:
        q = t2v_quality(base, cand, prompts, seeds=list(range(len(prompts))), motions=motions,
                        clip=clip, reference=reference, confidence=0.95)  # fmt: skip
        cells = []
        for k in keys:
            v, ci = q.measured.get(k), (q.intervals or {}).get(k)
            cells.append(
                "-"
                if v is None
                else f"{v:.4g}" + ("" if ci is None else f" [{ci.low:.4g}, {ci.high:.4g}]")
            )
        print(f"| {title} | " + " | ".join(cells) + " |")
        if title.endswith("seed 1000"):
            print(f"(float motion accuracy {q.measured.get('motion_accuracy_baseline')}, "
                  f"KVD(float, reference) {q.measured.get('kvd_baseline_vs_reference')})")  # fmt: skip


if __name__ == "__main__":
    main()
