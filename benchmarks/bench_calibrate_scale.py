"""What ``calibrate`` costs on real-size architectures, against one float pass of the same data
and, with ``--peer msmodelslim``, against msModelSlim's own calibration of the same model.

Rows (each in a child process, so its peak RSS is its own):

* ``whisper-base-real``: the user's one-command path, ``calibrate --model zoo:whisper-base
  --data zoo:speech/eval --limit UTTERANCES`` (real multilingual Whisper base weights, the
  zoo's espeak-ng speech; no recipe: the family's target and the default budget);
* ``sd15-256``: a Stable Diffusion 1.5-architecture pipeline (860M UNet, 123M CLIP-L text
  encoder, 83M VAE) with random weights, built and saved by this script, sampled at 256 px;
* ``whisper-base`` / ``whisper-small``: Whisper base.en / small.en architectures with random
  weights (the zoo's tiny.en processor: same English tokenizer and features);
* ``shapes-t2i``, ``shapes-dit``, ``whisper-tiny-en``, ``shapes-t2v`` (video: 9 frames): the
  zoo recipes as they ship; with
  ``:eager`` on the eager target (int8 attention measured) and ``:eager-linear`` the same
  without the attention schemes: side by side, the cost of measuring attention;
* ``sd3-tiny``, ``flux-tiny``: the tests' 2-layer random SD3 / FLUX pipelines at 32 px (a float
  pass is a fraction of a second there, so fixed costs dominate their ratios);
* the users' real widths at a cut depth, random weights (``benchmarks/real_widths.py``), each
  run at the depths of ``--depths`` (default 1 and 2 units; a unit is one double- plus one
  single-stream block for FLUX, one block for Wan, one encoder plus one decoder layer for
  Whisper), with the settings of the shipped templates (``flux-template``, ``wan-t2v-template``:
  bfloat16, ``ascend910b-mindie-sd``, their probe settings and limits; Whisper as the other
  Whisper rows) at small sizes:

  - ``flux-dev-width``: FLUX.1-dev's transformer widths (3072, 24 x 128, joint 4096, pooled
    768), T5-XXL and CLIP-L widths cut to 2 layers, FLUX's VAE; 128 px, ``--steps-width`` steps,
    32 T5 tokens (full depth: 19 double + 38 single blocks);
  - ``wan14b-width``: Wan2.1-T2V-14B's transformer widths (5120, ffn 13824, 40 x 128), umT5-XXL
    widths cut to 2 layers, Wan2.1's VAE; 5 frames of 128 px (full depth: 40 blocks);
  - ``whisper-large-v3-width``: d_model 1280, 20 heads, ffn 5120, 128 mel bins (full depth:
    32 + 32 layers).

  ``--text-layers N`` cuts the FLUX/Wan text encoders to N layers instead (memory), and
  ``--width-probe quick`` swaps in the cheapest estimator knobs (``QUICK_PROBE``: the diagonal
  estimator, one recorded root call, one replayed sample): every scheme, pass 1's statistics,
  the SmoothQuant search and the exports stay, so what is kept per module is the same.

  For these the benchmark prints the peak RSS increment per block (from the two depths,
  apportioned to block kinds by their parameter bytes), and the peaks of calibrate and of the
  float inference extrapolated linearly to the full depth.

Per row: the wall time of one float forward loop over the calibration set, then the whole
``run_calibrate`` with each phase timed from its progress messages (probe pass 1, the SmoothQuant
search, pass 2, attribution, held-out recording, quantize, ...), then one more float loop on a
fresh load. Each of the two is the median of up to three loops (as many as fit in 10 s), and
the unit is their mean (this machine's speed drifts by up to 2x over minutes, so one loop at the
start can misstate every ratio; both are printed). Phases are printed as forward-equivalents
(fwd-eq) of that unit; and peak RSS (VmHWM) of loading + the first float pass against loading +
calibrate. Goals (issue 43): the whole calibrate <= 15 float forward-equivalents (whisper-tiny-en
<= 10) and peak memory <= 1.5x a float inference, on every row. The 1-minute load average of the
machine is recorded before and after each row (other work on a shared machine slows a row).
``--json`` also holds each row's ``rss_by_phase``: every progress message of calibrate with the
peak RSS when that phase ended and how much the phase raised it.

Random weights make a real architecture's cost, not its accuracy: the quality figures printed by
calibrate for the random rows mean nothing. Backend: cpu (PyTorch eager and the exact Ascend int8
reference).

Each row runs once per ``--gemm`` path (``auto``: the race of ``opsnn_quant/ascend/gemm_path.py``;
``native``: ``torch._int_mm``; ``fp32-chunk``: fp32 K-chunk GEMMs), side by side in one run, and
prints the int8 GEMM path each size class took with the CPU's flags, so that a table from one
CPU kind is never read as another's (issue 29: without VNNI the native kernel is 40-65x slower
than fp32; with it, 4-10x faster).

``--slow-native`` stands in an exact but slow ``torch._int_mm`` (an int64 GEMM) for the CPU kind
issue 29 met, to show what ``auto`` chooses there; its rows say ``/slow``.

The peer (``--peer msmodelslim``): msModelSlim 26.1.0 from PyPI, installed by this script into a
virtual environment of its own (``--peer-venv``, default ``.engines/msmodelslim-26.1.0-venv``;
never the project's): ``python -m venv``, ``pip install torch==<ours>`` (the local CPU wheel),
``msmodelslim==26.1.0 --no-deps``, and only what its ``llm_ptq`` import closure and the model
loading need, pinned to the project's versions where the project has them (numpy, safetensors,
tqdm, accelerate, transformers, diffusers, pydantic, scipy) and else to msModelSlim's (easydict
1.13) or a fixed one (einops 0.8.2). No torch_npu: msModelSlim's ``llm_ptq`` imports without it
(one warning) and runs with ``dev_type='cpu'``, so neither torch_npu nor our stand-in
(``tests/conformance/torch_npu_stand_in``) is on its path. Where a row applies, right after each
of our children (each GEMM path's: the VM's speed drifts over a run, so each ratio pairs two
adjacent measurements) the peer runs in its own process per scheme of ``--peer-schemes``
(default ``w8a8_dynamic,w8a8``)
through ``benchmarks/peer_msmodelslim.py``, which documents the API and options:
``Calibrator(model, QuantConfig(w_bit=8, a_bit=8, is_dynamic=..., mm_tensor=False, w_sym=True,
act_method=1, dev_type='cpu'), calib_data, disable_level='L0')``, ``run()``,
``save(save_type=['safe_tensor'])``. Why that is the equivalent of our calibrate:

* same model files (loaded by transformers / diffusers at our versions, in the row's dtype) and
  the same calibration data: our child records the exact inputs of the calls our forward loop
  makes on the float model (Whisper: each batch's log-mel features and the teacher-forced decoder
  ids our loop feeds, i.e. the encoder once and the decoder over every decoded position; a
  diffusion row: every call of the pipeline's ``transformer`` over the sampling loop) and the
  peer calibrates on exactly those tensors;
* the same deployable result kinds: W8A8_DYNAMIC (int8 per-channel symmetric weights, per-token
  activations) and W8A8 (per-tensor static activations from min-max ranges) written as
  safetensors + description, as our ``export/ascendv1`` and ``export/mindie-sd``;
* the same scope msModelSlim's own adapters take: the whole Whisper model (its LM head stays
  float, msModelSlim's ``disable_last_linear``); for diffusion rows only the ``transformer``
  (msModelSlim's FLUX.1 and Wan2.1 adapters quantize only it). Our calibrate does more (text
  encoders, the VAE decoder, the per-module choice and its estimates): the ratio is what that
  costs. The peer's seconds are its model load + ``Calibrator(...)`` + ``run()`` + ``save()``
  (not its import); ours are the whole ``run_calibrate`` (data and model load included).

msModelSlim's one-click ``msmodelslim quant`` (v1) has no Whisper adapter in 26.1.0 and its
FLUX.1/Wan2.1 adapters need an NPU (``torch.npu.Stream``, ``enable_model_cpu_offload``), so its
v0 ``llm_ptq`` API is the one that runs the same models here. SD1.5 (UNet) rows: no msModelSlim
26.1.0 adapter; the peer column says so.

``--json FILE`` writes every row: ``seconds``, ``fwd_eq``, ``peak_rss_ratio``, ``peer_seconds``
(per peer scheme) and ``peer_ratio``, the phases, the GEMM path and CPU flags, the load averages,
and the per-block and extrapolated peaks of the width rows.

Run: ``python benchmarks/bench_calibrate_scale.py [--rows sd15-256,whisper-base,...]
[--gemm auto,native,fp32-chunk] [--slow-native] [--prompts 4] [--steps 10] [--utterances 8]
[--depths 1,2] [--steps-width 2] [--text-layers 2] [--width-probe template|quick]
[--peer msmodelslim] [--peer-schemes w8a8_dynamic,w8a8]
[--json FILE] [--workdir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the zoo recipes as they ship (each also as NAME:eager / NAME:eager-linear)
ZOO_ROWS = ("shapes-t2i", "shapes-dit", "whisper-tiny-en", "shapes-t2v")
ROWS = (*ZOO_ROWS, "whisper-base-real", "whisper-base", "whisper-small", "sd15-256", "sd3-tiny",
        "flux-tiny")  # fmt: skip
WIDTH_ROWS = ("flux-dev-width", "wan14b-width", "whisper-large-v3-width")
# --width-probe quick: the probe knobs that cut a width row's time without changing what is
# kept per module (every scheme, pass 1's statistics, SmoothQuant search, exports stay).
QUICK_PROBE: dict[str, Any] = {"estimator": "diagonal", "max_root_calls": 1, "estimator_samples": 1}
PEER_VERSION = "26.1.0"
PEER_SCHEMES = ("w8a8_dynamic", "w8a8")
# What the peer's environment gets besides torch and msModelSlim (--no-deps): its llm_ptq import
# closure (numpy, safetensors, tqdm, accelerate, transformers, einops, easydict, scipy, pydantic)
# and the model loading (transformers, diffusers); the project's version of each it has.
PEER_DEPS = ("numpy", "safetensors", "tqdm", "accelerate", "transformers", "diffusers", "pydantic",
             "scipy")  # fmt: skip
PEER_PINNED = ("easydict==1.13", "einops==0.8.2")  # msModelSlim's own pin; a fixed one


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
    pipe: Any = StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tokenizer, unet=unet,
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


def _prompts(path: Path, n: int) -> Path:
    words = ["a red circle", "a blue square at the top", "a small green triangle",
             "a large yellow star"]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join((words * n)[:n]) + "\n")
    return path


def recipe_for(row: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The recipe (as a dict) a row calibrates with (a width row: ``NAME@DEPTH``; a zoo recipe
    on the eager target: ``NAME:eager``, or ``NAME:eager-linear`` without its attention
    schemes, so that the two rows side by side show what measuring attention costs)."""
    if ":" in row:
        base, variant = row.split(":", 1)
        return _eager_recipe(recipe_for(base, work, args), variant)
    if "@" in row:
        return _width_recipe(row, work, args)
    if row in ZOO_ROWS:
        from opsnn_quant.pipeline.recipe import load_recipe

        return load_recipe(row).model_dump(mode="json")
    if row == "sd15-256":
        source = build_sd15(work)
        prompts = _prompts(work / "prompts.txt", args.prompts)
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
    if row == "whisper-base-real":
        return _user_path_recipe("zoo:whisper-base", "zoo:speech/eval", args.utterances)
    size = row.split("-")[1]
    return _whisper_recipe(row, build_whisper(work, size), args)


