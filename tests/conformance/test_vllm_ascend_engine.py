"""Conformance: vLLM 0.23.0 and vllm-ascend 0.23.0.post1's own code (from PyPI, unmodified) load
the ``export/ascendv1/`` that ``opsnn-quant calibrate whisper-tiny-en`` writes for target
``ascend910b-vllm-ascend`` (``--strategy all-w8a8-minmax``: static W8A8; ``all-w8a8-dynamic``)
as ``vllm serve OUT/export/ascendv1 --quantization ascend`` does, and compute our quantized
modules' outputs bit for bit.

The engines run in a subprocess (``vllm_ascend_engine_run.py``, which lists what its harness
provides and why) with the project's python and torch and ``PYTHONPATH=<.engines/vllm-0.23.0>:
<.engines/vllm-ascend-0.23.0.post1>:<torch_npu stand-in>:<repository>``
(``tests/conformance/engines.sh`` installs them; CI fails without them, elsewhere the tests skip).
Their code decides, with its own rules: the dtype (vLLM's ``--dtype auto`` on our config.json),
each layer's method (vllm-ascend's ModelSlim config on our description, with vLLM's Whisper
prefixes and fused q/k/v), each parameter's dtype and how our tensors are copied into it (vLLM's
Whisper ``load_weights``, its fused-shard loaders, its skipped ``proj_out.*``, its head tied to
the embedding), ``process_weights_after_loading`` and each Linear's ``apply``.

What this cannot check on a CPU: the torch_npu operators (the stand-in forwards ``npu_quantize``,
``npu_quant_matmul``, ``npu_dynamic_quant`` to this package's references, ``opsnn_quant.ascend``,
pinned to the NPU elsewhere: tests/ascend), and a full-model forward: the decoder's attention is
vllm-ascend's ``AscendAttentionBackendImpl`` (NPU kernels on the NPU model runner's paged KV
cache), so no decoding step, no transcript. The encoder does run through vLLM's own code (its
attention is torch SDPA): the static export's equals our quantized encoder in bf16 bit for bit.
The dynamic export's encoder does not run: vllm-ascend's W8A8_DYNAMIC ``apply``
(``w8a8_dynamic.py:82-121``) passes the per-token scale of the encoder's 3-D activations as
(batch, tokens), which torch_npu's documented ``npu_quant_matmul`` (1-D, M elements; our
reference) refuses: to be confirmed on a device.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from opsnn_quant.formats.ascendv1.vllm_prefixes import aliased_key, is_alias
from opsnn_quant.formats.checkpoint import load_quantized
from opsnn_quant.models import load_adapter
from opsnn_quant.models.data import load_records
from opsnn_quant.pipeline.recipe import builtin_recipes
from opsnn_quant.quant.modules import is_quant_module
from tests._deps import needs_espeak

pytestmark = needs_espeak  # the zoo's calibration speech is generated with espeak-ng

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENGINES = Path(os.environ.get("OPSNN_QUANT_ENGINES", REPO / ".engines"))
VLLM = ENGINES / "vllm-0.23.0"
ASCEND = ENGINES / "vllm-ascend-0.23.0.post1"
STAND_IN = HERE / "torch_npu_stand_in"
BF16 = torch.bfloat16
STRATEGIES = {"static": "all-w8a8-minmax", "dynamic": "all-w8a8-dynamic"}
SCHEME = {"static": "AscendW8A8LinearMethod", "dynamic": "AscendW8A8DynamicLinearMethod"}
ROWS = 48  # activation rows per layer kept from our model's run
# vLLM's fused layers: vLLM name -> the checkpoint's shards (whisper.py 805-808, 629-636)
FUSED = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "encoder_attn.kv_proj": ("k_proj", "v_proj")}  # fmt: skip
# per-tensor parameters: no output_dim, so every shard is copied into the same [1] and the last
# one stays (vllm model_executor/layers/linear.py 1375-1384 QKV, 853-863 Merged)
PER_TENSOR = ("input_scale", "input_offset")


def _engine_dirs() -> list[Path]:
    dirs = [VLLM, ASCEND]
    if all((d / ".complete").is_file() for d in dirs) and (ASCEND / "vllm_ascend").is_dir():
        return dirs
    why = f"vLLM 0.23.0 / vllm-ascend 0.23.0.post1 are not installed in {ENGINES}: run tests/conformance/engines.sh"  # fmt: skip
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must build them: .ci/run does)")
    pytest.skip(why)


def _hf_names(vllm_name: str) -> list[str]:
    """The checkpoint modules a vLLM Linear is loaded from (its mapper: ``.fc1.`` ->
    ``.mlp.fc1.``, whisper.py 810-812; fused shards)."""
    head, _, leaf = vllm_name.rpartition(".")
    kind = head.rpartition(".")[2]
    joined = f"{kind}.{leaf}"
    if joined in FUSED:
        return [f"{head}.{shard}" for shard in FUSED[joined]]
    return [vllm_name.replace(".mlp.fc", ".fc")]


def _hf_tensor(vllm_param: str) -> str:
    return vllm_param.replace(".mlp.fc", ".fc")


def _calibrate(tmp: Path) -> dict[str, Path]:
    """Both exports, as a user writes them (the zoo recipe; one calibration and one held-out
    utterance, to keep CI short), at once."""
    recipe = yaml.safe_load(builtin_recipes()["whisper-tiny-en"].read_text())
    recipe["data"] |= {"limit": 1, "holdout_limit": 1}
    (tmp / "whisper-tiny-en.yaml").write_text(yaml.safe_dump(recipe))
    procs = {}
    for name, strategy in STRATEGIES.items():
        cmd = [sys.executable, "-m", "opsnn_quant", "calibrate", str(tmp / "whisper-tiny-en.yaml"),
               "--strategy", strategy, "-q", "-o", str(tmp / name)]  # fmt: skip
        procs[name] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for name, proc in procs.items():
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"calibrate {STRATEGIES[name]}: {log[-3000:]}"
    return {name: tmp / name for name in STRATEGIES}


def _ours(outs: dict[str, Path]) -> SimpleNamespace:
    """Our quantized models (the float zoo model + each OUT/quant) and the static one run on one
    held-out utterance: each quantized module's input rows (bf16: the params dtype; the same
    rows feed both exports' modules), the utterance's features and our encoder's output on them
    in bf16."""
    adapter = load_adapter("whisper", "zoo:whisper-tiny.en", batch_size=1, max_new_tokens=4)
    float_model = copy.deepcopy(adapter.model)
    models = {
        name: load_quantized(adapter.model if name == "static" else copy.deepcopy(float_model),
                             out / "quant").eval()
        for name, out in outs.items()
    }  # fmt: skip
    model = models["static"]
    rows: dict[str, list[torch.Tensor]] = {}
    hooks = [
        m.register_forward_hook(
            lambda m, args, y, n=n: rows.setdefault(n, []).append(args[0].reshape(-1, args[0].shape[-1]))
        )
        for n, m in model.named_modules() if is_quant_module(m)
    ]  # fmt: skip
    records = load_records("zoo:speech/eval", 1)
    features = adapter.features(adapter.evaluation_inputs(records))
    with torch.no_grad():
        adapter.forward_loop(records)(model)
        for h in hooks:
            h.remove()
        # the encoder as vLLM runs it: every float parameter in the model dtype (bf16)
        encoded = _in_bf16(copy.deepcopy(model)).model.encoder(features.to(BF16)).last_hidden_state
    inputs = {n: torch.cat(r)[:ROWS].to(BF16) for n, r in rows.items()}
    return SimpleNamespace(models=models, inputs=inputs, features=features[0], encoder=encoded[0])


def _in_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """The float modules' parameters and buffers in bfloat16 (``set_default_torch_dtype`` of the
    model dtype while vLLM builds the model, the loader's ``copy_`` casts into them); the
    quantized modules' tensors stay as frozen."""
    for module in model.modules():
        if not is_quant_module(module):
            for p in module.parameters(recurse=False):
                p.data = p.data.to(BF16)
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.to(BF16))
    return model


