"""Conformance: ``evaluate --candidate`` reads msModelSlim 26.1.0's own files as the engines read
them, in the dtype each engine runs them in.

The files are made here by msModelSlim itself, as the benchmark's peer makes them: its code from
``.engines/msmodelslim-26.1.0`` (``tests/conformance/engines.sh``; CI fails without it, elsewhere
the tests skip) runs ``benchmarks/peer_msmodelslim.py`` in a process of its own
(``PYTHONPATH`` = that directory alone: nothing of ``opsnn_quant``, no torch_npu), whose
``llm_ptq`` ``Calibrator`` quantizes a tiny random model on the calls our forward loop makes
(recorded by the benchmark's ``_record_peer_inputs``) and saves with one of its savers:

* ``sd3-dynamic``: a tiny SD3 pipeline's ``transformer``, W8A8_DYNAMIC, the ``safe_tensor``
  saver: ``quant_model_description_w8a8_dynamic.json`` and its weights, flat (the files
  ``mindiesd.quantize(pipe.transformer, desc)`` reads);
* ``sd3-static``: the same, W8A8 (static): the legacy saver's ``deq_scale`` is int64, the float32
  bits (``deqscale2int64_by_dtype``: the model is not bfloat16);
* ``whisper-dynamic``: a tiny Whisper, W8A8_DYNAMIC, the ``ascendV1`` saver:
  ``quant_model_description.json`` (version 1.0.0) and its weights, no ``config.json``.

What each engine accepts, and in which dtype, is then asked of the engine's own code (the
harnesses of ``test_mindie_sd_engine.py`` and ``test_vllm_ascend_engine.py``, on the torch_npu
stand-in): MindIE-SD 3.1.0 runs the W8A8_DYNAMIC files in bfloat16 (its default) and the static
ones in float16 only (in bfloat16 its static Linear hands the int64 ``deq_scale`` to
``npu_quant_matmul``, whose bfloat16 output refuses it); vLLM 0.23.0 runs the AscendV1 files, with
the float model's ``config.json`` beside them (float32), in bfloat16, and vLLM-Ascend
0.23.0.post1 cannot build its Whisper from their description (the layer-prefix ``KeyError`` of
``opsnn_quant/formats/ascendv1/vllm_prefixes.py``; with the keys added, its Linears compute on
msModelSlim's tensors). Our reader's outputs equal the engines' bit for bit in those dtypes, and
``evaluate`` judges each file in it, or refuses with one line what the engine refuses.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.bench_calibrate_scale import _record_peer_inputs
from opsnn_quant.cli import main
from opsnn_quant.formats.ascendv1.consumer import AscendV1Linear
from opsnn_quant.formats.ascendv1.vllm_prefixes import WHISPER, vllm_prefix_aliases
from opsnn_quant.formats.candidates import load_candidate
from opsnn_quant.formats.mindie_sd.reader import MindieSdLinear
from opsnn_quant.models import load_adapter
from opsnn_quant.models.data import load_records
from tests._deps import needs_espeak
from tests.conformance.test_vllm_ascend_engine import _hf_names, _vllm_layers
from tests.tiny_pipelines import save_tiny_sd3, save_tiny_whisper, tiny_t2i_suite

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENGINES = Path(os.environ.get("OPSNN_QUANT_ENGINES", REPO / ".engines"))
PEER = ENGINES / "msmodelslim-26.1.0"
MINDIE = ENGINES / "mindiesd-3.1.0"
VLLM = ENGINES / "vllm-0.23.0"
ASCEND = ENGINES / "vllm-ascend-0.23.0.post1"
STAND_IN = HERE / "torch_npu_stand_in"
PROMPTS = [{"prompt": "a red circle"}, {"prompt": "a blue square"}]
BF16, FP16 = torch.bfloat16, torch.float16
# name -> (scheme, msModelSlim saver)
SD3 = {"sd3-dynamic": ("w8a8_dynamic", "safe_tensor"), "sd3-static": ("w8a8", "safe_tensor")}


def _installed(*dirs: Path) -> None:
    if all((d / ".complete").is_file() for d in dirs):
        return
    why = f"{', '.join(d.name for d in dirs)} not installed in {ENGINES}: run tests/conformance/engines.sh"  # fmt: skip
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must build it: .ci/run does)")
    pytest.skip(why)


def _peer(tmp: Path, kind: str, model: Path, calls: Path, runs: dict[str, tuple[str, str]],
          max_new_tokens: int | None = None) -> dict[str, Any]:  # fmt: skip
    """msModelSlim's calibration and save of each run (name -> scheme, saver), one process each,
    at once; every output read-only as msModelSlim leaves its weights (0o400), so each test
    copies what it edits."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(PEER), HOME=str(tmp / "home"))
    procs = {}
    for name, (scheme, saver) in runs.items():
        cmd = [sys.executable, str(REPO / "benchmarks" / "peer_msmodelslim.py"), "--kind", kind,
               "--model", str(model), "--data", str(calls), "--scheme", scheme,
               "--save-type", saver, "--out", str(tmp / name), "--threads", "1",
               *(["--max-new-tokens", str(max_new_tokens)] if max_new_tokens else [])]  # fmt: skip
        procs[name] = subprocess.Popen(
            cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("PEER ")]
        assert proc.returncode == 0 and lines, f"msModelSlim {name}: {stderr[-3000:]}"
        out[name] = json.loads(lines[-1][5:])
    return out


