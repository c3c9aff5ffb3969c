"""Conformance: MindIE-SD's own code (``mindiesd==3.1.0`` from PyPI, unmodified) loads our
``export/mindie-sd/`` and computes our quantized modules' outputs bit for bit.

The engine runs in a subprocess (``mindie_sd_engine_run.py``) with the project's python and torch
and ``PYTHONPATH=<.engines/mindiesd-3.1.0>:<torch_npu stand-in>:<repository>``
(``tests/conformance/engines.sh`` installs it; CI fails without it, elsewhere the test skips).
Its ``quantize()`` reads our files through its own loader and file rules, picks each Linear's
class, casts the tensors as it does and calls torch_npu's ops with its own arguments.

What this cannot check on a CPU: the torch_npu operators themselves. The stand-in
(``torch_npu_stand_in/``) forwards ``npu_quantize``, ``npu_quant_matmul``,
``npu_dynamic_quant`` and ``npu_weight_quant_batchmatmul`` to this package's CPU references
(``opsnn_quant.ascend``), so the equality shown is "MindIE-SD's calls on our files == our
modules", given those references; that the references equal the NPU kernels is pinned elsewhere
(tests/ascend) and, for W8A16, holds to float rounding only (the cube's summation order). Nor
are MindIE-SD's native libraries or its NZ weight layout (``use_nz``) exercised: the stand-in
reports no NPU, so MindIE-SD loads none of them.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from opsnn_quant.core.timesteps import at_step
from opsnn_quant.formats.mindie_sd.export import description_name, export_mindie_sd, weight_name
from opsnn_quant.formats.mindie_sd.reader import apply_mindie_sd, read_mindie_sd
from opsnn_quant.formats.safetensors_io import write_safetensors
from opsnn_quant.models.generic import GenericAdapter
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.qmodule import is_quant_module
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Modality, Precision
from tests.conformance.mindie_sd_models import build, forward, sd3_inputs, wan_inputs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENGINE = Path(os.environ.get("OPSNN_QUANT_ENGINES", REPO / ".engines")) / "mindiesd-3.1.0"
STAND_IN = HERE / "torch_npu_stand_in"
STEPS = 4
BF16 = torch.bfloat16
# MindIE-SD's class per scheme (mindiesd 3.1.0 quantization/quantize.py 63-158)
STATIC = DYNAMIC = "W8A8QuantLinear"
W8A16 = "WeightQuantLinear"
TIMESTEP = "W8A8TimeStepQuantLinear"


def _engine_dir() -> Path:
    if (ENGINE / ".complete").is_file() and (ENGINE / "mindiesd" / "__init__.py").is_file():
        return ENGINE
    why = f"MindIE-SD 3.1.0 is not installed in {ENGINE}: run tests/conformance/engines.sh"
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must build it: .ci/run does)")
    pytest.skip(why)


def _spec(precision: str, **kw: Any) -> QuantSpec:
    return QuantSpec(Precision(precision), engine="mindie-sd", output_dtype="bfloat16", **kw)


def _in_bf16(model: nn.Module) -> nn.Module:
    """The float modules' parameters and buffers in bfloat16, as ``model.to(bfloat16)`` makes
    them on the engine's side (MindIE-SD's Linear returns its dtype: the pipeline runs in it);
    the quantized modules' tensors stay as frozen."""
    for module in model.modules():
        if not is_quant_module(module):
            for p in module.parameters(recurse=False):
                p.data = p.data.to(BF16)
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.to(BF16))
    return model


class _Stepped(GenericAdapter):
    """A generic adapter whose sampling runs STEPS denoising steps (the rows of a timestep table
    that export_mindie_sd writes; a diffusers adapter's ``settings.steps``)."""

    settings = SimpleNamespace(steps=STEPS)


def _block_loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        model(torch.randn(2, 8, 32, generator=g) * 2)


def _stepped_loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for step, scale in enumerate((8.0, 4.0, 2.0, 1.0)):
        with at_step(step):
            model(torch.randn(2, 8, 32, generator=g) * scale)


def _sd3_loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        forward(model, sd3_inputs(2, g))