EAGER = "ascend910b-eager"


def _eager_recipe(recipe: dict[str, Any], variant: str) -> dict[str, Any]:
    """``recipe`` on the eager target (which runs int8 attention), its attention schemes kept
    (``eager``) or left out of the probe (``eager-linear``)."""
    from opsnn_quant.policy.targets import get_target
    from opsnn_quant.quant.schemes import SCHEMES

    if variant not in ("eager", "eager-linear"):
        raise SystemExit(f"error: unknown row variant {variant!r}; known: eager, eager-linear")
    recipe = {**recipe, "target": EAGER}
    if variant == "eager-linear":
        schemes = [s for s in get_target(EAGER).schemes() if not SCHEMES[s].precision.is_attention]
        recipe["probe"] = {**(recipe.get("probe") or {}), "schemes": schemes}
    return recipe


def _whisper_recipe(row: str, source: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": row.split("@")[0],
        "model": {"family": "whisper", "source": str(source),
                  "settings": {"batch_size": 4, "max_new_tokens": 40}},
        "data": {"calibration": "zoo:speech/eval", "limit": args.utterances},
        "probe": {"max_root_calls": 4, "estimator_batch": {"audio_encoder": 1},
                  "estimator_samples": {"audio_encoder": 2}},
        "target": "ascend910b-eager",
    }  # fmt: skip


