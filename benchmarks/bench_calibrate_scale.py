"""What ``calibrate`` costs on real-size architectures, against one float pass of the same data.

Rows (each in a child process, so its peak RSS is its own):

* ``sd15-256``: a Stable Diffusion 1.5-architecture pipeline (860M UNet, 123M CLIP-L text
  encoder, 83M VAE) with random weights, built and saved by this script, sampled at 256 px;
* ``whisper-base`` / ``whisper-small``: Whisper base.en / small.en architectures with random
  weights (the zoo's tiny.en processor: same English tokenizer and features);
* ``shapes-t2i``, ``whisper-tiny-en``: the zoo recipes as they ship;
* ``sd3-tiny``, ``flux-tiny``: the tests' 2-layer random SD3 / FLUX pipelines at 32 px (a float
  pass is a fraction of a second there, so fixed costs dominate their ratios).

Per row: the wall time of one float forward loop over the calibration set, then the whole
``run_calibrate`` with each phase timed from its progress messages (probe pass 1, the SmoothQuant
search, pass 2, attribution, held-out recording, quantize, ...), then one more float loop on a
fresh load. Each of the two is the median of up to three loops (as many as fit in 10 s), and
the unit is their mean (this machine's speed drifts by up to 2x over minutes, so one loop at the
start can misstate every ratio; both are printed). Phases are
printed as forward-equivalents of that unit; and peak RSS (VmHWM) of loading + the first float
pass against loading + calibrate.
Goals (issue 14): the whole calibrate <= 15 float forward-equivalents and peak memory <= 2x a
float inference, on every row.

Random weights make a real architecture's cost, not its accuracy: the quality figures printed by
calibrate for the random rows mean nothing. Backend: cpu (PyTorch eager fp32 and the exact
Ascend int8 reference).

Each row runs once per ``--gemm`` path (``auto``: the race of ``opsnn_quant/ascend/gemm_path.py``;
``native``: ``torch._int_mm``; ``fp32-chunk``: fp32 K-chunk GEMMs), side by side in one run, and
prints the int8 GEMM path each size class took with the CPU's flags, so that a table from one
CPU kind is never read as another's (issue 29: without VNNI the native kernel is 40-65x slower
than fp32; with it, 4-10x faster).

``--slow-native`` stands in an exact but slow ``torch._int_mm`` (an int64 GEMM) for the CPU kind
issue 29 met, to show what ``auto`` chooses there; its rows say ``/slow``.

Run: ``python benchmarks/bench_calibrate_scale.py [--rows sd15-256,whisper-base,...]
[--gemm auto,native,fp32-chunk] [--slow-native] [--prompts 4] [--steps 10] [--utterances 8] [--workdir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROWS = ("shapes-t2i", "whisper-tiny-en", "whisper-base", "whisper-small", "sd15-256", "sd3-tiny",
        "flux-tiny")  # fmt: skip


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _reset_hwm() -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _char_tokenizer(d: Path) -> None:
    """CLIP tokenizer files with a character vocabulary (no merges): offline, any prompt."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n")


def build_sd15(root: Path) -> Path:
    """An SD 1.5-architecture pipeline with random weights in ``root`` (safetensors)."""
    import torch
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(0)
    _char_tokenizer(root / "_tok")
    tokenizer = CLIPTokenizer(
        str(root / "_tok" / "vocab.json"), str(root / "_tok" / "merges.txt"), model_max_length=77
    )
    text = CLIPTextModel(CLIPTextConfig(vocab_size=54, hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12,
                                        max_position_embeddings=77, bos_token_id=0,
                                        eos_token_id=1, pad_token_id=1))  # fmt: skip
    unet = UNet2DConditionModel(
        sample_size=32, cross_attention_dim=768, attention_head_dim=8, layers_per_block=2,
        block_out_channels=(320, 640, 1280, 1280),
    )  # fmt: skip
    vae = AutoencoderKL(
        block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    )  # fmt: skip
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tokenizer, unet=unet,
                                   scheduler=PNDMScheduler(skip_prk_steps=True),
                                   safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)  # fmt: skip
    pipe.save_pretrained(str(root / "sd15"))
    return root / "sd15"


