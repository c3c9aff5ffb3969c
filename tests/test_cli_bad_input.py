"""Every bad input the CLI meets: one ``error:`` line, the exit code, before the expensive work.

Table-driven (issue 11 §1–§2): each case builds its input in a fresh folder, runs ``main``, and
checks the exit code, the one stderr line, that no model was loaded where the input could be
checked before, and that nothing at the output path was touched or half-written.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from opsnn_quant.cli import main
from opsnn_quant.output.ownership import MARKER
from tests.tiny_pipelines import (
    save_tiny_sd,
    save_tiny_sd3,
    save_tiny_wan,
    save_tiny_whisper,
    tiny_t2i_suite,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny pipeline, its recipe, and one finished calibrate output of it."""
    root = tmp_path_factory.mktemp("bad")
    save_tiny_sd(root / "pipe")
    (root / "prompts.txt").write_text("a red circle\na blue square\n")
    recipe = root / "recipe.yaml"
    recipe.write_text(
        "name: tiny\n"
        "model:\n"
        "  family: diffusers-sd\n"
        f"  source: {root / 'pipe'}\n"
        "  settings: {steps: 2, batch_size: 2}\n"
        f"data: {{calibration: {root / 'prompts.txt'}}}\n"
        "probe: {max_root_calls: 2}\n"
        "target: ascend910b-atc\n"
    )
    done = root / "done"
    assert main(["calibrate", str(recipe), "-o", str(done), "--quiet"]) == 0
    return root, recipe, done


@dataclass
class Case:
    """argv from the case folder; expected exit code and line; whether a model may load."""

    name: str
    argv: Callable[[Path, Path, Path, Path], list[str]]  # (case dir, root, recipe, done)
    code: int
    line: str
    may_load: bool = False
    needs_no_cuda: bool = False  # the case names a CUDA device this machine must not have


def _recipe_with(recipe: Path, d: Path, old: str, new: str) -> str:
    text = recipe.read_text()
    assert old in text
    path = d / "r.yaml"
    path.write_text(text.replace(old, new))
    return str(path)


def _bytes(d: Path, name: str, data: bytes) -> Path:
    path = d / name
    path.write_bytes(data)
    return path


def _foreign_dir(d: Path) -> str:
    (d / "o").mkdir()
    (d / "o" / "notes.txt").write_text("precious\n")
    return str(d / "o")


def _policy_with(done: Path, d: Path, edit: Callable[[str], str]) -> str:
    shutil.copy(done / "probe.json", d / "probe.json")
    (d / "policy.yaml").write_text(edit((done / "policy.yaml").read_text()))
    return str(d / "policy.yaml")


def _bf16_on_310p(text: str) -> str:
    text = text.replace("target: ascend910b-atc", "target: ascend310p")
    return text.replace(
        "rules:\n", "rules:\n- match: unet.conv_in\n  precision: bf16\n  reason: x\n"
    )


def _candidate_missing_key(done: Path, d: Path) -> str:
    shutil.copytree(done, d / "cand")
    desc_path = d / "cand" / "quant" / "description.json"
    desc = json.loads(desc_path.read_text())
    first = next(iter(desc["modules"]))
    del desc["modules"][first]["weight_shape"]
    desc_path.write_text(json.dumps(desc))
    return str(d / "cand")


def _empty_datasets_dir(d: Path) -> str:
    ds = d / "ds"
    ds.mkdir()
    (ds / "dataset_info.json").write_text("{}")
    (ds / "state.json").write_text('{"_data_files": []}')
    return str(ds)


def _corrupt_wav(d: Path) -> str:
    (d / "wavs").mkdir()
    (d / "wavs" / "a.wav").write_bytes(b"RIFF\x00\x00not a wave file")
    return str(d / "wavs")


def _zoo_dir(name: str) -> str:
    from opsnn_quant.sources import model_path

    return str(model_path(f"zoo:{name}"))


def _suite_with_folder(d: Path) -> str:
    return str(tiny_t2i_suite(d, psnr_min=10.0))  # its data folder: d / "eval"


def _user_notes(d: Path) -> str:
    (d / "exp").mkdir()
    (d / "exp" / "ascendv1.notes.txt").write_text("my notes\n")
    return str(d / "exp")


def _copied_marker(done: Path, d: Path) -> str:
    (d / "u").mkdir()
    (d / "u" / "thesis.tex").write_text("years of work\n")
    shutil.copy(done / "quant" / MARKER, d / "u" / MARKER)  # a 'quant' output's marker
    return str(d / "u")


def _output_with_git(d: Path) -> str:
    from opsnn_quant.output.directories import atomic_dir

    with atomic_dir(d / "o", "quant") as tmp:  # the kind engine-demo writes
        (tmp / "model.safetensors").write_bytes(b"x")
    (d / "o" / ".git").mkdir()
    (d / "o" / ".git" / "config").write_text("[remote] token\n")
    return str(d / "o")