def width_model(row: str, workdir: Path, text_layers: int = 2) -> tuple[Path, dict[str, Any]]:
    """Build (once per workdir) the random model of a width row ``NAME@DEPTH``; its directory
    and parameter counts (``real_widths``' figures plus the full depth's block parameters)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import real_widths

    name, depth = row.split("@")
    d = int(depth)
    path = workdir / "_models" / (row if text_layers == 2 else f"{row}-text{text_layers}")
    info_file = path / "bench_info.json"
    if info_file.exists():
        return path, json.loads(info_file.read_text())
    shutil.rmtree(path, ignore_errors=True)
    if name == "flux-dev-width":
        info = real_widths.build_flux(path, double=d, single=d, text_layers=text_layers)
        full = real_widths.FULL_DEPTH["flux"]
    elif name == "wan14b-width":
        info = real_widths.build_wan(path, blocks=d, text_layers=text_layers)
        full = real_widths.FULL_DEPTH["wan"]
    else:
        info = real_widths.build_whisper(path, encoder_layers=d, decoder_layers=d)
        full = real_widths.FULL_DEPTH["whisper"]
    # parameters of the blocks at full depth: each kind's per-block count times its full count
    info["full_block_params"] = sum(
        n // max(c, 1) * f
        for n, c, f in zip(info["kind_params"], info["blocks"], full, strict=True)
    )
    info["full_blocks"] = full
    info_file.write_text(json.dumps(info))
    return path, info


def _width_recipe(row: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A width row's recipe: the shipped template's settings at a small size."""
    name = row.split("@")[0]
    source, _ = width_model(row, Path(args.workdir), args.text_layers)
    if name == "whisper-large-v3-width":
        recipe = _whisper_recipe(row, source, args)
        if args.width_probe == "quick":
            recipe["probe"].update(QUICK_PROBE)
        return recipe
    prompts = _prompts(work / "prompts.txt", args.prompts)
    size = {"height": 128, "width": 128}
    probe: dict[str, Any]
    if name == "wan14b-width":
        settings = {**size, "num_frames": 5, "guidance_scale": 5.0, "max_sequence_length": 32}
        probe = {"min_headroom": 2.0, "max_root_calls": 3, "estimator_batch": 1, "bf16": False}
    else:
        settings = {**size, "guidance_scale": 3.5, "max_sequence_length": 32}
        probe = {"min_headroom": 2.0, "max_root_calls": 4, "estimator_batch": 1, "bf16": False}
    if args.width_probe == "quick":
        probe.update(QUICK_PROBE)
    return {
        "name": name,
        "model": {"family": "diffusers-dit", "source": str(source), "dtype": "bfloat16",
                  "settings": {"steps": args.steps_width, "batch_size": 2, **settings}},
        "data": {"calibration": str(prompts)},
        "probe": probe,
        "budget": {"limits": {"text_encoder": {"min_sqnr_db": 30},
                              "denoiser": {"min_sqnr_db": 25},
                              "image_decoder": {"min_sqnr_db": 28}},
                   "min_int8_mac_share": 0.5},
        "target": "ascend910b-mindie-sd",
    }  # fmt: skip