def build_whisper(root: Path, size: str) -> Path:
    """A Whisper base.en / small.en architecture with random weights and the zoo's processor."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperProcessor

    from opsnn_quant.sources import model_path

    torch.manual_seed(0)
    dims = {"base": (512, 6, 8), "small": (768, 12, 12)}[size]
    tiny = model_path("zoo:whisper-tiny.en")
    cfg = WhisperConfig.from_pretrained(str(tiny))
    d, layers, heads = dims
    for key, value in (("d_model", d), ("encoder_layers", layers), ("decoder_layers", layers),
                       ("encoder_attention_heads", heads), ("decoder_attention_heads", heads),
                       ("encoder_ffn_dim", 4 * d), ("decoder_ffn_dim", 4 * d)):  # fmt: skip
        setattr(cfg, key, value)
    model = WhisperForConditionalGeneration(cfg)
    model.generation_config = WhisperForConditionalGeneration.from_pretrained(
        str(tiny)
    ).generation_config
    out = root / f"whisper-{size}"
    model.save_pretrained(str(out), safe_serialization=True)
    WhisperProcessor.from_pretrained(str(tiny)).save_pretrained(str(out))
    return out


def recipe_for(row: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The recipe (as a dict) a row calibrates with."""
    if row in ("shapes-t2i", "whisper-tiny-en"):
        from opsnn_quant.recipe import load_recipe

        return load_recipe(row).model_dump(mode="json")
    if row == "sd15-256":
        source = build_sd15(work)
        prompts = work / "prompts.txt"
        words = [
            "a red circle",
            "a blue square at the top",
            "a small green triangle",
            "a large yellow star",
        ]
        prompts.write_text("\n".join((words * args.prompts)[: args.prompts]) + "\n")
        return {
            "name": "sd15-256",
            "model": {"family": "diffusers-sd", "source": str(source),
                      "settings": {"steps": args.steps, "batch_size": args.prompts,
                                   "height": 256, "width": 256, "guidance_scale": 7.5}},
            "data": {"calibration": str(prompts)},
            "probe": {"max_root_calls": 4, "estimator_batch": 1, "estimator_samples": 2},
            "target": "ascend910b-atc",
        }  # fmt: skip
    if row in ("sd3-tiny", "flux-tiny"):
        return _tiny_dit_recipe(row, work, args)
    size = row.split("-")[1]
    return {
        "name": row,
        "model": {"family": "whisper", "source": str(build_whisper(work, size)),
                  "settings": {"batch_size": 4, "max_new_tokens": 40}},
        "data": {"calibration": "zoo:speech/eval", "limit": args.utterances},
        "probe": {"max_root_calls": 4, "estimator_batch": {"audio_encoder": 1},
                  "estimator_samples": {"audio_encoder": 2}},
        "target": "ascend910b-eager",
    }  # fmt: skip