SCHEMES = {  # every scheme MindIE-SD loads, one per Linear of the Block
    "a": (_spec("w8a8", activation_symmetric=False), STATIC),  # input_offset != 0
    "b": (_spec("w8a8", smoothquant_alpha=0.5), STATIC),  # <p>.div.mul_scale, <p>.linear.*
    "c": (_spec("w8a8_dynamic", smoothquant_alpha=0.5), DYNAMIC),  # no bias
    "d": (_spec("w8a8_dynamic"), DYNAMIC),
    "e": (_spec("w8a16"), W8A16),
}
PER_STEP = _spec("w8a8", timestep_bounds=(0, 2))  # steps 0-1, 2-3: a row per step (4 rows)
STEPPED = {"a": (PER_STEP, TIMESTEP), "b": (PER_STEP, TIMESTEP)}  # c, d, e stay float


def _sd3_scheme(name: str) -> tuple[QuantSpec, str] | None:
    """A mix over the tiny SD3 transformer's blocks; the embedders and the head stay float."""
    if not name.startswith("transformer_blocks."):
        return None
    if ".norm1" in name:
        return _spec("w8a16"), W8A16
    if ".ff" in name:
        smooth = 0.5 if name.endswith("net.2") else None
        return _spec("w8a8_dynamic", smoothquant_alpha=smooth), DYNAMIC
    if name.endswith(("to_out.0", "to_add_out")):
        return _spec("w8a8", activation_symmetric=False), STATIC
    return _spec("w8a8", smoothquant_alpha=0.5), STATIC


def _wan_scheme(name: str) -> tuple[QuantSpec, str] | None:
    """A mix over the tiny Wan transformer's blocks (self- and cross-attention projections, the
    MLP); the condition embedders (the time embedding stays float: diffusers_dit.PIPELINES)
    and the head stay float."""
    if not name.startswith("blocks."):
        return None
    if ".ffn." in name:
        return _spec(
            "w8a8_dynamic", smoothquant_alpha=0.5 if name.endswith("net.2") else None
        ), DYNAMIC
    if ".attn2." in name:
        return _spec("w8a16"), W8A16
    if name.endswith("to_out.0"):
        return _spec("w8a8", activation_symmetric=False), STATIC
    return _spec("w8a8", smoothquant_alpha=0.5), STATIC