def _user_path_recipe(model: str, data: str, limit: int) -> dict[str, Any]:
    """What ``opsnn-quant calibrate --model MODEL --data DATA --limit N`` runs (no recipe: the
    family guessed, its engine's target, the default budget), as a recipe."""
    from opsnn_quant.pipeline.recipe_flags import RecipeFlags, effective_recipe

    flags = RecipeFlags(model=model, data=data, limit=limit)
    return effective_recipe(None, flags).model_dump(mode="json")


def _tiny_dit_recipe(row: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The tests' 2-layer SD3 / FLUX pipelines (``tests/tiny_pipelines.py``) at 32 px."""
    sys.path.insert(0, str(ROOT))
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
    _first_to_go()
    # the process set up as the command line sets it up, before torch loads (MKL and OpenMP
    # read their environment then: a row timed otherwise is not what a user runs)
    from opsnn_quant.core.determinism import set_reproducible

    set_reproducible(seed=0, threads=args.threads)
    from opsnn_quant.ascend.gemm_path import ENV, describe
    from opsnn_quant.ascend.matmul import gemm_choice

    os.environ[ENV] = args.gemm
    if args.slow_native:
        _slow_native_int_mm()
    gemm = describe(gemm_choice())  # the race (or the forced path), before anything is timed
    from opsnn_quant.core.memory import release_memory
    from opsnn_quant.models.data import load_records
    from opsnn_quant.pipeline.calibrate import load_recipe_model, run_calibrate
    from opsnn_quant.pipeline.recipe import Recipe

    load_before = os.getloadavg()[0]
    work = Path(args.workdir) / f"{row}-{args.gemm}"
    work.mkdir(parents=True, exist_ok=True)
    recipe = Recipe.model_validate(recipe_for(row, work, args))
    data = load_records(recipe.data.calibration, recipe.data.limit)
    release_memory()  # a width row's build (in this process) gives its pages back first
    adapter = load_recipe_model(recipe)
    _reset_hwm()
    base_kb = _hwm_kb()
    float_s = _timed_loop(adapter, data)
    float_kb = _hwm_kb()
    peer_kind = PEER_KIND.get(recipe.model.family) if args.peer_inputs else None
    if peer_kind:  # one more float loop (not timed) that records the peer's calibration calls
        _record_peer_inputs(adapter, data, peer_kind, Path(args.peer_inputs))
    del adapter
    release_memory()  # the float copy's pages go back before calibrate loads its own
    phases: list[tuple[str, float]] = []
    peaks: list[int] = []
    _reset_hwm()
    t_start = time.perf_counter()

    marks: list[int] = []  # the peak RSS so far at each phase's start (VmHWM only grows)

    def say(msg: str) -> None:
        phases.append((msg, time.perf_counter() - t_start))
        marks.append(_hwm_kb())
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
    # Peak RSS by phase: each phase's message, the peak when it ended, and how much it raised
    # the peak (MB): where a memory goal is missed, the phase that set the peak.
    ends = [*marks[1:], calib_kb]
    rss_by_phase = [
        {"phase": msg, "peak_mb": end / 1024, "raised_mb": (end - start) / 1024}
        for (msg, _), start, end in zip(phases, marks, ends, strict=True)
    ]
    # The unit: the mean of the float loop's median before and after the calibrate (this VM's
    # speed drifts by up to 2x over minutes; one pass at the start misstated ratios).
    unit = (float_s + float_after_s) / 2
    out: dict[str, Any] = {
        "row": row,
        "float_s": unit,
        "float_before_s": float_s,
        "float_after_s": float_after_s,
        "seconds": total_s,
        "total_s": total_s,
        "fwd_eq": total_s / unit,
        "phases": spans,
        "rss_base_mb": base_kb / 1024,
        "rss_float_mb": float_kb / 1024,
        "rss_calibrate_mb": calib_kb / 1024,
        "peak_rss_ratio": calib_kb / max(float_kb, 1),
        "rss_by_phase": rss_by_phase,
        "rss_before_export_mb": (peaks[0] if peaks else calib_kb) / 1024,
        "int8_mac_share": result.int8_mac_share,
        "gemm_mode": args.gemm + ("/slow" if args.slow_native else ""),
        "gemm": gemm,
        "loadavg_1min": [load_before, os.getloadavg()[0]],
        "model_dtype": recipe.model.dtype,
        "family": recipe.model.family,
        "model_source": _resolved(recipe.model.source),
        "max_new_tokens": getattr(recipe.model.settings, "max_new_tokens", None),
    }
    if "@" in row:
        out["width"] = width_model(row, Path(args.workdir), args.text_layers)[1]
        out["width_probe"] = args.width_probe
    return out


def _first_to_go() -> None:
    """Make this process the one the kernel's OOM killer picks first: a row that does not fit
    the machine's memory fails alone (its row says so), never another process on the machine."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _resolved(source: str) -> str:
    from opsnn_quant.sources import model_path

    return str(model_path(source)) if source.startswith("zoo:") else source


# What msModelSlim calibrates of a recipe family (absent: no msModelSlim path).
PEER_KIND = {"whisper": "whisper", "diffusers-dit": "transformer"}
PEER_NONE = {"diffusers-sd": "no msModelSlim 26.1.0 adapter for Stable Diffusion UNet pipelines"}


def _detached(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _record_peer_inputs(adapter: Any, data: Any, kind: str, path: Path) -> None:
    """Run the forward loop once more on the float model and save the calls msModelSlim is given
    (``torch.save``: a list of keyword dicts, one per call, in order).

    Whisper: per batch, the encoder's log-mel features and the decoder ids of the loop's
    teacher-forced call (the prompt and every fed token): ``model(input_features=...,
    decoder_input_ids=...)`` computes the encoder once and the decoder over every decoded
    position, as our loop's activations. Diffusion: every call of the pipeline's transformer.
    """
    import torch

    calls: list[dict[str, Any]] = []
    handles = []
    if kind == "whisper":
        model = adapter.model
        feats: list[torch.Tensor] = []

        def encoder_in(module: Any, a: tuple, kw: dict) -> None:
            feats.append(_detached(a[0] if a else kw["input_features"]))

        def teacher_forced(module: Any, a: tuple, kw: dict) -> None:
            ids = kw.get("decoder_input_ids")
            # a multilingual model's generate first detects the language: a call of its own
            # on the start-of-transcript token alone (transformers' WhisperGenerationMixin.
            # detect_language), not the loop's teacher-forced call
            if kw.get("use_cache") is False and ids is not None and ids.shape[-1] > 1:
                calls.append({"input_features": feats[-1],
                              "decoder_input_ids": _detached(kw["decoder_input_ids"])})  # fmt: skip

        handles.append(model.model.encoder.register_forward_pre_hook(encoder_in, with_kwargs=True))
        handles.append(model.register_forward_pre_hook(teacher_forced, with_kwargs=True))
    else:
        model = adapter.model

        def transformer_in(module: Any, a: tuple, kw: dict) -> None:
            call = dict(_detached(kw))
            if a:
                call["hidden_states"] = _detached(a[0])
            calls.append(call)

        handles.append(
            adapter.pipe.transformer.register_forward_pre_hook(transformer_in, with_kwargs=True)
        )
    try:
        adapter.forward_loop(data)(model)
    finally:
        for h in handles:
            h.remove()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(calls, str(path))


def ensure_peer_venv(venv: Path) -> Path:
    """The Python of msModelSlim's own virtual environment at ``venv``, made if missing (see the
    module docstring); a half-made one (no ``.complete`` with the same pins) is made again."""
    from importlib.metadata import PackageNotFoundError, version

    pins = [f"torch=={version('torch').split('+')[0]}"]
    for name in PEER_DEPS:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pins.append(name)
    pins += PEER_PINNED
    spec = json.dumps({"msmodelslim": PEER_VERSION, "deps": pins})
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    if marker.exists() and marker.read_text() == spec and python.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    print(f"installing msModelSlim {PEER_VERSION} into {venv} (its own venv) ...", flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [
        [base, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", pins[0]],
        [str(python), "-m", "pip", "install", "-q", "--no-deps", f"msmodelslim=={PEER_VERSION}"],
        [str(python), "-m", "pip", "install", "-q", *pins[1:]],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    marker.write_text(spec)
    return python


def run_peer(
    python: Path,
    kind: str,
    model_dir: Path,
    inputs: Path,
    out: Path,
    dtype: str,
    max_new_tokens: int | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """msModelSlim's calibration of each ``--peer-schemes`` scheme, one process each."""
    results: dict[str, Any] = {}
    for scheme in args.peer_schemes.split(","):
        cmd = [str(python), str(ROOT / "benchmarks" / "peer_msmodelslim.py"), "--kind", kind,
               "--model", str(model_dir), "--data", str(inputs), "--scheme", scheme,
               "--out", str(out / scheme), "--threads", str(args.threads), "--dtype", dtype,
               *(["--max-new-tokens", str(max_new_tokens)] if max_new_tokens else [])]  # fmt: skip
        shutil.rmtree(out / scheme, ignore_errors=True)
        load_before = os.getloadavg()[0]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(out.parent))
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER ")]
        if proc.returncode != 0 or not lines:
            tail = "\n".join(proc.stderr.splitlines()[-15:])
            print(f"peer msmodelslim {scheme}: failed (exit {proc.returncode}):\n{tail}")
            results[scheme] = {"error": f"exit {proc.returncode}", "stderr_tail": tail}
            continue
        results[scheme] = json.loads(lines[-1][5:])
        results[scheme]["loadavg_1min"] = [load_before, os.getloadavg()[0]]
    return results