def _link(d: Path) -> str:
    (d / "real").mkdir()
    (d / "link").symlink_to(d / "real")
    return str(d / "link")


def _with_seed(recipe: Path, d: Path, seed: str) -> str:
    path = d / "r.yaml"
    path.write_text(recipe.read_text() + f"seed: {seed}\n")
    return str(path)


def _suite(d: Path, text: str) -> str:
    path = d / "suite.yaml"
    path.write_text(text)
    return str(path)


def _probe_edited(done: Path, d: Path, edit: Callable[[dict], None]) -> str:
    doc = json.loads((done / "probe.json").read_text())
    edit(doc)
    (d / "probe.json").write_text(json.dumps(doc))  # NaN written bare, as json.dumps does
    return str(d / "probe.json")


def _nan_absmax(doc: dict) -> None:
    next(m for m in doc["modules"] if m.get("fp16"))["fp16"]["output_absmax"] = float("nan")


def _negative_macs(doc: dict) -> None:
    next(m for m in doc["modules"] if m["type"] == "Linear")["macs"] = -1


def _silent_wavs(d: Path) -> str:
    """Two 16 kHz recordings of digital silence (one with -90 dBFS dither)."""
    import wave

    (d / "quiet").mkdir()
    for name, value in (("a.wav", 0), ("b.wav", 1)):
        with wave.open(str(d / "quiet" / name), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes(int(value).to_bytes(2, "little", signed=True) * 16000)
    return str(d / "quiet")


def _twice(doc: dict) -> None:
    doc["modules"].append(dict(doc["modules"][0]))


def _with_rules(lines: str) -> Callable[[str], str]:
    return lambda text: text.replace("rules:\n", "rules:\n" + lines)


SUITE = "name: s\ntask: t2i\ndata: {dataset: shapes, samples: 2}\nmetrics: {fid_features: null}\n"
ASR_SUITE = (
    "name: s\ntask: asr\ndata: {dataset: speech, split: eval, samples: 2}\n"
    "generation: {max_new_tokens: TOKENS}\nmetrics: {fid_features: null}\n"
)


def _errors(stderr: str) -> list[str]:
    """stderr without the progress lines ('[  1.2 s] phase', printed when not a terminal)."""
    return [
        ln for ln in stderr.strip().splitlines() if not re.match(r"^\[\s*\d+\.\d s\]|^\s+\d", ln)
    ]


CASES = [
    # §1 outputs
    Case("engine-demo over a foreign dir", lambda d, r, rec, done: ["engine-demo", "-o", _foreign_dir(d)],
         2, "exists and is not an opsnn-quant output; choose a new or empty directory (--force replaces only opsnn-quant outputs)"),
    # issue 58 §2: --force replaces only what is ours
    Case("engine-demo --force over a foreign dir", lambda d, r, rec, done: ["engine-demo", "-o", _foreign_dir(d), "--force"],
         2, "exists and is not an opsnn-quant output; choose a new or empty directory (--force replaces only opsnn-quant outputs)"),
    Case("calibrate --force over a file", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(_bytes(d, "f", b"x")), "--force"],
         2, "is an existing file, not an opsnn-quant output; choose a new or empty directory (--force replaces only opsnn-quant outputs)"),
    Case("--force over an output holding .git", lambda d, r, rec, done: ["engine-demo", "-o", _output_with_git(d), "--force"],
         2, "holds .git (a version-control repository); choose a new or empty directory (--force replaces only opsnn-quant outputs)"),
    Case("a copied marker, --force", lambda d, r, rec, done: ["engine-demo", "-o", _copied_marker(done, d), "--force"],
         2, "holds thesis.tex but none of the files its opsnn-quant marker lists"),
    Case("probe over a calibrate output", lambda d, r, rec, done: ["probe", str(rec), "-o", str(done)],
         2, "exists and is a 'calibrate' output"),
    Case("calibrate over a file", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(_bytes(d, "f", b"x"))],
         2, "is an existing file, not an opsnn-quant output; choose a new or empty directory (--force replaces only opsnn-quant outputs)"),
    Case("name is an absolute path", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "name: tiny", "name: /tmp/victim")],
         2, "line 1: name: String should match pattern"),
    Case("name climbs out", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "name: tiny", "name: ../..")],
         2, "line 1: name: String should match pattern"),
    Case("-o is the working directory", lambda d, r, rec, done: ["calibrate", str(rec), "-o", "."],
         2, "is the working directory or contains it"),
    Case("-o is a parent of the input", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(r), "--force"],
         2, "would replace the input"),
    Case("-o is the input model", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(r / "pipe"), "--force"],
         2, "would replace the input"),
    Case("-o under a file", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(_bytes(d, "f", b"x") / "o")],
         2, "is a file, not a directory"),
    # issue 28 §1: inputs resolved, inputs contained, files that are not ours
    Case("-o is the built-in model's directory", lambda d, r, rec, done: ["calibrate", "shapes-t2i", "-o", _zoo_dir("shapes-t2i"), "--force"],
         2, "would replace the input"),
    Case("-o inside the package", lambda d, r, rec, done: ["probe", "shapes-t2i", "-o", _zoo_dir("shapes-t2i") + "/unet/out", "--force"],
         2, "is inside the input"),
    Case("evaluate over the candidate's checkpoint", lambda d, r, rec, done: ["evaluate", "--candidate", str(done), "--suite", "shapes-t2i", "-o", str(done / "quant"), "--force"],
         2, "would replace the input"),
    Case("evaluate inside the candidate's checkpoint", lambda d, r, rec, done: ["evaluate", "--candidate", str(done), "--suite", "shapes-t2i", "-o", str(done / "quant" / "rep"), "--force"],
         2, "is inside the input"),
    Case("evaluate over the suite's folder", lambda d, r, rec, done: ["evaluate", "--candidate", str(done), "--suite", _suite_with_folder(d), "-o", str(d / "eval"), "--force"],
         2, "would replace the input"),
    Case("policy export over its own policy", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "amct-cfg", "-o", str(done / "policy.yaml"), "--force"],
         2, "would replace the input"),
    Case("policy export over its probe", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "amct-cfg", "-o", str(done / "probe.json")],
         2, "would replace the input"),
    Case("policy export over a user's file", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "amct-cfg", "-o", str(_bytes(d, "amct.cfg", b"mine\n"))],
         2, "amct.cfg exists and is not an opsnn-quant file; remove it or choose another path"),
    Case("export-weights over a user's notes file", lambda d, r, rec, done: ["export-weights", str(done), "-o", _user_notes(d), "--data", str(r / "prompts.txt")],
         2, "ascendv1.notes.txt exists and is not an opsnn-quant file; remove it or choose another path"),
    Case("a copied marker", lambda d, r, rec, done: ["engine-demo", "-o", _copied_marker(done, d)],
         2, "holds thesis.tex but none of the files its opsnn-quant marker lists"),
    Case("-o is a symbolic link", lambda d, r, rec, done: ["probe", str(rec), "-o", _link(d)],
         2, "is a symbolic link to"),
    # §2 inputs
    Case("settings typo", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "steps: 2", "stepz: 2"), "-o", str(d / "o")],
         2, "line 5: model.settings.stepz: Extra inputs are not permitted"),
    Case("settings wrong type", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "steps: 2", 'steps: "ten"'), "-o", str(d / "o")],
         2, "line 5: model.settings.steps: Input should be a valid integer"),
    Case("metric suite unknown", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target:", "budget: {metric: {suite: nope, psnr_min: 30}}\ntarget:"), "-o", str(d / "o")],
         2, "suite nope not found (built-in suites: shapes-dit"),
    Case("metric slice too short", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target:", f"budget: {{metric: {{suite: shapes-t2i, data: {r / 'prompts.txt'}, samples: 5, psnr_min: 30}}}}\ntarget:"), "-o", str(d / "o")],
         2, "has 2 records, fewer than the 5 needed for 5 from record 0"),
    Case("metric with a speed bound", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target:", "budget: {metric: {suite: shapes-t2i, memory_ratio_max: 1}}\ntarget:"), "-o", str(d / "o")],
         2, "budget.metric: memory_ratio_max is a speed bound"),
    Case("metric bound of another task", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target:", "budget: {metric: {suite: shapes-t2i, wer_delta_max_points: 1}}\ntarget:"), "-o", str(d / "o")],
         2, "budget.metric: thresholds ['wer_delta_max_points'] do not apply to task 't2i' (suite shapes-t2i)"),
    Case("metric bound misspelt", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target:", "budget: {metric: {suite: shapes-t2i, psnr_minn: 30}}\ntarget:"), "-o", str(d / "o")],
         2, "budget.metric.psnr_minn: no metric is bounded by it; did you mean 'psnr_min'?"),
    Case("recipe not UTF-8", lambda d, r, rec, done: ["calibrate", str(_bytes(d, "r.yaml", b"name: caf\xe9\n")), "-o", str(d / "o")],
         2, "is not UTF-8 text"),
    Case("prompts not UTF-8", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, str(r / "prompts.txt"), str(_bytes(d, "p.txt", b"caf\xe9\n"))), "-o", str(d / "o")],
         2, "p.txt is not UTF-8 text"),
    Case("empty datasets directory", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, str(r / "prompts.txt"), _empty_datasets_dir(d)), "-o", str(d / "o")],
         2, "ds"),
    Case("corrupt wav", lambda d, r, rec, done: ["probe", "zoo:whisper-tiny.en", "--data", _corrupt_wav(d), "-o", str(d / "o")],
         2, "a.wav is not a readable .wav file"),
    Case("unknown target", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target: ascend910b-atc", "target: ascend999"), "-o", str(d / "o")],
         2, "line 8: target: unknown target 'ascend999'"),
    Case("unknown export", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target: ascend910b-atc", "target: ascend910b-atc\nexports: [amct-cfg, onnx-magic]"), "-o", str(d / "o")],
         2, "exports: unknown export format(s) ['onnx-magic']"),
    Case("unknown device", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--device", "gpu"],
         2, "--device: String should match pattern"),
    Case("npu without torch_npu", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--device", "npu"],
         2, "device npu needs torch_npu"),
    Case("cuda without CUDA", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--device", "cuda"],
         2, "device cuda is not available here (0 cuda device(s))", needs_no_cuda=True),
    Case("probe: cuda:0 without CUDA", lambda d, r, rec, done: ["probe", str(rec), "-o", str(d / "o"), "--device", "cuda:0"],
         2, "device cuda:0 is not available here (0 cuda device(s))", needs_no_cuda=True),
    Case("evaluate: npu without torch_npu", lambda d, r, rec, done: ["evaluate", "--candidate", str(done), "--suite", "shapes-t2i", "-o", str(d / "rep"), "--device", "npu"],
         2, "device npu needs torch_npu"),
    Case("suite YAML syntax error", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--evaluate", _suite(d, "name: s\ndata: {dataset: shapes\nseeds: [0]\n")],
         2, "suite.yaml:3: not valid YAML: expected ',' or '}', but got ':' (while parsing a flow mapping at line 2)"),
    Case("recipe YAML syntax error", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target: ascend910b-atc", "target: [ascend910b-atc"), "-o", str(d / "o")],
         2, "r.yaml:9: not valid YAML: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at line 8)"),
    Case("suite threshold NaN", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--evaluate", _suite(d, SUITE.replace("null}", "null, thresholds: {psnr_min: .nan}}"))],
         2, "metrics.thresholds.psnr_min: Input should be a finite number"),
    Case("suite seed out of range", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--evaluate", _suite(d, SUITE + "seeds: [0, 4294967296]\n")],
         2, "seeds.1: must be between 0 and 4294967295"),
    Case("--latency without --evaluate", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--latency", "sometimes"],
         2, "--latency must be one of none, target, all, got 'sometimes'"),
    Case("unknown suite", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--evaluate", "no-such-suite"],
         2, "no-such-suite"),
    Case("unknown family", lambda d, r, rec, done: ["probe", str(r / "pipe"), "--data", str(r / "prompts.txt"), "--family", "llama", "-o", str(d / "o")],
         2, "--family must be one of diffusers-sd, whisper"),
    Case("wrong family for the model", lambda d, r, rec, done: ["probe", "zoo:shapes-t2i", "--family", "whisper", "--data", str(r / "prompts.txt"), "-o", str(d / "o")],
         2, "zoo:shapes-t2i is a diffusers pipeline, not a Whisper model; check the family", may_load=True),
    # seeds: what numpy's and torch's seeding take
    Case("--seed negative", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--seed", "-3"],
         2, "--seed must be between 0 and 4294967295 (2**32-1, the seeds numpy accepts), got -3"),
    Case("--seed 2**32", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--seed", "4294967296"],
         2, "--seed must be between 0 and 4294967295 (2**32-1, the seeds numpy accepts), got 4294967296"),
    Case("recipe seed negative", lambda d, r, rec, done: ["calibrate", _with_seed(rec, d, "-1"), "-o", str(d / "o")],
         2, "line 9: seed: must be between 0 and 4294967295 (2**32-1, the seeds numpy accepts), got -1"),
    Case("engine-demo --seed past int64", lambda d, r, rec, done: ["engine-demo", "-o", str(d / "o"), "--seed", "99999999999999999999"],
         2, "--seed must be between 0 and 4294967295 (2**32-1, the seeds numpy accepts), got 99999999999999999999"),
    # counts: bounded by the data and the model, from the recipe
    Case("recipe limit past any data", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "prompts.txt}", "prompts.txt, limit: 99999999999999999999999}"), "-o", str(d / "o")],
         2, "line 6: data.limit: must be between 1 and 1000000 samples, got 99999999999999999999999"),
    Case("probe --limit past any data", lambda d, r, rec, done: ["probe", "zoo:shapes-t2i", "--data", "zoo:shapes/calibration", "--limit", "100000000000", "-o", str(d / "o")],
         2, "--limit must be between 1 and 1000000 samples, got 100000000000"),
    Case("export-weights --limit 0", lambda d, r, rec, done: ["export-weights", str(done), "--limit", "0", "-o", str(d / "o")],
         2, "--limit must be between 1 and 1000000 samples, got 0"),
    Case("steps past the scheduler's timesteps", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "steps: 2", "steps: 1000000000"), "-o", str(d / "o")],
         2, "model.settings.steps: 1000000000 is more than the 1000 timesteps the scheduler of"),
    Case("probe: --set steps past the scheduler's timesteps", lambda d, r, rec, done: ["probe", str(r / "pipe"), "--data", str(r / "prompts.txt"), "--set", "steps=1001", "-o", str(d / "o")],
         2, "--set steps: 1001 is more than the 1000 timesteps the scheduler of"),
    Case("absurd image height", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "steps: 2", "steps: 2, height: 1000000"), "-o", str(d / "o")],
         2, "line 5: model.settings.height: Input should be less than or equal to 8192"),
    Case("SD3 image past its position embeddings", lambda d, r, rec, done: ["probe", str(save_tiny_sd3(d / "sd3")), "--data", str(r / "prompts.txt"), "--set", "height=80", "-o", str(d / "o")],
         2, "--set height: 80 px is more than the transformer of"),
    Case("video frames the Wan VAE cannot take", lambda d, r, rec, done: ["probe", str(save_tiny_wan(d / "wan")), "--data", str(r / "prompts.txt"), "--set", "num_frames=4", "-o", str(d / "o")],
         2, "--set num_frames: 4 frames do not fit the video VAE of {d}/wan: it takes 1 + 2 x k frames (vae/config.json scale_factor_temporal 2), e.g. 3 or 5"),
    Case("whisper max_new_tokens past max_target_positions", lambda d, r, rec, done: ["probe", str(save_tiny_whisper(d / "w")), "--data", "zoo:speech/eval", "--set", "max_new_tokens=15", "-o", str(d / "o")],
         2, "--set max_new_tokens: 15 does not fit"),
    Case("whisper default max_new_tokens past max_target_positions", lambda d, r, rec, done: ["probe", str(save_tiny_whisper(d / "w")), "--data", "zoo:speech/eval", "-o", str(d / "o")],
         2, "its decoder takes 16 positions (config.json max_target_positions), 2 of them the prompt; use at most 14"),
    # issue 58: data the model cannot take or that says nothing, before the model loads
    Case("all-silent calibration audio", lambda d, r, rec, done: ["calibrate", "--model", str(save_tiny_whisper(d / "w")), "--data", _silent_wavs(d), "--set", "max_new_tokens=8", "-o", str(d / "o")],
         2, "the calibration data " + "{d}/quiet: all 2 recordings are silent (peak at most 0.0001, -80 dBFS): activation ranges measured on silence mean nothing; give recordings of speech (a whisper model takes 16 kHz audio)"),
    Case("prompts held out for a whisper model", lambda d, r, rec, done: ["calibrate", "--model", str(save_tiny_whisper(d / "w")), "--data", "zoo:speech/eval", "--limit", "2", "--holdout", str(r / "prompts.txt"), "--set", "max_new_tokens=8", "-o", str(d / "o")],
         2, "the held-out data {r}/prompts.txt: sample 0 has no audio (a whisper model takes 16 kHz audio)"),
    Case("suite max_new_tokens past the decoder", lambda d, r, rec, done: ["evaluate", "--candidate", str(save_tiny_whisper(d / "w")), "--suite", _suite(d, ASR_SUITE.replace("TOKENS", "100000")), "-o", str(d / "rep")],
         2, "suite s: generation.max_new_tokens: 100000 does not fit {d}/w: its decoder takes 16 positions (config.json max_target_positions), 2 of them the prompt; use at most 14"),
    Case("calibrate --evaluate: suite max_new_tokens past the decoder", lambda d, r, rec, done: ["calibrate", "--model", str(save_tiny_whisper(d / "w")), "--data", "zoo:speech/eval", "--set", "max_new_tokens=8", "--evaluate", _suite(d, ASR_SUITE.replace("TOKENS", "100000")), "-o", str(d / "o")],
         2, "suite s: generation.max_new_tokens: 100000 does not fit"),
    Case("policy build: probe.json listing a module twice", lambda d, r, rec, done: ["policy", "build", _probe_edited(done, d, _twice), "--target", "ascend910b-atc", "-o", str(d / "p.yaml")],
         2, "{d}/probe.json: modules: text_encoder.encoder.layers.0 is listed twice; a probe report lists each module once"),
    Case("--max-memory 1KiB", lambda d, r, rec, done: ["calibrate", str(rec), "--max-memory", "1KiB", "-o", str(d / "o")],
         2, "batch 2 need at least 768.0 KiB (weights 0 B + 768.0 KiB for the UNet's first level), more than the 1.0 KiB --max-memory"),
    Case("probe: all-silent audio", lambda d, r, rec, done: ["probe", str(save_tiny_whisper(d / "w")), "--data", _silent_wavs(d), "--set", "max_new_tokens=8", "-o", str(d / "o")],
         2, "all 2 recordings are silent", may_load=True),
    Case("probe: --set typo", lambda d, r, rec, done: ["probe", str(r / "pipe"), "--data", str(r / "prompts.txt"), "--set", "stepz=2", "-o", str(d / "o")],
         2, "diffusers-sd settings: stepz: Extra inputs are not permitted"),
    Case("probe: --set wrong type", lambda d, r, rec, done: ["probe", str(r / "pipe"), "--data", str(r / "prompts.txt"), "--set", "steps=ten", "-o", str(d / "o")],
         2, "diffusers-sd settings: steps: Input should be a valid integer"),
    Case("probe: --set without =", lambda d, r, rec, done: ["probe", str(r / "pipe"), "--data", str(r / "prompts.txt"), "--set", "steps", "-o", str(d / "o")],
         2, "--set takes KEY=VALUE (e.g. max_new_tokens=32), got 'steps'"),
    # NaN and infinities in a recipe
    Case("min_sqnr_db NaN", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "target: ascend910b-atc", "target: ascend910b-atc\nbudget: {default: {min_sqnr_db: .nan}}"), "-o", str(d / "o")],
         2, "line 9: budget.default.min_sqnr_db: Input should be a finite number"),
    Case("min_headroom inf", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "max_root_calls: 2", "max_root_calls: 2, min_headroom: .inf"), "-o", str(d / "o")],
         2, "line 7: probe.min_headroom: Input should be a finite number"),
    Case("guidance_scale NaN", lambda d, r, rec, done: ["calibrate", _recipe_with(rec, d, "steps: 2", "steps: 2, guidance_scale: .nan"), "-o", str(d / "o")],
         2, "line 5: model.settings.guidance_scale: Input should be a finite number"),
    Case("description.json lacks a key", lambda d, r, rec, done: ["evaluate", "--candidate", _candidate_missing_key(done, d), "--suite", "shapes-t2i", "-o", str(d / "rep")],
         2, "lacks weight_shape"),
    Case("policy export onto a directory", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "amct-cfg", "-o", str(done)],
         2, "is a directory; give a file path"),
    Case("policy export under a file", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "amct-cfg", "-o", str(_bytes(d, "f", b"x") / "amct.cfg")],
         2, "is a file, not a directory"),
    Case("policy export --onnx missing", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "atc-customize-dtypes", "-o", str(d / "c.cfg"), "--onnx", str(d / "no.onnx")],
         2, "no.onnx: No such file or directory"),
    Case("policy export --onnx not ONNX", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "atc-customize-dtypes", "-o", str(d / "c.cfg"), "--onnx", str(_bytes(d, "m.onnx", b"hello"))],
         2, "m.onnx is not an ONNX model: Error parsing message"),
    Case("policy export --onnx empty", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "atc-customize-dtypes", "-o", str(d / "c.cfg"), "--onnx", str(_bytes(d, "m.onnx", b""))],
         2, "m.onnx is empty (0 bytes)"),
    Case("policy export --onnx a directory", lambda d, r, rec, done: ["policy", "export", str(done / "policy.yaml"), "-f", "atc-customize-dtypes", "-o", str(d / "c.cfg"), "--onnx", str(d)],
         2, "Is a directory"),
    Case("policy not UTF-8", lambda d, r, rec, done: ["policy", "show", str(_bytes(d, "policy.yaml", b"model: caf\xe9\n")), "--probe", str(done / "probe.json")],
         2, "is not UTF-8 text"),
    Case("policy show: a rule matching nothing", lambda d, r, rec, done: ["policy", "show", _policy_with(done, d, lambda t: t.replace("rules:\n", "rules:\n- match: unet.nothing.here\n  precision: fp32\n  reason: x\n"))],
         2, "matches no module of the model"),
    Case("policy show: bf16 on a target without it", lambda d, r, rec, done: ["policy", "show", _policy_with(done, d, _bf16_on_310p)],
         2, "target ascend310p cannot run"),
    # issue 41: our own files read back are user files; one line whatever the path holds
    Case("policy build: probe.json with a NaN absmax", lambda d, r, rec, done: ["policy", "build", _probe_edited(done, d, _nan_absmax), "--target", "ascend910b-atc", "-o", str(d / "p.yaml")],
         2, "fp16.output_absmax: Input should be a number, not NaN"),
    Case("calibrate --from-probe: negative MACs", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(d / "o"), "--from-probe", _probe_edited(done, d, _negative_macs)],
         2, ".macs: Input should be greater than or equal to 0"),
    Case("policy show: a glob past 4096 characters", lambda d, r, rec, done: ["policy", "show", _policy_with(done, d, _with_rules("- {match: '" + "unet.*" * 700 + "', precision: fp32}\n"))],
         2, "rules.0.match: String should have at most 4096 characters (line"),
    Case("policy show: a 10 MB glob", lambda d, r, rec, done: ["policy", "show", _policy_with(done, d, _with_rules("- {match: '" + "unet.*" * 1_750_000 + "', precision: fp32}\n"))],
         2, "bytes, more than the 8388608 a policy file may hold (at most 20000 rules)"),
    Case("policy show: 20 001 rules", lambda d, r, rec, done: ["policy", "show", _policy_with(done, d, _with_rules("- {match: unet.conv_in, precision: fp32}\n" * 20_001))],
         2, "rules: more than the 20000 entries it may hold (line"),
    Case("input path with a newline", lambda d, r, rec, done: ["policy", "show", str(d / "my\npolicy.yaml")],
         2, "my\\npolicy.yaml not found"),
    Case("output path with a newline", lambda d, r, rec, done: ["calibrate", str(rec), "-o", str(_bytes(d, "f\nx", b"x") / "o")],
         2, "f\\nx is a file, not a directory"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, tiny, tmp_path, monkeypatch, capsys):
    root, recipe, done = tiny
    if case.needs_no_cuda:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    before = {p: p.read_bytes() for p in done.rglob("*") if p.is_file()}
    if not case.may_load:
        import opsnn_quant.models

        def refuse(*a, **k):
            raise AssertionError("a model was loaded before the input was checked")

        monkeypatch.setattr(opsnn_quant.models, "load_adapter", refuse)
        monkeypatch.setattr("opsnn_quant.pipeline.context.load_adapter", refuse)
    monkeypatch.chdir(tmp_path)
    argv = case.argv(tmp_path, root, recipe, done)
    assert main(argv) == case.code
    err = _errors(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert case.line.replace("{d}", str(tmp_path)).replace("{r}", str(root)) in err[0], err[0]
    after = {p: p.read_bytes() for p in done.rglob("*") if p.is_file()}
    assert after == before, "the finished output was touched"
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    if (tmp_path / "o").is_dir() and (tmp_path / "o" / "notes.txt").exists():
        assert (tmp_path / "o" / "notes.txt").read_text() == "precious\n"


@pytest.mark.parametrize("value", ["99999999999999999999", "253402300800", "yesterday", "-1"])
def test_a_source_date_epoch_that_is_no_time_is_one_line_before_any_work(
    value, tiny, tmp_path, monkeypatch, capsys
):
    # issue 58: a huge one was a traceback (numpy.f2py reads it as transformers loads)
    _, _, done = tiny
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    argv = [
        "evaluate",
        "--candidate",
        str(done),
        "--suite",
        "shapes-t2i",
        "-o",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    err = _errors(capsys.readouterr().err)
    assert err == [
        f"error: SOURCE_DATE_EPOCH={value!r} is not a time: give whole seconds since 1970 from 0 "
        "to 253402300799 (9999-12-31), or unset it to record the time of the run"
    ]
    assert not (tmp_path / "r").exists()


def test_force_replaces_our_edited_output_and_an_empty_directory(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()  # empty: no --force needed
    assert main(["engine-demo", "-o", str(out)]) == 0
    assert json.loads((out / MARKER).read_text())["kind"] == "quant"
    (out / "notes.txt").write_text("added since\n")  # edited: ours still, with --force
    assert main(["engine-demo", "-o", str(out)]) == 2
    assert main(["engine-demo", "-o", str(out), "--force"]) == 0
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()
    assert main(["engine-demo", "-o", str(out)]) == 0  # its own output: replaced without --force


def test_force_onto_a_home_directory_is_refused_and_deletes_nothing(
    tiny, tmp_path, monkeypatch, capsys
):
    # issue 58 §2: calibrate --model M --data D -o ~ --force replaced the home directory
    root, _, _ = tiny
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    (home / "Documents" / "thesis.txt").write_text("years of work\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)  # (from inside it, -o ~ is refused as the working directory)

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the output was checked")

    monkeypatch.setattr("opsnn_quant.pipeline.context.load_adapter", refuse)
    argv = ["calibrate", "--model", str(root / "pipe"), "--data", str(root / "prompts.txt")]
    assert main([*argv, "-o", str(home), "--force"]) == 2
    err = _errors(capsys.readouterr().err)
    assert err == [
        f"error: output {home} is your home directory; choose a new directory inside it "
        "(--force replaces only opsnn-quant outputs)"
    ]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "home", "home/Documents", "home/Documents/thesis.txt"
    ]  # fmt: skip
    assert (home / "Documents" / "thesis.txt").read_text() == "years of work\n"


def test_a_full_disk_after_the_model_loaded_is_one_line_and_the_old_output_survives(
    tiny, tmp_path, monkeypatch, capsys
):
    _, recipe, done = tiny
    out = tmp_path / "out"
    shutil.copytree(done, out)
    before = (out / "policy.yaml").read_bytes()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("opsnn_quant.formats.checkpoint.save", full)
    assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 2
    err = _errors(capsys.readouterr().err)
    assert err == [f"error: cannot write {out}/quant: No space left on device"]
    assert (out / "policy.yaml").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_read_only_output_location_is_refused_before_loading(tiny, tmp_path, monkeypatch, capsys):
    _, recipe, _ = tiny
    import opsnn_quant.output.places

    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(opsnn_quant.output.places.tempfile, "mkdtemp", read_only)
    monkeypatch.setattr("opsnn_quant.pipeline.context.load_adapter", lambda *a, **k: 1 / 0)
    assert main(["calibrate", str(recipe), "-o", str(tmp_path / "o")]) == 2
    assert _errors(capsys.readouterr().err) == [
        f"error: cannot write {tmp_path / 'o'}: Read-only file system"
    ]


@pytest.mark.slow
def test_sigterm_cleans_up_like_ctrl_c(tiny, tmp_path):
    # What `timeout` and CI cancellation send: the run stops with one line and exit 143, its
    # temporary output is removed and the previous output is intact.
    _, recipe, done = tiny
    out = tmp_path / "out"
    shutil.copytree(done, out)
    before = (out / "policy.yaml").read_bytes()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from opsnn_quant.cli import main; sys.exit(main())",
         "calibrate", str(recipe), "-o", str(out), "--quiet"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("out.tmp-*")) and time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"calibrate ended before it started writing: {proc.stderr.read()}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "interrupted (SIGTERM)"
    assert (out / "policy.yaml").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_ctrl_c_prints_one_interrupted_line_and_leaves_the_old_output_whole(
    tiny, tmp_path, monkeypatch, capsys, caplog
):
    _, recipe, done = tiny
    out = tmp_path / "out"
    shutil.copytree(done, out)
    before = (out / "policy.yaml").read_bytes()
    import opsnn_quant.pipeline.calibrate

    real = opsnn_quant.pipeline.calibrate.save_quantized

    def interrupted(*a, **k):  # a Ctrl-C arrives while the checkpoint is being written
        real(*a, **k)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(opsnn_quant.pipeline.calibrate, "save_quantized", interrupted)
    assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 130
    assert _errors(capsys.readouterr().err) == ["interrupted"]
    assert (out / "policy.yaml").read_bytes() == before
    # the finished phases (probe, policy) stay aside, unfinished, for --resume
    # (tests/pipeline/test_resume.py); nothing of the new run is in OUT
    kept = [p for p in tmp_path.iterdir() if p.name != "out"]
    assert [p.name.startswith("out.tmp-") for p in kept] == [True]
    assert json.loads((kept[0] / ".resume.json").read_text())["done"] == ["probe", "policy"]
    assert "the same command with --resume goes on" in caplog.text


def test_probe_of_a_model_dir_runs_at_the_models_own_limit(tmp_path):
    # 14 new tokens + the 2-token prompt fill the 16 decoder positions exactly: transformers
    # refuses 15 (the case above refuses it before loading), so the bound is the model's own.
    w = save_tiny_whisper(tmp_path / "w")
    argv = ["probe", str(w), "--data", "zoo:speech/eval", "--limit", "2", "--quiet"]
    argv += ["--set", "max_new_tokens=14", "--set", "batch_size=2", "-o", str(tmp_path / "o")]
    assert main(argv) == 0  # the default max_new_tokens (64) would have been refused
    assert json.loads((tmp_path / "o" / "probe.json").read_text())["modules"]


@pytest.mark.parametrize("command", ["calibrate", "probe"])
def test_a_bad_moments_cap_is_one_line_before_the_model_loads(
    command, tiny, tmp_path, monkeypatch, capsys
):
    # OPSNN_QUANT_MOMENTS_MEMORY is read at pass 1 (opsnn_quant.probe.moments); a bad value was
    # refused only after the model had loaded
    _, recipe, _ = tiny
    import opsnn_quant.models

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(opsnn_quant.models, "load_adapter", refuse)
    monkeypatch.setattr("opsnn_quant.pipeline.context.load_adapter", refuse)
    monkeypatch.setenv("OPSNN_QUANT_MOMENTS_MEMORY", "lots")
    monkeypatch.chdir(tmp_path)
    assert main([command, str(recipe), "-o", str(tmp_path / "o")]) == 2
    err = _errors(capsys.readouterr().err)
    assert err == ["error: OPSNN_QUANT_MOMENTS_MEMORY='lots': give a positive number of bytes"]
    assert not (tmp_path / "o").exists()
