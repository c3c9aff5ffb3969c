"""vLLM 0.23.0 + vllm-ascend 0.23.0.post1's own code on our ``export/ascendv1/``, in the engines'
environment.

Run by ``tests/conformance/test_vllm_ascend_engine.py`` as a subprocess with
``PYTHONPATH=<.engines/vllm-0.23.0>:<.engines/vllm-ascend-0.23.0.post1>:<torch_npu stand-in>:
<repository>``::

    python tests/conformance/vllm_ascend_engine_run.py JOB.json RESULT.json

For each export of the job, as ``vllm serve DIR --quantization ascend`` does it: vLLM's
``EngineArgs`` resolve the model config (``--dtype auto`` from our config.json), vLLM builds the
``WhisperForConditionalGeneration`` with vllm-ascend's ModelSlim config picking each layer's method
and vllm-ascend's Linear classes, vLLM's default loader reads our safetensors through Whisper's
``load_weights`` and runs ``process_weights_after_loading``. Then each quantized Linear's
``forward`` (its method's ``apply``) on the job's inputs, the tied head's logits and the
embedding are saved. Nothing of either engine is patched; nothing here computes a quantized
value itself.

What the harness provides, each standing in for what only an NPU process has (``V`` = the vllm
package, ``A`` = vllm_ascend):

- No platform plugin: vllm_ascend is not pip-installed, so its ``vllm.platform_plugins`` entry
  point (``A/__init__.py:38-41`` ``register``) is absent and vLLM runs on its
  ``UnspecifiedPlatform`` (``V/platforms/__init__.py``). Its ``supported_dtypes`` (what
  ``--dtype auto`` chooses from) is the base ``Platform``'s, which ``NPUPlatform`` does not
  override: checked below.
- ``import vllm_ascend.quantization.modelslim_config``: registers the ``ascend`` quantization
  method, as ``NPUPlatform.pre_register_and_update`` does (``A/platform.py:200``).
- ``DeviceConfig(device="cpu")``: the NPU worker's device is ``npu`` (no such device here).
- What ``NPUWorker.__init__`` runs before loading (``A/worker/worker.py:118-120``):
  ``register_ascend_customop`` (vLLM's Linear classes become vllm-ascend's) and
  ``init_ascend_config``; ``set_weight_prefetch_method`` as the model runner does
  (``A/worker/model_runner_v1.py:337-338``); the distributed init of
  ``NPUWorker._init_worker_distributed_environment`` (``A/worker/worker.py:992-1000``) with
  ``gloo`` for ``hccl``, world size 1. Not applied: ``adapt_patch()`` (``worker.py:110``), whose
  package ``A/patch/worker/__init__.py`` imports every model patch (qwen3_5 -> qwen3_vl needs
  torchvision, mamba_utils -> llguidance); none touches Whisper or these Linear methods, and the
  one about loading (``patch_process_weights_after_loading.py``) differs from vLLM's
  ``V/model_executor/model_loader/utils.py:99-127`` only for DSA attention.
- The attention backend: ``UnspecifiedPlatform.get_attn_backend_cls`` returns ``""``
  (``V/platforms/interface.py:260-267``) and building Whisper's decoder ``Attention`` fails, so
  ``current_platform.get_attn_backend_cls`` is ``NPUPlatform.get_attn_backend_cls``
  (``A/platform.py:815-841``: vllm-ascend's own choice, ``AscendAttentionBackend``).
- CPU kernels for the two custom ops vllm-ascend registers for ``PrivateUse1`` only
  (``direct_register_custom_op(..., dispatch_key="PrivateUse1")``): ``vllm::quantize``
  (``A/ops/register_custom_ops.py:276-282``) and ``vllm::unquantized_gemm``
  (``A/ops/linear.py:70-76``), registered for ``CPU`` with the engine's own functions
  (``_quantize_impl``: ``torch_npu.npu_quantize(x, 1 / input_scale, input_offset, qint8, -1,
  False)``; ``unquantized_gemm``: ``F.linear``).

What cannot run here: the decoder's attention (vllm-ascend's ``AscendAttentionBackendImpl``
calls NPU kernels, ``torch_npu._npu_paged_attention`` / ``npu_fused_infer_attention_score``, on
the paged KV cache the NPU model runner allocates), hence no decoding step and no transcript.
The encoder does run (its attention is vLLM's ``MMEncoderAttention`` on torch SDPA): its output
on the job's features is saved too.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch_npu  # the stand-in (on this PYTHONPATH only)
import vllm
import vllm_ascend
import vllm_ascend.quantization.modelslim_config  # registers the "ascend" quantization
from safetensors.torch import load_file, save_file
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.model_loader import get_model_loader
from vllm.platforms import current_platform
from vllm.platforms.interface import Platform
from vllm_ascend.ascend_config import get_ascend_config, init_ascend_config
from vllm_ascend.ops import linear as ascend_linear
from vllm_ascend.ops import register_custom_ops
from vllm_ascend.platform import NPUPlatform
from vllm_ascend.utils import register_ascend_customop, set_weight_prefetch_method

_LIB = torch.library.Library("vllm", "IMPL")  # CPU kernels = the engine's own functions
_LIB.impl("quantize", register_custom_ops._quantize_impl, "CPU")
_LIB.impl("unquantized_gemm", ascend_linear.unquantized_gemm, "CPU")
current_platform.get_attn_backend_cls = NPUPlatform.get_attn_backend_cls  # type: ignore[method-assign]


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:2000]}


def _platform() -> dict[str, Any]:
    return {
        "platform": type(current_platform).__name__,
        "supported_dtypes": [str(d) for d in current_platform.supported_dtypes],
        # NPUPlatform inherits the base Platform's property (it defines none of its own)
        "npu_supported_dtypes_inherited": NPUPlatform.supported_dtypes is Platform.supported_dtypes,
    }


_DISTRIBUTED: list[bool] = []


def load(directory: str, dist_init: str) -> tuple[Any, VllmConfig, dict[str, torch.Tensor]]:
    """vLLM's model config (as ``vllm serve DIR --quantization ascend``), then the model as the
    NPU worker loads it. Returns the model, the config and every parameter as the loader left it
    (after ``load_weights``, before ``process_weights_after_loading``)."""
    model_config = EngineArgs(model=directory, quantization="ascend").create_model_config()
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    register_ascend_customop(vllm_config)
    init_ascend_config(vllm_config)
    loaded: dict[str, torch.Tensor] = {}
    with set_current_vllm_config(vllm_config):
        if not _DISTRIBUTED:
            init_distributed_environment(1, 0, dist_init, 0, "gloo")
            ensure_model_parallel_initialized(1, 1)
            _DISTRIBUTED.append(True)
        set_weight_prefetch_method(get_ascend_config().weight_prefetch_config)
        loader = get_model_loader(vllm_config.load_config)
        load_weights = loader.load_weights

        def spy(model: torch.nn.Module, config: Any) -> None:  # the loader's own call, observed
            load_weights(model, config)
            for name, p in model.named_parameters(remove_duplicate=False):
                loaded[name] = p.detach().clone()

        loader.load_weights = spy  # type: ignore[method-assign]
        model = loader.load_model(vllm_config=vllm_config, model_config=model_config)
    return model, vllm_config, loaded


def run_export(job: dict[str, Any], dist_init: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    try:  # the dtype vLLM resolves, also for a directory it then fails to build a model from
        config = EngineArgs(model=job["dir"], quantization="ascend").create_model_config()
        result["resolved_dtype"] = str(config.dtype)
    except Exception as exc:
        result["config_error"] = _error(exc)
    try:
        model, vllm_config, loaded = load(job["dir"], dist_init)
    except Exception as exc:  # a refusal of the engine's is a result (the test says which)
        result["load_error"] = _error(exc)
        return result
    model_config = vllm_config.model_config
    result |= {
        "dtype": str(model_config.dtype),
        "config_dtype": str(getattr(model_config.hf_config, "dtype", None)),
        "quantization": model_config.quantization,
        "quant_config": type(vllm_config.quant_config).__name__,
        "architecture": type(model).__name__,
    }
    inputs = load_file(job["inputs"])
    # every parameter of the model as loaded (a tied one under each of its names)
    out = {f"loaded.{k}": t.contiguous() for k, t in loaded.items()}
    layers: dict[str, Any] = {}
    with set_current_vllm_config(vllm_config), torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, LinearBase):
                continue
            method = module.quant_method
            layers[name] = {
                "class": type(module).__name__,
                "method": type(method).__name__,
                "scheme": type(getattr(method, "quant_method", None)).__name__,
                "custom_op": type(module.custom_op).__name__ if module.custom_op else None,
            }
            # its parameters as the loader left them (the ones the method created: their dtype
            # is the method's rule), before process_weights_after_loading adds and reshapes
            mine = {k.removeprefix(f"{name}."): t for k, t in loaded.items()
                    if k.startswith(f"{name}.") and "." not in k.removeprefix(f"{name}.")}  # fmt: skip
            layers[name]["params"] = {p: [str(t.dtype), list(t.shape)] for p, t in mine.items()}
            if f"x.{name}" in inputs:
                y, _ = module(inputs[f"x.{name}"])  # forward -> quant_method.apply
                out[f"y.{name}"] = y.contiguous()
        head, embed = model.proj_out, model.model.decoder.embed_tokens
        result["head"] = {
            "method": type(head.quant_method).__name__,
            "tied": head.weight is embed.weight,
            "weight_shape": list(head.weight.shape),
            "embed_shape": list(embed.weight.shape),
            "embed_dtype": str(embed.weight.dtype),
        }
        out["embed"] = embed.weight.detach().contiguous()
        out["lookup"] = model.embed_input_ids(inputs["tokens"]).contiguous()
        out["logits"] = model.compute_logits(inputs["hidden"]).contiguous()
        try:
            (encoded,) = model.embed_multimodal(input_features=[inputs["features"]])
            out["encoder"] = encoded.contiguous()
        except Exception as exc:
            result["encoder_error"] = _error(exc)
    result["layers"] = layers
    save_file(out, job["out"])
    return result


def main(job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    result: dict[str, Any] = {
        "vllm": vllm.__file__,
        "vllm_version": vllm.__version__,
        "vllm_ascend": vllm_ascend.__file__,
        "stand_in": bool(getattr(torch_npu, "STAND_IN", False)),
        "torch": torch.__version__,
        **_platform(),
        "exports": {n: run_export(e, job["dist_init"]) for n, e in job["exports"].items()},
    }
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