def _slow_native_int_mm() -> None:
    """Stand in for a CPU whose ``torch._int_mm`` is exact but slow (AVX2 without VNNI, where
    issue 29 measured it 40-65x slower than fp32): an exact int64 GEMM in its place (~7x slower
    than fp32 on the AVX-512 machine of the closing note). A simulation, named in the table."""
    import torch

    def exact_but_slow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)

    torch._int_mm = exact_but_slow  # type: ignore[assignment]


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
    from opsnn_quant.core.memory import release_memory
    from opsnn_quant.pipeline.calibrate import load_recipe_model

    release_memory()
    return _timed_loop(load_recipe_model(recipe), data)


def _phase_key(msg: str) -> str:
    # "measure": the measured search (budget.metric's float slice and its candidates)
    for key, needle in (("export", "for the ATC graphs"), ("export", "for the exports"),
                        ("decide first", "decide first"), ("load", "loading"), ("pass 1", "pass 1"), ("alpha search", "SmoothQuant"),
                        ("pass 2", "pass 2"), ("attribution", "end-to-end"),
                        ("holdout", "held-out data"), ("measure", "measuring"),
                        ("measure", "budget.metric"), ("quantize", "quantiz"),
                        ("quantize", "calibration"), ("export", "exporting"),
                        ("policy", "policy"), ("policy", "skipped")):  # fmt: skip
        if needle in msg:
            return key
    return msg