def _wan_loop(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        forward(model, wan_inputs(2, g))


def _case(
    tmp: Path,
    kind: str,
    schemes: dict[str, tuple[QuantSpec, str]],
    loop: Callable[[nn.Module], None],
    inputs: dict[str, torch.Tensor],
    adapter_cls: type[GenericAdapter] = GenericAdapter,
) -> dict[str, Any]:
    """Quantize the float model, export it, run ours in bf16; the engine's job for the same."""
    tmp.mkdir()
    float_model = build(kind).eval()
    save_file({k: v.contiguous() for k, v in float_model.state_dict().items()}, tmp / "float.st")
    model = copy.deepcopy(float_model)
    quantize(model, {n: s for n, (s, _) in schemes.items()}, loop)
    export = export_mindie_sd(adapter_cls(model, {"": Modality.DENOISER}, loop), tmp / "mindie-sd")
    files = export.components[""]
    desc = tmp / "mindie-sd" / description_name(files.description["model_quant_type"])
    save_file(inputs, tmp / "inputs.st")
    ours = _in_bf16(model)
    x = {k: v.to(BF16) for k, v in inputs.items()}
    if adapter_cls is _Stepped:
        outputs = {}
        for t in range(STEPS):
            with at_step(t):
                outputs[f"step{t}"] = forward(ours, x)
    else:
        outputs = {"y": forward(ours, x)}
    float_out = forward(_in_bf16(float_model), x)  # what the engine gives if it quantizes nothing
    job = {"model": kind, "state": str(tmp / "float.st"), "desc": str(desc),
           "inputs": str(tmp / "inputs.st"), "out": str(tmp / "engine.st"),
           "steps": STEPS if adapter_cls is _Stepped else None}  # fmt: skip
    expected = {n: cls for n, (_, cls) in schemes.items()}
    return {"job": job, "ours": outputs, "int8": sorted(files.int8), "expected": expected,
            "desc": desc, "float": float_out}  # fmt: skip


def _int8_layers(desc: Path) -> list[str]:
    """The Linears our description gives an int8 type: ``<p>.weight``, or ``<p>.linear.weight``
    where ``<p>.div.mul_scale`` is written (the smoothed form, quantize.py 147-149)."""
    doc = json.loads(desc.read_text())
    layers = []
    for key, kind in doc.items():
        if key.endswith(".weight") and kind != "FLOAT":
            w = key.removesuffix(".weight")
            smoothed = w.endswith(".linear") and f"{w.removesuffix('.linear')}.div.mul_scale" in doc
            layers.append(w.removesuffix(".linear") if smoothed else w)
    return sorted(layers)


def _smoothed_step_table(src: Path, dst: Path, layer: str, mul: torch.Tensor) -> Path:
    """``src`` (a W8A8_TIMESTEP export) with ``layer`` in the smoothed (non-fusion) form that
    msModelSlim's saver writes and MindIE-SD reads (quantize.py 147-149): ``<layer>.div.mul_scale``
    (FLOAT) and the layer's tensors under ``<layer>.linear``. Our export never writes this
    combination (mindie_sd.py ``_float_reason``), a third party's file may."""
    doc = json.loads(src.read_text())
    tensors = load_file(next(src.parent.glob("quant_model_weight_*.safetensors")))
    qtype = doc.pop("model_quant_type")
    out_doc, out_t = {}, {}
    for key, kind in doc.items():
        new = f"{layer}.linear.{key[len(layer) + 1 :]}" if key.startswith(f"{layer}.") else key
        out_doc[new], out_t[new] = kind, tensors[key]
    out_doc[f"{layer}.div.mul_scale"], out_t[f"{layer}.div.mul_scale"] = "FLOAT", mul
    out_doc["model_quant_type"] = qtype
    dst.mkdir()
    write_safetensors(out_t, dst / weight_name(qtype))
    desc = dst / description_name(qtype)
    desc.write_text(json.dumps(out_doc, indent=4))
    for f in dst.iterdir():
        os.chmod(f, 0o640)
    return desc


def _reader_outputs(case: dict[str, Any], desc: Path, x: dict[str, torch.Tensor]):
    """Our reader (``mindie_sd_reader``) on a W8A8_TIMESTEP file: each step's output, and the
    dynamic branch's (outside a sampling loop)."""
    model = build("block")
    model.load_state_dict(load_file(case["job"]["state"]))
    _in_bf16(model)
    assert apply_mindie_sd(model, read_mindie_sd(desc)) == sorted(case["expected"])
    outputs = {"dynamic": forward(model, x)}
    for t in range(STEPS):
        with at_step(t):
            outputs[f"step{t}"] = forward(model, x)
    return outputs


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    engine_dir = _engine_dir()
    tmp = tmp_path_factory.mktemp("mindie_sd_engine")
    g = torch.Generator().manual_seed(1)
    block_x = {"x": torch.randn(2, 5, 32, generator=g) * 3}
    sd3 = build("sd3")
    sd3_schemes = {
        n: s for n, m in sd3.named_modules()
        if isinstance(m, nn.Linear) and (s := _sd3_scheme(n)) is not None
    }  # fmt: skip
    wan_schemes = {
        n: s for n, m in build("wan").named_modules()
        if isinstance(m, nn.Linear) and (s := _wan_scheme(n)) is not None
    }  # fmt: skip
    cases = {
        "schemes": _case(tmp / "schemes", "block", SCHEMES, _block_loop, block_x),
        "timestep": _case(tmp / "timestep", "block", STEPPED, _stepped_loop, block_x, _Stepped),
        "sd3": _case(tmp / "sd3", "sd3", sd3_schemes, _sd3_loop, sd3_inputs(2, g)),
        "wan": _case(tmp / "wan", "wan", wan_schemes, _wan_loop, wan_inputs(2, g)),
    }
    # W8A8_TIMESTEP through our reader too: its dynamic branch (a step MindIE-SD has no static
    # strategy for, outside our sampling loop), and a smoothed per-step layer, which our export
    # never writes but a third party's file may (``<p>.div.mul_scale``)
    step = cases["timestep"]
    x = {k: v.to(BF16) for k, v in block_x.items()}
    step["ours"]["dynamic"] = _reader_outputs(step, step["desc"], x)["dynamic"]
    mul = (2.0 ** (torch.rand(32, generator=g) * 2 - 1)).to(BF16)
    desc = _smoothed_step_table(step["desc"], tmp / "timestep_smoothed", "a", mul)
    cases["timestep_smoothed"] = step | {
        "job": step["job"] | {"desc": str(desc), "out": str(tmp / "timestep_smoothed.st")},
        "ours": _reader_outputs(step, desc, x), "desc": desc,
    }  # fmt: skip
    # MindIE-SD's file rules: a weights file with the others' read bit (safetensors' 0o644)
    refuse = tmp / "refuse"
    refuse.mkdir()
    for f in cases["schemes"]["desc"].parent.iterdir():
        (refuse / f.name).write_bytes(f.read_bytes())
        os.chmod(refuse / f.name, 0o640)
    weights = next(refuse.glob("quant_model_weight_*.safetensors"))
    os.chmod(weights, 0o644)
    job = {"cases": {n: c["job"] for n, c in cases.items()},
           "refuse": str(refuse / cases["schemes"]["desc"].name)}  # fmt: skip
    (tmp / "job.json").write_text(json.dumps(job))
    home = tmp / "home"
    home.mkdir()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(engine_dir), str(STAND_IN), str(REPO)]),
        HOME=str(home),
        MINDIE_LOG_TO_FILE="false",  # mindiesd logs to ~/mindie/log by default (utils/env.py:68)
        MINDIE_LOG_PATH=str(tmp / "mindie-log"),
        MINDIE_LOG_LEVEL="warn",
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "mindie_sd_engine_run.py"), str(tmp / "job.json"),
         str(tmp / "result.json")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp / "result.json").read_text())
    return SimpleNamespace(cases=cases, result=result, home=home, weights=weights)


