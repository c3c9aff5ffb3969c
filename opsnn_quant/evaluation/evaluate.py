"""``evaluate(baseline, candidate, suite)``: run both models on the same inputs and judge.

Thin orchestration of :mod:`opsnn_quant.evaluation.runner`: it loads the suite's data, applies
the suite's generation settings to both adapters, generates, measures quality, latency (per
stage, top modules, optional stability run) and assembles the :class:`AcceptanceReport`.
Backends are labelled on every figure: the fp32 baseline on CPU is ``cpu``; the quantized
candidate on CPU is the exact Ascend reference (``cpu-reference``), not a speed figure.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation.report import AcceptanceReport
from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.types import Modality

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def _records(suite: Suite) -> list[dict[str, Any]]:
    from opsnn_quant.models.data import load_records

    d = suite.data
    if d.dataset is not None:
        return load_records(f"zoo:{d.dataset}/{d.split}", d.samples)
    if d.folder is None:
        raise ConfigError(f"suite {suite.name}: data needs a dataset or a folder")
    folder = Path(d.folder)
    if suite.task == "t2i":
        return load_records(str(folder / "prompts.txt"), d.samples)
    return load_records(str(folder), d.samples)


def _apply_generation(adapter: ModelAdapter, suite: Suite) -> None:
    g = suite.generation
    settings = getattr(adapter, "settings", None)
    if settings is None or not dataclasses.is_dataclass(settings):
        return
    fields = {f.name for f in dataclasses.fields(settings)}
    wanted = {k: v for k, v in g.model_dump().items() if k in fields and v is not None}
    adapter.settings = dataclasses.replace(settings, **wanted)  # type: ignore[attr-defined,type-var]


def _clip(name: str | None) -> tuple[Any, Any, str] | None:
    if name is None:
        return None
    if Path(name).is_dir():
        from opsnn_quant.evaluation.clip_score import load_local_clip

        model, processor = load_local_clip(name)
        return model, processor, Path(name).name
    from opsnn_quant import zoo

    if name not in zoo.list():
        raise ConfigError(f"CLIP {name!r} is neither a local directory nor a zoo model")
    from opsnn_quant.zoo.shapes_clip import load_shapes_clip_processor

    return zoo.load(name), load_shapes_clip_processor(), name


def _stages(adapter: ModelAdapter) -> dict[str, torch.nn.Module]:
    named = dict(adapter.model.named_modules())
    if adapter.family == "diffusers-sd":
        picks = {
            "text_encoder": "text_encoder",
            "denoise_step": "unet",
            "vae_decode": "vae.decoder",
        }
    elif adapter.family == "whisper":
        picks = {"audio_encoder": "model.encoder", "decoder_step": "model.decoder"}
    else:
        picks = {}
    return {stage: named[n] for stage, n in picks.items() if n in named}


def evaluate(
    baseline: ModelAdapter,
    candidate: ModelAdapter,
    suite: Suite,
    *,
    candidate_backend: str | None = None,
    policy: dict[str, Any] | None = None,
    sensitivity: Any | None = None,
    progress: Progress | None = None,
    created: str | None = None,
) -> tuple[AcceptanceReport, Any, Any]:
    """Evaluate ``candidate`` against ``baseline`` with ``suite``.

    Returns:
        ``(report, baseline_outputs, candidate_outputs)``: the outputs of the first seed (images
        or transcripts), for the report's image grids.
    """
    from opsnn_quant.evaluation.latency import measure
    from opsnn_quant.evaluation.profile import StageTimer, stability_run, top_modules
    from opsnn_quant.evaluation.runner import asr_quality, build_report, t2i_quality

    say = progress or (lambda m: log.info("%s", m))
    from opsnn_quant.quant.modules import is_quant_module

    has_int8 = any(is_quant_module(m) for m in candidate.model.modules())
    if candidate_backend is None:
        # A float candidate (e.g. the model cast to fp16) runs plain PyTorch eager.
        candidate_backend = "cpu-reference" if has_int8 else "cpu"
    for adapter in (baseline, candidate):
        _apply_generation(adapter, suite)
    records = _records(suite)
    notes: list[str] = []
    if suite.task == "t2i":
        from opsnn_quant.models.data import prompts_from

        prompts = prompts_from(records)
        base_out: list[Any] = []
        cand_out: list[Any] = []
        seeds: list[int] = []
        for seed in suite.seeds:
            say(f"generating {len(prompts)} images per model (seed {seed})")
            base_out += baseline.generate(prompts, seed=seed)
            cand_out += candidate.generate(prompts, seed=seed)
            seeds += [seed + i for i in range(len(prompts))]
        reference = None
        if suite.data.reference == "dataset":
            reference = [
                np.asarray(
                    r["image"].convert("RGB") if hasattr(r["image"], "convert") else r["image"]
                )
                for r in records
            ]
        clip = _clip(suite.metrics.clip)
        scorer = None
        features: Any = None
        if clip is not None:
            from opsnn_quant.evaluation.clip_score import ClipScorer

            scorer = ClipScorer(clip[0], clip[1], clip[2])
        if suite.metrics.fid_features == "clip":
            if clip is None:
                raise ConfigError("metrics.fid_features: clip needs metrics.clip")
            from opsnn_quant.evaluation.fid import ClipImageFeatures

            features = ClipImageFeatures.from_processor(clip[0], clip[1], clip[2])
        elif suite.metrics.fid_features == "inception":
            features = "inception"
        say("quality metrics")
        quality = t2i_quality(
            base_out,
            cand_out,
            prompts * len(suite.seeds),
            seeds=seeds,
            clip=scorer,
            fid_features=features,
            reference_images=reference,
        )
        batch = prompts[: suite.generation.batch_size]

        def work(a: ModelAdapter) -> Callable[[], Any]:
            return lambda: a.generate(batch, seed=0)

        items = len(batch)
    else:
        from opsnn_quant.models.data import audio_from

        audio = audio_from(records)
        refs = [str(r.get("text", "")) for r in records]
        say(f"transcribing {len(audio)} utterances per model")
        base_out = baseline.generate(audio)
        cand_out = candidate.generate(audio)
        quality = asr_quality(refs, base_out, cand_out)
        batch_audio = audio[: suite.generation.batch_size]

        def work(a: ModelAdapter) -> Callable[[], Any]:
            return lambda: a.generate(batch_audio)

        items = len(batch_audio)

    lat = suite.latency
    say("latency (baseline)")
    base_lat = measure(
        work(baseline), warmup=lat.warmup, runs=lat.runs, backend="cpu", items_per_call=items
    )
    say("latency (candidate)")
    cand_lat = measure(
        work(candidate),
        warmup=lat.warmup,
        runs=lat.runs,
        backend=candidate_backend,
        items_per_call=items,
    )
    stages = {}
    for label, a in (("baseline", baseline), ("candidate", candidate)):
        picks = _stages(a)
        if picks:
            with StageTimer(picks) as st:
                work(a)()
            stages[label] = st.rows()
    tops = {}
    if lat.profile_top:
        say("profiling top modules")
        for label, a in (("baseline", baseline), ("candidate", candidate)):
            tops[label] = top_modules(a.model, work(a), top=lat.profile_top)
    stability = {}
    if lat.stability_k:
        say(f"stability run ({lat.stability_k} consecutive calls)")
        stability["candidate"] = stability_run(
            work(candidate), lat.stability_k, backend=candidate_backend
        )
    ort = None
    if lat.onnx_speed:
        say("ONNX Runtime speed figure (QDQ vs fp32 export)")
        from opsnn_quant.evaluation.ort_figure import onnx_speed

        ort = onnx_speed(candidate, records, suite, notes)
    if has_int8:
        notes.append(
            "CPU timings: the fp32 baseline runs PyTorch eager (cpu); the quantized candidate runs "
            "the exact Ascend int8 reference (cpu-reference), which is not a deployment speed figure"
        )
    else:
        notes.append(
            "CPU timings: baseline and candidate both run PyTorch eager (cpu); CPUs have no fast "
            "fp16 GEMM, so an fp16 candidate's CPU time says nothing about an NPU's"
        )
    report = build_report(
        suite,
        quality,
        baseline_latency=base_lat,
        candidate_latency=cand_lat,
        quality_backend=candidate_backend,
        stages=stages or None,
        top_modules=tops or None,
        stability=stability or None,
        onnxruntime=ort,
        policy=policy,
        sensitivity=sensitivity,
        notes=notes,
        created=created,
    )
    return report, base_out, cand_out


def policy_summary(out_dir: Path) -> dict[str, Any] | None:
    """A compact policy summary from a calibrate output directory (for the report)."""
    path = out_dir / "policy.yaml"
    if not path.is_file():
        return None
    from opsnn_quant.policy.schema import PrecisionPolicy

    pol = PrecisionPolicy.load(path)
    figures = {
        (m.value if isinstance(m, Modality) else str(m)): {
            "chosen": f.chosen,
            "predicted_sqnr_db": f.predicted_sqnr_db,
            "int8_mac_share": getattr(f, "int8_mac_share", None),
        }
        for m, f in pol.figures.items()
    }
    return {
        "model": pol.model,
        "target": pol.target,
        "rules": len(pol.rules),
        "modalities": figures,
    }


def load_candidate(out_dir: Path, family: str | None = None) -> tuple[ModelAdapter, Any]:
    """The candidate: a calibrate output directory (float source + ``quant/``) or a model source.

    A model source (``zoo:<name>`` or a model directory without ``quant/``) is loaded as is,
    e.g. to evaluate the float model cast to fp16.
    """
    from opsnn_quant.models import guess_family, load_adapter
    from opsnn_quant.probe.report import SensitivityReport
    from opsnn_quant.quant.checkpoint import load_quantized, read_description

    if not (out_dir / "quant").is_dir():
        source = str(out_dir)
        return load_adapter(family or guess_family(source), source), None
    desc = read_description(out_dir / "quant")
    source = str(desc.get("source_model") or "")
    if not source:
        raise ConfigError(f"{out_dir}/quant/description.json names no source model")
    adapter = load_adapter(family or guess_family(source), source)
    load_quantized(adapter.model, out_dir / "quant")
    probe_path = out_dir / "probe.json"
    sensitivity = SensitivityReport.load(probe_path) if probe_path.is_file() else None
    return adapter, sensitivity


def images_for_report(outputs: Sequence[Any]) -> list[np.ndarray] | None:
    """Outputs usable as report images (uint8 arrays), else None (transcripts)."""
    if outputs and isinstance(outputs[0], np.ndarray):
        return list(outputs)
    return None


def cast_adapter(adapter: ModelAdapter, dtype: torch.dtype) -> None:
    """Run the adapter's float modules in ``dtype`` (int8 buffers of quantized modules stay)."""
    from opsnn_quant.quant.modules import is_quant_module

    for module in adapter.model.modules():
        if is_quant_module(module):
            continue
        for _name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_floating_point():
                module._buffers[name] = b.to(dtype)