def _expand(rows: str, depths: str | None) -> list[str]:
    """Row names, each width row once per depth (``NAME@DEPTH``)."""
    out = []
    for row in rows.split(","):
        if row in WIDTH_ROWS:
            out += [f"{row}@{d}" for d in (depths or "1,2").split(",")]
        elif (
            row in ROWS
            or "@" in row
            or (
                row.split(":", 1)[0] in ZOO_ROWS
                and row.split(":", 1)[1] in ("eager", "eager-linear")
            )
        ):
            out.append(row)
        else:
            raise SystemExit(f"unknown row {row!r}; rows: {', '.join(ROWS + WIDTH_ROWS)}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--steps-width", type=int, default=2, help="denoising steps of width rows")
    p.add_argument("--utterances", type=int, default=8)
    p.add_argument("--depths", default=None,
                   help="depths (units) of the width rows, e.g. 1,2 (default)")  # fmt: skip
    p.add_argument(
        "--width-probe",
        default="template",
        choices=("template", "quick"),
        help="width rows: the template's probe settings, or quick: " + str(QUICK_PROBE),
    )
    p.add_argument(
        "--text-layers",
        type=int,
        default=2,
        help="text encoder layers of the FLUX/Wan width rows (T5-XXL/umT5 width)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None)
    p.add_argument("--gemm", default="auto", help="comma list of auto, native, fp32-chunk")
    p.add_argument("--slow-native", action="store_true",
                   help="simulate an exact but slow torch._int_mm (a CPU without VNNI)")  # fmt: skip
    p.add_argument("--peer", default=None, choices=("msmodelslim",),
                   help="also time the peer's calibration of each row it applies to")  # fmt: skip
    p.add_argument("--peer-schemes", default=",".join(PEER_SCHEMES))
    p.add_argument(
        "--peer-venv", default=str(ROOT / ".engines" / f"msmodelslim-{PEER_VERSION}-venv")
    )
    p.add_argument("--json", default=None, help="write every row to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--peer-inputs", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args)), flush=True)
        return
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="bench-scale-")
    # absolute, not resolved: the peer runs in another directory, and a venv's python is a link
    # that resolving would follow out of the venv
    peer_python = ensure_peer_venv(Path(args.peer_venv).absolute()) if args.peer else None
    rows: list[dict[str, Any]] = []
    # per (row, GEMM path): the peer's results, run right after that child (the VM's speed
    # drifts by 10-20 % over a run: each ratio pairs two adjacent measurements)
    peers: dict[tuple[str, str], dict[str, Any]] = {}
    for row in _expand(args.rows, args.depths):
        recorded = False  # the peer's calibration calls: recorded by the row's first child
        for gemm in args.gemm.split(","):
            # (no "@" or ":" in the peer's paths: msModelSlim's path check refuses them)
            safe = row.replace("@", "-depth").replace(":", "-")
            inputs = Path(args.workdir) / f"{safe}-peer" / "inputs.pt"
            want_peer = peer_python is not None and not recorded
            cmd = [sys.executable, __file__, "--child", row, "--workdir", args.workdir,
                   "--prompts", str(args.prompts), "--steps", str(args.steps), "--gemm", gemm,
                   "--steps-width", str(args.steps_width), "--width-probe", args.width_probe,
                   "--text-layers", str(args.text_layers),
                   "--utterances", str(args.utterances), "--threads", str(args.threads),
                   *(["--slow-native"] if args.slow_native else []),
                   *(["--peer-inputs", str(inputs)] if want_peer else [])]  # fmt: skip
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # stderr: the phases
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                why = "killed: out of memory?" if out.returncode in (-9, 137) else "error above"
                print(f"{row} ({gemm}): failed (exit {out.returncode}, {why})", flush=True)
                rows.append({"row": row, "gemm_mode": gemm, "failed": out.returncode})
                continue
            r = json.loads(lines[-1][7:])
            recorded = True
            if peer_python is not None:
                peers[row, gemm] = _peer_for(r, row, inputs, peer_python, args)
            rows.append(r)
            _print([r], peers)
            _write_json(args, rows, peers)  # after every row: a long run cut short keeps its rows
    done = _write_json(args, rows, peers)
    print("\nall rows (cpu backend; fwd-eq = seconds / one float pass of the data):")
    _print(done, peers)
    if peers:
        _print_peer(done)
    depth = _depth_summary(done)
    if depth:
        _print_depth(depth)
    if done:
        flags = done[0]["gemm"]["cpu_flags"]
        print("CPU flags: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in flags.items())
              + f"; torch CPU capability {done[0]['gemm']['cpu_capability']}")  # fmt: skip