def _copy(src: Path, dst: Path) -> Path:
    """A writable copy of a peer output (msModelSlim writes its weights 0o400), modes kept
    within MindIE-SD's 0o640."""
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        os.chmod(f, 0o640)
    return dst


@pytest.fixture(scope="module")
def sd3_peer(tmp_path_factory):
    _installed(PEER)
    tmp = tmp_path_factory.mktemp("msmodelslim_sd3")
    (tmp / "home").mkdir()
    t0 = time.perf_counter()
    pipe = save_tiny_sd3(tmp / "pipe")
    adapter = load_adapter("diffusers-dit", str(pipe), steps=2, batch_size=2)
    _record_peer_inputs(adapter, PROMPTS, "transformer", tmp / "calls.pt")
    peer = _peer(tmp, "transformer", pipe, tmp / "calls.pt", SD3)
    call = torch.load(tmp / "calls.pt", weights_only=True)[0]  # the transformer's first call
    inputs = {k: call[k].contiguous() for k in
              ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep")}  # fmt: skip
    save_file(inputs, tmp / "inputs.st")
    return SimpleNamespace(tmp=tmp, pipe=pipe, peer=peer, inputs=inputs,
                           seconds=time.perf_counter() - t0)  # fmt: skip


@pytest.fixture(scope="module")
def whisper_peer(tmp_path_factory):
    _installed(PEER)
    tmp = tmp_path_factory.mktemp("msmodelslim_whisper")
    (tmp / "home").mkdir()
    t0 = time.perf_counter()
    model = save_tiny_whisper(tmp / "whisper", max_target_positions=80)
    adapter = load_adapter("whisper", str(model), batch_size=1, max_new_tokens=4)
    _record_peer_inputs(adapter, load_records("zoo:speech/eval", 1), "whisper", tmp / "calls.pt")
    runs = {"whisper-dynamic": ("w8a8_dynamic", "ascendV1")}
    peer = _peer(tmp, "whisper", model, tmp / "calls.pt", runs, max_new_tokens=4)
    return SimpleNamespace(tmp=tmp, model=model, peer=peer, seconds=time.perf_counter() - t0)


def _ours_transformer(directory: Path, pipe: Path, inputs: dict[str, torch.Tensor]):
    """``evaluate``'s candidate (:func:`load_candidate`, the dtype it picks) and its transformer's
    output on ``inputs``."""
    adapter, _ = load_candidate(directory, baseline=str(pipe))
    transformer = adapter.model.transformer
    dtype = next(p.dtype for p in transformer.parameters() if p.is_floating_point())
    with torch.no_grad():
        y = transformer(**{k: v.to(dtype) for k, v in inputs.items()}, return_dict=False)[0]
    return transformer, dtype, y


@pytest.fixture(scope="module")
def mindie_run(sd3_peer):
    """MindIE-SD's ``quantize(transformer, desc, dtype=...)`` on msModelSlim's files as written:
    the W8A8_DYNAMIC ones in bfloat16, the static ones in bfloat16 and in float16."""
    _installed(MINDIE)
    tmp = sd3_peer.tmp / "mindie"
    tmp.mkdir()
    cases = {"dynamic-bf16": ("sd3-dynamic", "bfloat16"), "static-bf16": ("sd3-static", "bfloat16"),
             "static-fp16": ("sd3-static", "float16")}  # fmt: skip
    job: dict[str, Any] = {"cases": {}}
    for name, (peer, dtype) in cases.items():
        directory = tmp / f"{name}-files"
        _copy(sd3_peer.tmp / peer, directory)  # the engine's own copy
        (desc,) = directory.glob("quant_model_description_*.json")
        job["cases"][name] = {"model_dir": str(sd3_peer.pipe / "transformer"), "desc": str(desc),
                              "inputs": str(sd3_peer.tmp / "inputs.st"), "dtype": dtype,
                              "out": str(tmp / f"{name}.st")}  # fmt: skip
    (tmp / "job.json").write_text(json.dumps(job))
    home = tmp / "home"
    home.mkdir()
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([str(MINDIE), str(STAND_IN), str(REPO)]), HOME=str(home),
               MINDIE_LOG_TO_FILE="false", MINDIE_LOG_LEVEL="warn")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(HERE / "mindie_sd_engine_run.py"), str(tmp / "job.json"),
         str(tmp / "result.json")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp / "result.json").read_text())
    return SimpleNamespace(cases=result["cases"], job=job["cases"])