def _job_inputs(ours: SimpleNamespace, layers: list[str]) -> dict[str, torch.Tensor]:
    """Per vLLM Linear, the rows our model fed its (first) checkpoint module."""
    g = torch.Generator().manual_seed(0)
    x = {f"x.{n}": ours.inputs[_hf_names(n)[0]] for n in layers}
    x["tokens"] = torch.tensor([50257, 50362, 440, 2068, 50256])  # <|startoftranscript|> ... eot
    x["hidden"] = (torch.randn(3, 384, generator=g) * 2).to(BF16)
    x["features"] = ours.features.to(BF16)
    return x


def _vllm_layers(config: dict[str, Any]) -> list[str]:
    names = []
    for side, ffn in (("encoder", ["self_attn.qkv_proj", "self_attn.out_proj"]),
                      ("decoder", ["self_attn.qkv_proj", "self_attn.out_proj", "encoder_attn.q_proj",
                                   "encoder_attn.kv_proj", "encoder_attn.out_proj"])):  # fmt: skip
        for i in range(config[f"{side}_layers"]):
            names += [f"model.{side}.layers.{i}.{n}" for n in (*ffn, "mlp.fc1", "mlp.fc2")]
    return names


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    engine_dirs = _engine_dirs()
    tmp = tmp_path_factory.mktemp("vllm_ascend_engine")
    outs = _calibrate(tmp)
    ours = _ours(outs)
    cases: dict[str, Any] = {}
    job: dict[str, Any] = {"dist_init": f"file://{tmp / 'dist-init'}", "exports": {}}
    for name, out in outs.items():
        export = out / "export" / "ascendv1"
        config = json.loads((export / "config.json").read_text())
        layers = _vllm_layers(config)
        inputs = _job_inputs(ours, layers)
        save_file(inputs, tmp / f"{name}-inputs.st")
        job["exports"][name] = {"dir": str(export), "inputs": str(tmp / f"{name}-inputs.st"),
                                "out": str(tmp / f"{name}-engine.st")}  # fmt: skip
        cases[name] = SimpleNamespace(
            out=out, export=export, config=config, ours=ours, model=ours.models[name],
            layers=layers, inputs=inputs,
            description=json.loads((export / "quant_model_description.json").read_text()),
            tensors=load_file(export / "quant_model_weights.safetensors"),
        )  # fmt: skip
    # the static export as the checkpoint names alone describe it (no vLLM-prefix aliases)
    bare = tmp / "static-without-aliases"
    shutil.copytree(cases["static"].export, bare)
    doc = {k: v for k, v in cases["static"].description.items() if not is_alias(k)}
    (bare / "quant_model_description.json").write_text(json.dumps(doc, indent=4))
    job["exports"]["without_aliases"] = {"dir": str(bare), "inputs": "", "out": ""}
    (tmp / "job.json").write_text(json.dumps(job))
    home = tmp / "home"
    home.mkdir()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([*map(str, engine_dirs), str(STAND_IN), str(REPO)]),
        HOME=str(home),  # vLLM's caches and config (~/.cache/vllm, ~/.config/vllm)
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "vllm_ascend_engine_run.py"), str(tmp / "job.json"),
         str(tmp / "result.json")],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    result = json.loads((tmp / "result.json").read_text())
    cases["without_aliases"] = SimpleNamespace(result=result["exports"]["without_aliases"])
    for name, case in cases.items():
        case.result = result["exports"][name]
        case.engine = (
            load_file(job["exports"][name]["out"]) if "load_error" not in case.result else {}
        )
    return SimpleNamespace(result=result, cases=cases, home=home)