def test_the_engine_is_mindie_sd_3_1_0_on_the_stand_in(engine_run):
    r = engine_run.result
    assert Path(r["mindiesd"]).resolve().is_relative_to(ENGINE.resolve())
    assert r["stand_in"] and r["npu_available"] is False  # no native library was loaded
    assert r["torch"] == torch.__version__  # the project's torch
    assert not (engine_run.home / "mindie").exists()  # MINDIE_LOG_TO_FILE=false: no log file


@pytest.mark.parametrize("case", ["schemes", "timestep", "sd3", "wan", "timestep_smoothed"])
def test_mindie_sd_replaces_our_int8_linears_and_computes_our_modules(engine_run, case):
    """``schemes``: a Block with static (offset), static smoothed, dynamic smoothed, dynamic and
    W8A16 Linears; ``timestep``: W8A8_TIMESTEP, every step and the dynamic branch; ``sd3``: a
    tiny SD3 transformer with a mix of them; ``wan``: a tiny Wan2.1 video transformer with a mix
    of them (the shapes-t2v demo's classes); ``timestep_smoothed``: a W8A8_TIMESTEP layer with
    ``div.mul_scale`` (a third party's file). MindIE-SD's output equals our quantized modules'
    (``ours``), or our reader's (``mindie_sd_reader``) where our modules have no such form (the
    timestep dynamic branch, ``timestep_smoothed``), bit for bit, in bf16."""
    c = engine_run.cases[case]
    replaced = engine_run.result["cases"][case]["replaced"]
    # every Linear our description says is int8, and no other, by the class of its scheme
    assert sorted(replaced) == c["int8"] == _int8_layers(c["desc"]) == sorted(c["expected"])
    assert replaced == c["expected"]
    theirs = load_file(c["job"]["out"])
    assert sorted(theirs) == sorted(c["ours"])
    for key, ours in c["ours"].items():
        assert theirs[key].dtype == ours.dtype == BF16, key
        assert torch.equal(theirs[key], ours), key
        assert not torch.equal(theirs[key], c["float"]), key  # its int8 Linears did run


def test_mindie_sd_refuses_a_weights_file_readable_by_others(engine_run):
    # mindiesd 3.1.0 utils/file_utils.py check_max_permission (lines 127-135), from
    # quantization/quantize.py get_cfg_and_weights (285-287)
    refused = engine_run.result["refused"]
    assert refused is not None and refused["type"] == "PermissionError"
    assert refused["message"] == (
        f"The permission of {os.path.relpath(engine_run.weights, engine_run.weights.parents[1])}"
        " is higher than 0o640."
    )


def test_timestep_registration_needs_its_target(engine_run):
    # 3.1.0's TimestepPolicyConfig.register defaults to target="w4a4_linear", which has no
    # "static" (quantization/config.py 81-95): docs/deploy.md's call names target="w8a8_static_linear"
    err = engine_run.result["register_default_target"]
    assert err is not None and err["type"] == "ValueError" and "static" in err["message"]
