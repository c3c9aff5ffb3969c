"""One msModelSlim calibration, timed, in msModelSlim's own virtual environment.

Run by ``bench_calibrate_scale.py --peer msmodelslim`` with the Python of the environment it
made (``msmodelslim==26.1.0`` from PyPI, torch, transformers/diffusers at our versions; no
torch_npu: msModelSlim's ``llm_ptq`` imports without it and says so in one warning). This file
imports nothing of ``opsnn_quant``: the model is read from its directory and the calibration
inputs from a ``torch.save`` file that the benchmark's own child wrote from our float forward
loop (exactly the tensors the model was called with there).

API: msModelSlim's ``msmodelslim.pytorch.llm_ptq.llm_ptq_tools`` (``Calibrator``,
``QuantConfig``), its documented post-training API for a PyTorch model given as an
``nn.Module`` with calibration data as a list of ``model(**inputs)`` calls, on ``dev_type='cpu'``:

* ``w8a8_dynamic``: ``QuantConfig(w_bit=8, a_bit=8, is_dynamic=True, w_sym=True,
  mm_tensor=False, act_method=1, pr=1.0, dev_type='cpu')``: int8 symmetric per-channel weights,
  per-token activations (msModelSlim's W8A8_DYNAMIC);
* ``w8a8``: the same with ``is_dynamic=False``: per-tensor static activations from min-max
  ranges (``act_method=1``), msModelSlim's W8A8.

``disable_level='L0'`` (no automatic fallback search) and msModelSlim's default
``disable_last_linear=True`` (the LM head of Whisper stays float). Then ``Calibrator.run()`` and
``Calibrator.save(OUT, save_type=[SAVE_TYPE])`` (its deployable weights and description), by
one of its two safetensors savers (``--save-type``):

* ``safe_tensor`` (the default; ``llm_ptq_tools/save/saver/safetensors.py``):
  ``quant_model_description_<type>.json`` and ``quant_model_weight_<type>.safetensors``, the
  files MindIE-SD's ``quantize()`` reads (static W8A8's ``deq_scale`` int64, the float32 bits,
  unless the model is bfloat16: ``complex_quantifier.py`` ``deqscale2int64_by_dtype``);
* ``ascendV1`` (``saver/ascend_v1.py``): ``quant_model_description.json`` (``version`` 1.0.0)
  and ``quant_model_weight_<type>.safetensors``, the AscendV1 files vLLM-Ascend reads.

The calls: Whisper's as keyword dicts (``input_features``, ``decoder_input_ids``): for a model
with ``generate`` msModelSlim's first pass (``get_features`` in ``Calibrator.__init__``) runs
``model.generate(**call)`` (its LLM path: the prompt, then new tokens; capped by
``--max-new-tokens`` at our forward loop's ``max_new_tokens``, as a random-weight model never
ends a transcript and would run to the 448 positions of ``max_length``) and ``run()`` runs
``model(**call)``. A diffusion transformer has no ``generate``: its calls go as positional lists
(``model(*call)``, the form msModelSlim's DiT examples use and its error message asks for).

Its one-click ``msmodelslim quant`` (v1 API) has no Whisper adapter in 26.1.0; its FLUX.1 /
Wan2.1 adapters drive an NPU pipeline (``torch.npu.Stream``, ``enable_model_cpu_offload``), so
the v1 path cannot run here. Those adapters quantize only the ``transformer``; for a diffusion
row this harness does the same with the transformer's recorded calls.

Prints one line ``PEER {json}``: seconds of load, ``Calibrator(...)`` (its first pass over up to
five calls and the quantizer set-up), ``run()``, ``save()``; peak RSS; the Linear count it made int8.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path
from typing import Any


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def model_class(kind: str, model_dir: Path) -> tuple[Any, Path]:
    """The class of the model msModelSlim calibrates (imported here, before the clock starts:
    our calibrate's imports are not timed either) and its directory: the Whisper model, or a
    pipeline's transformer."""
    if kind == "whisper":
        from transformers import WhisperForConditionalGeneration

        return WhisperForConditionalGeneration, model_dir
    import diffusers

    sub = model_dir / "transformer"
    return getattr(diffusers, json.loads((sub / "config.json").read_text())["_class_name"]), sub


def load(kind: str, cls: Any, model_dir: Path, dtype_name: str) -> Any:
    """The model, in the row's dtype."""
    import torch

    dtype = getattr(torch, dtype_name)
    if kind != "whisper":
        return cls.from_pretrained(str(model_dir), torch_dtype=dtype).eval()
    model = cls.from_pretrained(str(model_dir), dtype=dtype).eval()
    # Whisper ties its LM head to the token embedding; msModelSlim's safetensors saver refuses
    # tensors that share memory, so the head gets its own copy (it stays float:
    # disable_last_linear), as a user of msModelSlim must do to save the result at all.
    model.proj_out.weight = torch.nn.Parameter(model.proj_out.weight.detach().clone())
    return model


def positional(model: Any, call: dict[str, Any]) -> list[Any]:
    """One recorded keyword call as the positional list msModelSlim runs as ``model(*call)``
    (the forward's parameters in order, defaults where the call left one out)."""
    params = list(inspect.signature(model.forward).parameters.values())
    names = [p.name for p in params]
    last = max(names.index(k) for k in call)
    return [call[n] if n in call else params[i].default for i, n in enumerate(names[: last + 1])]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--kind", choices=("whisper", "transformer"), required=True)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--data", required=True, type=Path, help="torch.save'd list of kwargs dicts")
    p.add_argument("--scheme", choices=("w8a8_dynamic", "w8a8"), required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--save-type", default="safe_tensor", choices=("safe_tensor", "ascendV1"),
                   help="msModelSlim's saver: MindIE-SD's files, or AscendV1's")  # fmt: skip
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="Whisper: the tokens its generate pass may decode (our loop's setting)")  # fmt: skip
    args = p.parse_args()

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    cls, model_dir = model_class(args.kind, args.model)
    t0 = time.perf_counter()
    model = load(args.kind, cls, model_dir, args.dtype)
    if args.max_new_tokens is not None:  # as our forward loop decodes (else up to max_length)
        model.generation_config.max_new_tokens = args.max_new_tokens
    data = torch.load(str(args.data), weights_only=False)
    if args.kind == "transformer":
        data = [positional(model, call) for call in data]
    t_load = time.perf_counter()
    base_kb = _hwm_kb()

    from msmodelslim.pytorch.llm_ptq.llm_ptq_tools import Calibrator, QuantConfig

    t_import = time.perf_counter()
    cfg = QuantConfig(w_bit=8, a_bit=8, disable_names=[], dev_type="cpu", act_method=1, pr=1.0,
                      w_sym=True, mm_tensor=False, is_dynamic=args.scheme == "w8a8_dynamic")  # fmt: skip
    calibrator = Calibrator(model, cfg, calib_data=data, disable_level="L0")
    t_init = time.perf_counter()
    calibrator.run()
    t_run = time.perf_counter()
    calibrator.save(str(args.out), save_type=[args.save_type])
    t_save = time.perf_counter()
    described: dict[str, str] = {}
    for f in sorted(args.out.glob("*.json")):
        try:
            described = json.loads(f.read_text())
            break
        except ValueError:
            continue
    int8 = sum(
        1 for k, v in described.items() if k.endswith(".weight") and str(v).startswith("W8A8")
    )
    result = {
        "scheme": args.scheme,
        "load_s": t_load - t0,
        "import_s": t_import - t_load,
        "init_s": t_init - t_import,
        "run_s": t_run - t_init,
        "save_s": t_save - t_run,
        # what the row's ratio divides by: load + Calibrator + run + save (not the import)
        "seconds": (t_load - t0) + (t_save - t_import),
        "calls": len(data),
        "int8_linears": int8,
        "quant_type": described.get("model_quant_type"),
        "rss_base_mb": base_kb / 1024,
        "rss_peak_mb": _hwm_kb() / 1024,
        "torch": torch.__version__,
    }
    print("PEER " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
