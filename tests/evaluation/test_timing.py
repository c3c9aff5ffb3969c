"""run_latency: exactly the calls each plan asks for, stages from the timed calls, one profile."""

from __future__ import annotations

import torch
from torch import nn

from opsnn_quant.evaluation.gate import plan_latency
from opsnn_quant.evaluation.suite import parse_suite
from opsnn_quant.evaluation.timing import run_latency, stage_modules
from opsnn_quant.policy.targets import get_target

STEPS = 3


class Pipe(nn.Module):
    """Module names of a diffusers pipeline: text_encoder, unet (called per step), vae.decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.text_encoder = nn.Linear(4, 4)
        self.unet = nn.Linear(4, 4)
        self.vae = nn.Module()
        self.vae.decoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.text_encoder(x)
        for _ in range(STEPS):
            h = self.unet(h)
        return self.vae.decoder(h)


class FakeAdapter:
    def __init__(self) -> None:
        self.model = Pipe()
        self.calls = 0

    def stages(self) -> dict[str, str]:
        return {"text_encoder": "text_encoder", "denoise_step": "unet", "vae_decode": "vae.decoder"}

    def run(self) -> None:
        self.calls += 1
        with torch.no_grad():
            self.model(torch.ones(1, 4))


def _suite(**latency):
    return parse_suite({
        "name": "s", "task": "t2i", "data": {"dataset": "shapes", "samples": 4},
        "metrics": {"fid_features": None, "thresholds": {"latency_p99_ratio_max": 1.0}},
        "latency": {"warmup": 1, "runs": 3, "profile_top": 2, "onnx_speed": True, **latency},
    })  # fmt: skip


def _run(mode, target="ascend910b-atc", candidate_backend="cpu-reference", **latency):
    suite = _suite(**latency)
    plan = plan_latency(suite, mode, target=get_target(target), baseline_backend="cpu",
                        candidate_backend=candidate_backend, onnx_possible=True)  # fmt: skip
    base, cand = FakeAdapter(), FakeAdapter()
    onnx_calls = []
    figures = run_latency(
        plan, suite, base, cand, work=lambda a: a.run, items=2,  # type: ignore[arg-type]
        baseline_backend="cpu", candidate_backend=candidate_backend,
        onnx=lambda: onnx_calls.append(1), say=lambda m: None,
    )  # fmt: skip
    return figures, base.calls, cand.calls, len(onnx_calls)


def test_stage_modules_come_from_the_adapter():
    picks = stage_modules(FakeAdapter())  # type: ignore[arg-type]
    assert list(picks) == ["text_encoder", "denoise_step", "vae_decode"]


def test_all_times_both_models_once_each_way_and_profiles_once():
    figures, base_calls, cand_calls, onnx_calls = _run("all", stability_k=4)
    # warmup 1 + runs 3 + memory 1 + one profiled call; the candidate adds the stability run.
    assert base_calls == 1 + 3 + 1 + 1 and cand_calls == 6 + 4 and onnx_calls == 1
    assert figures.baseline is not None and figures.baseline.runs == 3
    assert figures.candidate is not None and figures.candidate.backend == "cpu-reference"
    # Stage rows come from the 3 timed calls only: not the warmup, memory or profile calls.
    stages = {s.stage: s for s in figures.stages["candidate"]}
    assert stages["denoise_step"].calls == 3 * STEPS and stages["text_encoder"].calls == 3
    assert [len(figures.top_modules[k]) for k in ("baseline", "candidate")] == [2, 2]
    assert all(m.calls in (1, STEPS) for m in figures.top_modules["candidate"])  # one call
    assert figures.stability["candidate"].k == 4


def test_target_mode_on_a_cpu_for_an_ascend_policy_times_nothing():
    # the ONNX Runtime figure the criterion reads is NOT JUDGED for an Ascend policy (issue 43)
    figures, base_calls, cand_calls, onnx_calls = _run("target")
    assert (base_calls, cand_calls, onnx_calls) == (0, 0, 0)
    assert figures.baseline is None and not figures.stages and not figures.top_modules


def test_target_mode_on_the_device_skips_onnxruntime():
    figures, base_calls, cand_calls, onnx_calls = _run("target", candidate_backend="npu")
    assert (base_calls, cand_calls, onnx_calls) == (6, 6, 0)
    assert figures.candidate is not None and figures.candidate.backend == "npu"


def test_none_times_nothing():
    assert _run("none")[1:] == (0, 0, 0)


def test_target_mode_for_a_cpu_policy_times_only_onnxruntime():
    figures, base_calls, cand_calls, onnx_calls = _run("target", target="cpu-reference")
    assert (base_calls, cand_calls, onnx_calls) == (0, 0, 1)
    assert figures.baseline is None