@pytest.fixture(scope="module")
def vllm_run(whisper_peer):
    """vLLM + vllm-ascend, as ``vllm serve DIR --quantization ascend``, on msModelSlim's AscendV1
    files with the float model's config and tokenizer files beside them (msModelSlim writes none:
    a user copies them to serve the files): as written, and with the keys vLLM's Whisper looks
    its layers up under added (so that the engine's Linears run on msModelSlim's tensors)."""
    _installed(VLLM, ASCEND)
    tmp = whisper_peer.tmp / "vllm"
    tmp.mkdir()
    served = _copy(whisper_peer.tmp / "whisper-dynamic", tmp / "as-written")
    for f in whisper_peer.model.iterdir():
        if f.suffix == ".json":
            shutil.copy(f, served / f.name)
    keyed = _copy(served, tmp / "keyed")
    desc = json.loads((keyed / "quant_model_description.json").read_text())
    linears = [k.removesuffix(".weight") for k, v in desc.items()
               if k.endswith(".weight") and v == "W8A8_DYNAMIC"]  # fmt: skip
    desc |= vllm_prefix_aliases(desc, [WHISPER], linears)
    (keyed / "quant_model_description.json").write_text(json.dumps(desc, indent=2))
    config = json.loads((served / "config.json").read_text())
    layers = _vllm_layers(config)
    ours, _ = load_candidate(whisper_peer.tmp / "whisper-dynamic", baseline=str(whisper_peer.model))
    modules = dict(ours.model.named_modules())
    g = torch.Generator().manual_seed(0)
    inputs = {f"x.{n}": (torch.randn(6, modules[_hf_names(n)[0]].in_features, generator=g) * 2)
              .to(BF16) for n in layers}  # fmt: skip
    d = config["d_model"]
    inputs |= {"tokens": torch.tensor([50257, 50362, 440]), "features": torch.randn(80, 3000, generator=g).to(BF16),
               "hidden": torch.randn(3, d, generator=g).to(BF16)}  # fmt: skip
    save_file(inputs, tmp / "inputs.st")
    job = {"dist_init": f"file://{tmp / 'dist-init'}", "exports": {
        "as_written": {"dir": str(served), "inputs": "", "out": ""},
        "keyed": {"dir": str(keyed), "inputs": str(tmp / "inputs.st"), "out": str(tmp / "engine.st")},
    }}  # fmt: skip
    (tmp / "job.json").write_text(json.dumps(job))
    home = tmp / "home"
    home.mkdir()
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([str(VLLM), str(ASCEND), str(STAND_IN), str(REPO)]),
               HOME=str(home), VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(HERE / "vllm_ascend_engine_run.py"), str(tmp / "job.json"),
         str(tmp / "result.json")],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    result = json.loads((tmp / "result.json").read_text())["exports"]
    engine = load_file(tmp / "engine.st") if "load_error" not in result["keyed"] else {}
    return SimpleNamespace(result=result, engine=engine, ours=modules, inputs=inputs,
                           layers=layers)  # fmt: skip


# ---- what msModelSlim wrote ------------------------------------------------------------------