def test_the_engines_are_vllm_0_23_0_and_vllm_ascend_0_23_0_post1_on_the_stand_in(engine_run):
    r = engine_run.result
    assert Path(r["vllm"]).resolve().is_relative_to(VLLM.resolve())
    assert Path(r["vllm_ascend"]).resolve().is_relative_to(ASCEND.resolve())
    assert r["vllm_version"] == "0.23.0"
    assert r["stand_in"] and r["torch"] == torch.__version__  # the project's torch
    # --dtype auto chooses among the platform's supported dtypes: the NPU platform's are the
    # base Platform's (vllm_ascend/platform.py defines none), as here
    assert r["npu_supported_dtypes_inherited"]
    assert r["supported_dtypes"][0] == "torch.bfloat16"


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_vllm_serve_picks_the_params_dtype_from_our_config(engine_run, name):
    """vLLM's own config resolution (``EngineArgs(model, quantization="ascend")``, ``--dtype
    auto``) on our config.json gives the dtype our Linears were calibrated and written for."""
    case = engine_run.cases[name]
    params_dtype = case.description["metadata"]["opsnn_quant"]["params_dtype"]
    assert "load_error" not in case.result, case.result.get("load_error")
    assert case.result["dtype"] == case.result["config_dtype"] == f"torch.{params_dtype}"
    assert params_dtype == "bfloat16"
    assert case.result["quantization"] == "ascend"
    assert case.result["quant_config"] == "AscendModelSlimConfig"


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_engine_loads_every_tensor_of_the_export(engine_run, name):
    """Every parameter vLLM's Whisper has holds our tensor (cast as the loader's ``copy_`` casts
    it into the dtype the engine created): none is left as created (``torch.empty``); every
    tensor of ours is loaded, but ``proj_out.weight`` (vLLM skips ``proj_out.*``, whisper.py
    1022, and ties the head to the embedding, 970). vLLM's fused layers hold their shards
    concatenated; the per-tensor input scale and offset (one [1] parameter for q, k and v) hold
    the last shard's, which ours make equal to the others'."""
    case = engine_run.cases[name]
    t, loaded = case.tensors, {k[7:]: v for k, v in case.engine.items() if k.startswith("loaded.")}
    used = set()
    for param, got in loaded.items():
        owner, _, suffix = param.rpartition(".")
        if param == "proj_out.weight":  # the tied head: the embedding parameter itself
            sources = ["model.decoder.embed_tokens.weight"]
        else:
            sources = [f"{m}.{suffix}" for m in _hf_names(owner)]
        missing = [s for s in sources if s not in t]
        # vLLM adds a zero bias for every k_proj (whisper.py 1029-1041); nothing else may miss
        assert all(s.endswith("k_proj.bias") for s in missing), (
            f"{param}: left as created {missing}"
        )
        parts = [t[s] if s in t else torch.zeros(t[f"{s[:-5]}.weight"].shape[0]) for s in sources]
        if suffix in PER_TENSOR:
            values = {tuple(p.tolist()) for p in parts}
            assert len(values) == 1, f"{param}: shards differ {values}: the engine keeps the last"
            want = parts[-1]
        else:
            want = torch.cat(parts)
        used.update(s for s in sources if s in t)
        assert got.shape == want.shape, param
        assert torch.equal(got, want.to(got.dtype)), f"{param}: not our tensor"
    assert sorted(set(t) - used) == ["proj_out.weight"]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_linear_gets_its_quantized_method_and_parameter_dtypes(engine_run, name):
    """vllm-ascend's ModelSlim config gives every one of vLLM's Whisper Linears (44: our 64
    checkpoint Linears, q/k/v and k/v fused) the W8A8 method of the export, with the parameter
    dtypes of its rules for a bfloat16 model (w8a8_static.py 46-71: deq_scale float32;
    w8a8_dynamic.py 60-73)."""
    case = engine_run.cases[name]
    layers = case.result["layers"]
    assert sorted(layers) == sorted(case.layers) and len(layers) == 44
    for lname, layer in layers.items():
        assert (layer["method"], layer["scheme"]) == ("AscendLinearMethod", SCHEME[name]), lname
        params = {p: d for p, (d, _) in layer["params"].items()}
        assert params["weight"] == "torch.int8"
        assert params["weight_scale"] == params["bias"] == "torch.bfloat16"
        if name == "static":
            assert params["deq_scale"] == "torch.float32" and params["quant_bias"] == "torch.int32"
            assert (
                params["input_scale"] == "torch.bfloat16" and params["input_offset"] == "torch.int8"
            )
    # 64 checkpoint Linears, each with a type in our description (and its vLLM-prefix alias)
    typed = {k for k, v in case.description.items() if k.endswith(".weight") and v != "FLOAT"}
    assert len([k for k in typed if not is_alias(k)]) == 64
    assert {aliased_key(k) for k in typed if is_alias(k)} == {k for k in typed if not is_alias(k)}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_quantized_layer_computes_our_modules_bit_for_bit(engine_run, name):
    """After ``process_weights_after_loading``, each of the engine's quantized Linears (its
    ``forward``: the method's ``apply``) on the rows our model fed the layer equals our quantized
    modules' output (the shards' outputs concatenated for a fused layer), bit for bit in bf16,
    and is not zero."""
    case = engine_run.cases[name]
    equal = nonzero = 0
    modules = dict(case.model.named_modules())
    with torch.no_grad():
        for lname in case.layers:
            x = case.ours.inputs[_hf_names(lname)[0]]
            ours = torch.cat([modules[m](x) for m in _hf_names(lname)], dim=-1)
            theirs = case.engine[f"y.{lname}"]
            assert theirs.dtype == ours.dtype == BF16, lname
            assert torch.equal(theirs, ours), (
                f"{lname}: {(theirs.float() - ours.float()).abs().max()}"
            )
            equal += 1
            nonzero += bool(theirs.ne(0).any())
    assert equal == nonzero == 44


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_tied_head_is_float_and_the_embedding_intact(engine_run, name):
    """Our description types ``proj_out.weight`` FLOAT: vllm-ascend gives the head vLLM's
    unquantized method (modelslim_config.py 665-677), the head is the embedding's parameter
    (whisper.py 970), and after ``process_weights_after_loading`` the embedding is ours: shape,
    values, token lookup; logits computable (the engine's ``compute_logits``) and equal to our
    head's in bf16."""
    case = engine_run.cases[name]
    head = case.result["head"]
    assert case.description["proj_out.weight"] == "FLOAT"
    assert head["method"] == "UnquantizedEmbeddingMethod" and head["tied"]
    ours = case.model.proj_out.weight.detach().to(BF16)
    assert head["embed_shape"] == head["weight_shape"] == list(ours.shape) == [51864, 384]
    assert torch.equal(case.engine["embed"], ours)
    assert torch.equal(
        case.engine["embed"], case.tensors["model.decoder.embed_tokens.weight"].to(BF16)
    )
    assert torch.equal(case.engine["lookup"], ours[case.inputs["tokens"]])
    hidden = case.inputs["hidden"]
    logits = case.engine["logits"]
    assert logits.shape == (3, 51864) and bool(logits.isfinite().all())
    assert torch.equal(logits, torch.nn.functional.linear(hidden, ours))