def _tiny_dit_recipe(row: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The tests' 2-layer SD3 / FLUX pipelines (``tests/tiny_pipelines.py``) at 32 px."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests import tiny_pipelines

    build = tiny_pipelines.save_tiny_sd3 if row == "sd3-tiny" else tiny_pipelines.save_tiny_flux
    build(work / "pipe")
    prompts = work / "prompts.txt"
    words = ["a red circle", "a blue square", "a green circle at the top", "a small red square"]
    prompts.write_text("\n".join((words * args.prompts)[: args.prompts]) + "\n")
    return {
        "name": row,
        "model": {"family": "diffusers-dit", "source": str(work / "pipe"),
                  "settings": {"steps": args.steps, "batch_size": 2, "height": 32, "width": 32,
                               "max_sequence_length": 16}},
        "data": {"calibration": str(prompts)},
        "probe": {"max_root_calls": 4},
        "target": "ascend910b-eager",
    }  # fmt: skip


def child(row: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one row (in this process): float pass, then calibrate, with times and peak RSS."""
    import os

    from opsnn_quant.ascend.gemm_path import ENV, describe
    from opsnn_quant.ascend.matmul import gemm_choice
    from opsnn_quant.determinism import set_reproducible

    os.environ[ENV] = args.gemm
    set_reproducible(seed=0, threads=args.threads)
    if args.slow_native:
        _slow_native_int_mm()
    gemm = describe(gemm_choice())  # the race (or the forced path), before anything is timed
    from opsnn_quant.memory import release_memory
    from opsnn_quant.models.data import load_records
    from opsnn_quant.pipeline.calibrate import load_recipe_model, run_calibrate
    from opsnn_quant.recipe import Recipe

    work = Path(args.workdir) / f"{row}-{args.gemm}"
    work.mkdir(parents=True, exist_ok=True)
    recipe = Recipe.model_validate(recipe_for(row, work, args))
    data = load_records(recipe.data.calibration, recipe.data.limit)
    adapter = load_recipe_model(recipe)
    _reset_hwm()
    base_kb = _hwm_kb()
    float_s = _timed_loop(adapter, data)
    float_kb = _hwm_kb()
    del adapter
    release_memory()  # the float copy's pages go back before calibrate loads its own
    phases: list[tuple[str, float]] = []
    peaks: list[int] = []
    _reset_hwm()
    t_start = time.perf_counter()

    def say(msg: str) -> None:
        phases.append((msg, time.perf_counter() - t_start))
        if _phase_key(msg) == "export" and not peaks:
            peaks.append(_hwm_kb())  # the peak of everything before the exports
        # streamed, so a row that runs for an hour shows where it is
        print(f"[{row} {phases[-1][1]:8.1f} s] {msg} (peak RSS {_hwm_kb() / 1024:.0f} MB)",
              file=sys.stderr, flush=True)  # fmt: skip

    result = run_calibrate(recipe, work / "out", progress=say, force=True)
    total_s = time.perf_counter() - t_start
    calib_kb = _hwm_kb()
    float_after_s = _float_pass_seconds(recipe, data)
    spans: dict[str, float] = {}
    for (msg, t), (_, t_next) in zip(phases, [*phases[1:], ("end", total_s)], strict=True):
        key = _phase_key(msg)
        spans[key] = spans.get(key, 0.0) + (t_next - t)
    return {
        "row": row,
        # The unit: the mean of the float loop's median before and after the calibrate (this
        # VM's speed drifts by up to 2x over minutes; one pass at the start misstated ratios).
        "float_s": (float_s + float_after_s) / 2,
        "float_before_s": float_s,
        "float_after_s": float_after_s,
        "total_s": total_s,
        "phases": spans,
        "rss_base_mb": base_kb / 1024,
        "rss_float_mb": float_kb / 1024,
        "rss_calibrate_mb": calib_kb / 1024,
        "rss_before_export_mb": (peaks[0] if peaks else calib_kb) / 1024,
        "int8_mac_share": result.int8_mac_share,
        "gemm_mode": args.gemm + ("/slow" if args.slow_native else ""),
        "gemm": gemm,
    }


def _slow_native_int_mm() -> None:
    """Stand in for a CPU whose ``torch._int_mm`` is exact but slow (AVX2 without VNNI, where
    issue 29 measured it 40-65x slower than fp32): an exact int64 GEMM in its place (~7x slower
    than fp32 on the AVX-512 machine of the closing note). A simulation, named in the table."""
    import torch

    def exact_but_slow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)

    torch._int_mm = exact_but_slow


def _timed_loop(adapter: Any, data: Any) -> float:
    """The median of up to 3 float loops (more only while they stay under 10 s together: a
    sub-second loop measured once misstates the unit by tens of percent on this VM)."""
    times: list[float] = []
    while not times or (len(times) < 3 and sum(times) < 10.0):
        t0 = time.perf_counter()
        adapter.forward_loop(data)(adapter.model)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _float_pass_seconds(recipe: Any, data: Any) -> float:
    """One more float pass, on a fresh load, after the calibrate (its peak RSS is recorded)."""
    from opsnn_quant.memory import release_memory
    from opsnn_quant.pipeline.calibrate import load_recipe_model

    release_memory()
    return _timed_loop(load_recipe_model(recipe), data)


def _phase_key(msg: str) -> str:
    for key, needle in (("export", "for the ATC graphs"), ("export", "for the exports"),
                        ("load", "loading"), ("pass 1", "pass 1/2"), ("alpha search", "SmoothQuant"),
                        ("pass 2", "pass 2/2"), ("attribution", "end-to-end"),
                        ("measure", "measuring"), ("holdout", "held-out data"),
                        ("quantize", "quantiz"), ("quantize", "calibration"),
                        ("export", "exporting"), ("policy", "policy")):  # fmt: skip
        if needle in msg:
            return key
    return msg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--utterances", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None)
    p.add_argument("--gemm", default="auto", help="comma list of auto, native, fp32-chunk")
    p.add_argument("--slow-native", action="store_true",
                   help="simulate an exact but slow torch._int_mm (a CPU without VNNI)")  # fmt: skip
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args)), flush=True)
        return
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="bench-scale-")
    rows = []
    for row in args.rows.split(","):
        for gemm in args.gemm.split(","):
            cmd = [sys.executable, __file__, "--child", row, "--workdir", args.workdir,
                   "--prompts", str(args.prompts), "--steps", str(args.steps), "--gemm", gemm,
                   "--utterances", str(args.utterances), "--threads", str(args.threads),
                   *(["--slow-native"] if args.slow_native else [])]  # fmt: skip
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # stderr: the phases
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                print(f"{row} ({gemm}): failed (exit {out.returncode}); its error is above")
                continue
            rows.append(json.loads(lines[-1][7:]))
            _print([rows[-1]])
    print("\nall rows (cpu backend; forward-equivalents = seconds / one float pass of the data):")
    _print(rows)
    if rows:
        flags = rows[0]["gemm"]["cpu_flags"]
        print("CPU flags: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in flags.items())
              + f"; torch CPU capability {rows[0]['gemm']['cpu_capability']}")  # fmt: skip


def _print(rows: list[dict[str, Any]]) -> None:
    keys = ["pass 1", "alpha search", "pass 2", "attribution", "holdout", "quantize", "measure",
            "export"]  # fmt: skip
    head = f"{'row':16} {'gemm':27} {'float s':>8} {'calib s':>8} {'total':>7} "
    head += " ".join(f"{k[:7]:>7}" for k in keys)
    print(head + f" {'RSS x':>6} {'peak MB':>8} {'pre-exp x':>9} {'float before/after s':>20}")
    for r in rows:
        eq = [r["phases"].get(k, 0.0) / r["float_s"] for k in keys]
        rss = (r["rss_calibrate_mb"]) / max(r["rss_float_mb"], 1e-9)
        paths = r["gemm"]["int8_gemm"]  # what each size class ran: small/large products
        gemm = f"{r['gemm_mode']}:{paths['small'][:6]}/{paths['large'][:6]}"
        print(f"{r['row']:16} {gemm:27} {r['float_s']:8.1f} {r['total_s']:8.1f} "
              f"{r['total_s'] / r['float_s']:7.1f} "
              + " ".join(f"{e:7.1f}" for e in eq)
              + f" {rss:6.2f} {r['rss_calibrate_mb']:8.0f}"
              + f" {r['rss_before_export_mb'] / max(r['rss_float_mb'], 1e-9):9.2f}"
              + f" {r['float_before_s']:9.1f} /{r['float_after_s']:7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