def test_msmodelslim_writes_what_each_saver_is_known_to_write(sd3_peer):
    files = {n: sorted(f.name for f in (sd3_peer.tmp / n).iterdir()) for n in SD3}
    assert files == {
        "sd3-dynamic": ["quant_model_description_w8a8_dynamic.json",
                        "quant_model_weight_w8a8_dynamic.safetensors"],
        "sd3-static": ["quant_model_description_w8a8.json", "quant_model_weight_w8a8.safetensors"],
    }  # fmt: skip
    assert {n: p["quant_type"] for n, p in sd3_peer.peer.items()} == {
        "sd3-dynamic": "W8A8_DYNAMIC", "sd3-static": "W8A8"}  # fmt: skip
    static = load_file(sd3_peer.tmp / "sd3-static" / "quant_model_weight_w8a8.safetensors")
    deq = {k: v for k, v in static.items() if k.endswith(".deq_scale")}
    assert deq and {v.dtype for v in deq.values()} == {torch.int64}
    # the float32 bits of input_scale * weight_scale (complex_quantifier.py deqscale2int64)
    name = next(iter(deq)).removesuffix(".deq_scale")
    want = (static[f"{name}.input_scale"] * static[f"{name}.weight_scale"].reshape(-1)).float()
    assert torch.equal(deq[f"{name}.deq_scale"].to(torch.int32).view(torch.float32), want)


@needs_espeak
def test_msmodelslims_ascendv1_saver_writes_no_config(whisper_peer):
    out = whisper_peer.tmp / "whisper-dynamic"
    assert sorted(f.name for f in out.iterdir()) == [
        "quant_model_description.json", "quant_model_weight_w8a8_dynamic.safetensors"]  # fmt: skip
    desc = json.loads((out / "quant_model_description.json").read_text())
    assert desc["version"] == "1.0.0" and desc["model_quant_type"] == "W8A8_DYNAMIC"
    assert whisper_peer.peer["whisper-dynamic"]["int8_linears"] == 16  # proj_out stays float


# ---- (a) MindIE-SD W8A8_DYNAMIC, (b) the legacy static W8A8 ---------------------------------


def test_the_engine_runs_the_dynamic_files_in_bf16_and_the_static_ones_in_fp16_only(mindie_run):
    """MindIE-SD's own run: every Linear msModelSlim made int8 is replaced by W8A8QuantLinear in
    each dtype; the static files' forward in bfloat16 is refused by ``npu_quant_matmul`` (int64
    scale, bfloat16 output: torch_npu's table, the stand-in's reference)."""
    desc = json.loads(Path(mindie_run.job["dynamic-bf16"]["desc"]).read_text())
    int8 = sorted(k.removesuffix(".weight") for k, v in desc.items()
                  if k.endswith(".weight") and v == "W8A8_DYNAMIC")  # fmt: skip
    assert len(int8) == 31
    for name, case in mindie_run.cases.items():
        assert sorted(case["replaced"]) == int8, name
        assert set(case["replaced"].values()) == {"W8A8QuantLinear"}, name
    assert "error" not in mindie_run.cases["dynamic-bf16"]
    assert "error" not in mindie_run.cases["static-fp16"]
    err = mindie_run.cases["static-bf16"]["error"]
    assert err["type"] == "ShapeError", err
    assert "bfloat16 output takes a float32/bfloat16 scale, not int64" in err["message"]


@pytest.mark.parametrize(("case", "dtype"), [("dynamic-bf16", BF16), ("static-fp16", FP16)])
def test_our_reader_judges_the_files_as_the_engine_runs_them(sd3_peer, mindie_run, case, dtype):
    """The candidate ``evaluate`` loads from msModelSlim's flat files (no component directory:
    the names fit the transformer), in the dtype it picks for them (bf16; fp16 for the int64
    deq_scale), computes MindIE-SD's transformer output bit for bit."""
    peer = "sd3-dynamic" if case.startswith("dynamic") else "sd3-static"
    transformer, got_dtype, ours = _ours_transformer(
        sd3_peer.tmp / peer, sd3_peer.pipe, sd3_peer.inputs
    )
    assert got_dtype == dtype
    replaced = sorted(n for n, m in transformer.named_modules() if isinstance(m, MindieSdLinear))
    assert replaced == sorted(mindie_run.cases[case]["replaced"])
    theirs = load_file(mindie_run.job[case]["out"])["y"]
    assert theirs.dtype == ours.dtype == dtype
    assert torch.equal(theirs, ours), (theirs.float() - ours.float()).abs().max()


def _evaluate(candidate: Path, baseline: Path, suite: Path, out: Path, *extra: str) -> int:
    argv = ["evaluate", "--candidate", str(candidate), "--baseline", str(baseline), "--suite",
            str(suite), "-o", str(out), "--latency", "none", "--quiet", *extra]  # fmt: skip
    return main(argv)