def _write_json(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    peers: dict[tuple[str, str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Attach the peer's results to their rows (each row's own run of the peer) and write
    ``--json`` (if given); the rows that ran."""
    for r in rows:
        if "failed" not in r and (r["row"], r["gemm_mode"]) in peers:
            _attach_peer(r, peers[r["row"], r["gemm_mode"]])
    done = [r for r in rows if "failed" not in r]
    if args.json:
        flags = done[0]["gemm"]["cpu_flags"] if done else {}
        Path(args.json).write_text(json.dumps(
            {"rows": rows, "depth": _depth_summary(done), "cpu_flags": flags, "peer": args.peer,
             "peer_version": PEER_VERSION if args.peer else None, "argv": sys.argv[1:]},
            indent=1))  # fmt: skip
    return done


def _peer_for(
    r: dict[str, Any], row: str, inputs: Path, python: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The peer's results for one row (or why it does not apply)."""
    if not inputs.exists():
        return {"n/a": PEER_NONE.get(r["family"], "no msModelSlim path for this row")}
    kind = PEER_KIND[r["family"]]
    return run_peer(python, kind, Path(r["model_source"]), inputs, inputs.parent,
                    r["model_dtype"], r.get("max_new_tokens"), args)  # fmt: skip


def _attach_peer(r: dict[str, Any], peer: dict[str, Any]) -> None:
    r["peer"] = peer
    r["peer_seconds"] = {s: v["seconds"] for s, v in peer.items() if isinstance(v, dict)
                         and "seconds" in v}  # fmt: skip
    r["peer_ratio"] = {s: r["seconds"] / v for s, v in r["peer_seconds"].items()}


def _depth_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per width row and GEMM path: the peak increments between its smallest and largest
    depth, per block-parameter byte, and the peaks extrapolated to the full depth."""
    out = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if "width" in r:
            groups.setdefault((r["row"].split("@")[0], r["gemm_mode"]), []).append(r)
    for (name, gemm), rs in groups.items():
        rs.sort(key=lambda r: r["width"]["block_params"])
        lo, hi = rs[0], rs[-1]
        w_lo, w_hi = lo["width"], hi["width"]
        d_params = w_hi["block_params"] - w_lo["block_params"]
        entry: dict[str, Any] = {"row": name, "gemm_mode": gemm,
                                 "depths": [r["row"].split("@")[1] for r in rs],
                                 "blocks": [r["width"]["blocks"] for r in rs],
                                 "full_blocks": w_lo["full_blocks"],
                                 "peak_mb": [r["rss_calibrate_mb"] for r in rs],
                                 "float_peak_mb": [r["rss_float_mb"] for r in rs],
                                 "params": [r["width"]["params"] for r in rs]}  # fmt: skip
        if d_params > 0:
            bytes_per_param = 2 if lo.get("model_dtype") == "bfloat16" else 4
            rest = w_lo["full_block_params"] - w_lo["block_params"]
            for key, field in (("calibrate", "rss_calibrate_mb"), ("float", "rss_float_mb")):
                per_param = (hi[field] - lo[field]) / d_params  # MB per block parameter
                entry[f"{key}_mb_per_block"] = [
                    per_param * n / max(c, 1)
                    for n, c in zip(w_lo["kind_params"], w_lo["blocks"], strict=True)
                ]
                entry[f"{key}_full_depth_mb"] = lo[field] + per_param * rest
            entry["weights_mb_per_block"] = [
                n / max(c, 1) * bytes_per_param / 2**20
                for n, c in zip(w_lo["kind_params"], w_lo["blocks"], strict=True)
            ]
            entry["increment_over_weights"] = (hi["rss_calibrate_mb"] - lo["rss_calibrate_mb"]) / (
                d_params * bytes_per_param / 2**20)  # fmt: skip
        out.append(entry)
    return out


def _print(rows: list[dict[str, Any]], peers: dict[tuple[str, str], dict[str, Any]]) -> None:
    keys = ["pass 1", "decide first", "alpha search", "pass 2", "attribution", "holdout",
            "quantize", "measure", "export"]  # fmt: skip
    head = f"{'row':26} {'gemm':27} {'float s':>8} {'calib s':>8} {'fwd-eq':>7} "
    head += " ".join(f"{k[:7]:>7}" for k in keys)
    print(head + f" {'RSS x':>6} {'peak MB':>8} {'pre-exp x':>9} {'float before/after s':>20}"
          f" {'load':>9}")  # fmt: skip
    for r in rows:
        eq = [r["phases"].get(k, 0.0) / r["float_s"] for k in keys]
        paths = r["gemm"]["int8_gemm"]  # what each size class ran: small/large products
        gemm = f"{r['gemm_mode']}:{paths['small'][:6]}/{paths['large'][:6]}"
        load = r.get("loadavg_1min", [0.0, 0.0])
        print(f"{r['row']:26} {gemm:27} {r['float_s']:8.1f} {r['total_s']:8.1f} "
              f"{r['total_s'] / r['float_s']:7.1f} "
              + " ".join(f"{e:7.1f}" for e in eq)
              + f" {r['peak_rss_ratio']:6.2f} {r['rss_calibrate_mb']:8.0f}"
              + f" {r['rss_before_export_mb'] / max(r['rss_float_mb'], 1e-9):9.2f}"
              + f" {r['float_before_s']:9.1f} /{r['float_after_s']:7.1f}"
              + f" {load[0]:4.1f}/{load[1]:4.1f}")  # fmt: skip


def _print_peer(rows: list[dict[str, Any]]) -> None:
    print("\nside by side with msModelSlim " + PEER_VERSION + " (its llm_ptq Calibrator, cpu; "
          "its seconds: load + Calibrator + run + save; ratio = ours / its):")  # fmt: skip
    schemes = sorted({s for r in rows for s in r.get("peer", {}) if s != "n/a"})
    head = f"{'row':26} {'gemm':12} {'ours s':>8} {'fwd-eq':>7}"
    for s in schemes:
        head += f" {s + ' s':>18} {'ratio':>6} {'its MB':>7}"
    print(head)
    for r in rows:
        peer = r.get("peer")
        if peer is None:
            continue
        line = f"{r['row']:26} {r['gemm_mode']:12} {r['seconds']:8.1f} {r['fwd_eq']:7.1f}"
        if "n/a" in peer:
            print(line + f"  n/a: {peer['n/a']}")
            continue
        for s in schemes:
            v = peer.get(s, {})
            if "seconds" in v:
                line += f" {v['seconds']:18.1f} {r['seconds'] / v['seconds']:6.1f}"
                line += f" {v['rss_peak_mb']:7.0f}"
            else:
                line += f" {'failed':>18} {'':6} {'':7}"
        print(line)


def _print_depth(depth: list[dict[str, Any]]) -> None:
    print("\nwidth rows: peak RSS per depth, the increment per block (apportioned to block kinds "
          "by parameters) and the peaks extrapolated to full depth (MB):")  # fmt: skip
    for e in depth:
        print(f"{e['row']} ({e['gemm_mode']}): blocks {e['blocks']} -> full {e['full_blocks']}; "
              f"calibrate peak {[round(x) for x in e['peak_mb']]}, float inference peak "
              f"{[round(x) for x in e['float_peak_mb']]}")  # fmt: skip
        if "calibrate_mb_per_block" not in e:
            continue
        print(
            f"  per block (each kind): weights {[round(x) for x in e['weights_mb_per_block']]},"
            f" calibrate +{[round(x) for x in e['calibrate_mb_per_block']]},"
            f" float +{[round(x) for x in e['float_mb_per_block']]};"
            f" calibrate increment / weight increment {e['increment_over_weights']:.2f}"
        )
        print(
            f"  at full depth: calibrate {e['calibrate_full_depth_mb'] / 1024:.1f} GiB, "
            f"float inference {e['float_full_depth_mb'] / 1024:.1f} GiB "
            f"(x{e['calibrate_full_depth_mb'] / max(e['float_full_depth_mb'], 1e-9):.2f})"
        )


if __name__ == "__main__":
    main()