def test_the_encoder_runs_through_the_engine_as_ours_bit_for_bit(engine_run):
    """The static export's encoder, run by vLLM's own Whisper encoder (``embed_multimodal``:
    conv, positions, torch SDPA attention, vllm-ascend's quantized Linears) on one utterance's
    features, is our quantized encoder's output in bf16 (its float parts in the model dtype, as
    vLLM's are), bit for bit."""
    case = engine_run.cases["static"]
    assert "encoder_error" not in case.result, case.result.get("encoder_error")
    theirs, ours = case.engine["encoder"], case.ours.encoder
    assert theirs.shape == ours.shape == (1500, 384) and theirs.dtype == ours.dtype == BF16
    assert torch.equal(theirs, ours), (theirs.float() - ours.float()).abs().max()


def test_the_dynamic_encoder_passes_a_per_token_scale_the_op_refuses(engine_run):
    """Found, not ours to fix: vllm-ascend's W8A8_DYNAMIC ``apply`` (w8a8_dynamic.py 82-121)
    gives ``npu_quant_matmul`` the (batch, tokens) per-token scale of Whisper's 3-D encoder
    activations; torch_npu documents a 1-D (M,) one (our reference checks it). To be confirmed
    on a device; the decoder's Linears (2-D rows) are checked above."""
    err = engine_run.cases["dynamic"].result.get("encoder_error")
    assert err is not None and err["type"] == "ShapeError", err
    assert "pertoken_scale must be 1-D" in err["message"]


def test_without_the_prefix_aliases_vllm_ascend_cannot_build_whisper(engine_run):
    """The engine rule our aliases answer (opsnn_quant/formats/ascendv1/vllm_prefixes.py): vLLM 0.23.0's
    Whisper asks for '.encoder.layers.0.layers.self_attn.qkv_proj' (whisper.py 478-483, 962),
    vllm-ascend looks up each shard's '<prefix>.weight' (modelslim_config.py 691): a description
    with the checkpoint's names only is a KeyError while the model is built."""
    err = engine_run.cases["without_aliases"].result.get("load_error")
    assert err == {
        "type": "KeyError",
        "message": "'.encoder.layers.0.layers.self_attn.q_proj.weight'",
    }