def test_evaluate_judges_both_mindie_sd_files_as_they_are(sd3_peer, capsys):
    """``evaluate --candidate`` on each flat output as msModelSlim wrote it: judged (both pass a
    5 dB PSNR bound on the tiny model's images); before, the static files were refused (bf16)
    and the flat dynamic ones judged as the float transformer (no layer replaced)."""
    suite = tiny_t2i_suite(sd3_peer.tmp / "suite")
    for name in SD3:
        out = sd3_peer.tmp / f"report-{name}"
        assert _evaluate(sd3_peer.tmp / name, sd3_peer.pipe, suite, out) == 0, name
        report = json.loads((out / "report.json").read_text())
        psnr = next(c for c in report["criteria"] if c["key"] == "psnr_min")
        assert psnr["status"] == "PASS" and 5.0 < psnr["value"] < 100.0, (name, psnr)
    capsys.readouterr()
    # bfloat16 asked of the static files: what the engine refuses, one line, nothing written
    out = sd3_peer.tmp / "report-static-bf16"
    rc = _evaluate(sd3_peer.tmp / "sd3-static", sd3_peer.pipe, suite, out, "--dtype", "bfloat16")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and "int64 deq_scale" in err[0], err
    assert "the engine refuses it" in err[0] and "--dtype float16" in err[0], err
    assert not out.exists()


# ---- (c) AscendV1 W8A8_DYNAMIC, no config.json ----------------------------------------------


@needs_espeak
def test_vllm_runs_the_ascendv1_files_in_bf16_and_cannot_build_whisper_from_them(vllm_run):
    """vLLM's own dtype resolution on the files with the float model's config.json (``dtype``
    float32): bfloat16 (``--dtype auto``); vLLM-Ascend then fails to build the model from
    msModelSlim's description (the keys vLLM's Whisper asks for are not in it)."""
    as_written = vllm_run.result["as_written"]
    assert as_written["resolved_dtype"] == "torch.bfloat16"
    assert as_written["load_error"] == {
        "type": "KeyError", "message": "'.encoder.layers.0.layers.self_attn.q_proj.weight'"}  # fmt: skip
    keyed = vllm_run.result["keyed"]
    assert "load_error" not in keyed, keyed.get("load_error")
    assert keyed["dtype"] == "torch.bfloat16"
    assert {lay["scheme"] for lay in keyed["layers"].values()} == {"AscendW8A8DynamicLinearMethod"}


@needs_espeak
def test_our_reader_computes_vllm_ascends_linears_in_bf16(vllm_run):
    """The candidate ``evaluate`` loads from msModelSlim's files as written (no config.json: the
    baseline's stands for it): every quantized Linear in bf16, the engine's, and its outputs on
    the same rows are vllm-ascend's (the shards concatenated for a fused layer), bit for bit."""
    ours = {n: m for n, m in vllm_run.ours.items() if isinstance(m, AscendV1Linear)}
    assert len(ours) == 16 and {m.params_dtype for m in ours.values()} == {BF16}
    assert sorted(vllm_run.result["keyed"]["layers"]) == sorted(vllm_run.layers)
    with torch.no_grad():
        for name in vllm_run.layers:
            x = vllm_run.inputs[f"x.{name}"]
            mine = torch.cat([vllm_run.ours[m](x) for m in _hf_names(name)], dim=-1)
            theirs = vllm_run.engine[f"y.{name}"]
            assert theirs.dtype == mine.dtype == BF16, name
            assert torch.equal(theirs, mine), (name, (theirs.float() - mine.float()).abs().max())


@needs_espeak
def test_evaluate_judges_the_ascendv1_files_and_says_vllm_cannot_build_them(whisper_peer, caplog):
    suite = whisper_peer.tmp / "asr.yaml"
    suite.write_text(
        "schema_version: 1\nname: tiny-asr\ntask: asr\n"
        "data: {dataset: speech, split: eval, samples: 2}\n"
        "generation: {max_new_tokens: 4, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {wer_delta_max_points: 100.0}}\n"
    )
    out = whisper_peer.tmp / "report"
    with caplog.at_level(logging.WARNING, logger="opsnn_quant.formats.ascendv1.candidate"):
        rc = _evaluate(whisper_peer.tmp / "whisper-dynamic", whisper_peer.model, suite, out,
                       "--allow-broken-baseline")  # fmt: skip
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert {c["key"]: c["status"] for c in report["criteria"]}["wer_delta_max_points"] == "PASS"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "vLLM-Ascend 0.23.0.post1 would not build" in warned[0], warned
    assert "'.encoder.layers.0.layers.self_attn." in warned[0], warned
