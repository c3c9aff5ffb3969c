"""MindIE-SD 3.1.0's own ``quantize()`` on our export, in the engine's environment.

Run by ``tests/conformance/test_mindie_sd_engine.py`` as a subprocess with
``PYTHONPATH=<engine dir>:<torch_npu stand-in>:<repository>``::

    python tests/conformance/mindie_sd_engine_run.py JOB.json RESULT.json

For each case of the job: build the float model (``mindie_sd_models``; or load a diffusers model
directory, ``model_dir``), load its float weights, cast it to the case's dtype (bfloat16,
MindIE-SD's default, unless ``dtype`` says float16), call ``mindiesd.quantize(model, desc,
dtype=...)`` unmodified, run the saved inputs (each step of a W8A8_TIMESTEP table after
``TimestepManager.set_timestep_idx``, and an unregistered step: the dynamic branch) and save the
outputs; an exception of the engine's while it runs is the case's result (``error``). Also
(``refuse`` in the job): what ``quantize`` raises on a weights file of mode 0o644, and what
3.1.0's ``TimestepPolicyConfig.register`` raises without a ``target``. Nothing here computes a
quantized value itself.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import mindiesd
import torch
import torch_npu  # the stand-in (on this PYTHONPATH only)
from mindiesd import TimestepManager, TimestepPolicyConfig, quantize
from safetensors.torch import load_file, save_file

from tests.conformance.mindie_sd_models import build, build_dir, forward

ENGINE_LAYERS = "mindiesd.quantization.layer"


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    dtype = getattr(torch, case.get("dtype", "bfloat16"))
    model = build(case["model"]) if "model" in case else build_dir(case["model_dir"])
    if "state" in case:
        model.load_state_dict(load_file(case["state"]))
    model.to(dtype).eval()
    kwargs: dict[str, Any] = {"dtype": dtype} if "dtype" in case else {}
    steps = case.get("steps")
    if steps:
        policy = TimestepPolicyConfig()
        policy.register(range(steps), "static", target="w8a8_static_linear")
        kwargs["timestep_config"] = policy
    quantize(model, case["desc"], **kwargs)
    replaced = {
        name: type(m).__name__
        for name, m in model.named_modules()
        if type(m).__module__ == ENGINE_LAYERS
    }
    inputs = {k: v.to(dtype) for k, v in load_file(case["inputs"]).items()}
    outputs = {}
    try:
        _run(model, inputs, steps, outputs)
    except Exception as exc:  # the engine's refusal is the case's result
        return {"replaced": replaced, "error": _error(exc)}
    save_file(outputs, case["out"])
    return {"replaced": replaced}


def _run(model: Any, inputs: dict[str, torch.Tensor], steps: int | None, outputs: dict) -> None:
    if steps:
        for t in range(steps):
            TimestepManager.set_timestep_idx(t)
            outputs[f"step{t}"] = forward(model, inputs).contiguous()
        # a step with no registered strategy: the default, "dynamic" (config.py 32-41); step T
        # itself is accepted (utils.py 259: only a step past T is refused)
        TimestepManager.set_timestep_idx(steps)
        outputs["dynamic"] = forward(model, inputs).contiguous()
    else:
        outputs["y"] = forward(model, inputs).contiguous()


def main(job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    from mindiesd.utils.utils import is_npu_available

    result: dict[str, Any] = {
        "mindiesd": mindiesd.__file__,
        "stand_in": bool(getattr(torch_npu, "STAND_IN", False)),
        "npu_available": is_npu_available(),
        "torch": torch.__version__,
        "cases": {name: run_case(case) for name, case in job["cases"].items()},
    }
    if "refuse" in job:
        try:
            quantize(build("block").to(torch.bfloat16), job["refuse"])
            result["refused"] = None
        except Exception as exc:
            result["refused"] = _error(exc)
        try:
            TimestepPolicyConfig().register(range(2), "static")
            result["register_default_target"] = None
        except Exception as exc:
            result["register_default_target"] = _error(exc)
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
