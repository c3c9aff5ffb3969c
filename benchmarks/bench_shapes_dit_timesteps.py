"""Issue 16 §4: is the search worth it on a diffusion transformer, and do per-step scales help?

Calibrates the zoo's ``shapes-dit`` (an SD3 pipeline; built-in recipe, target 910B eager) under
each configuration below, evaluates each against the fp32 pipeline on the built-in
``shapes-dit`` suite (its 512 held-out prompts, 8 Euler steps, seed 0), and prints one markdown table
(FD / CLIP / PSNR / SSIM and their deltas, int8 MAC share, verdict) plus the per-step input
range table of the denoiser's modules from the probe of the timestep run.

Configurations:

* ``all-fp16``: nothing int8; the candidate's float modules evaluated in fp16;
* ``all-w8a8-minmax`` / ``all-w8a8-dynamic``: the naive baselines (every module the target
  runs, one scheme, no search);
* ``static``: the searched policy with static activation scales only
  (w8a8, w8a8_mse, w8a8_smoothquant);
* ``static+timestep``: the same plus ``w8a8_timestep`` and ``w8a8_timestep_smoothquant``
  (per-step-group static scales, on raw or smoothed inputs): equal coverage rules, so the two
  rows isolate what per-step scales buy;
* ``search``: the built-in recipe as it ships (every scheme 910B eager runs, per-token dynamic
  included).

Backend: cpu (PyTorch eager fp32 and the exact Ascend int8 reference); latency is not timed.

Run: ``python benchmarks/bench_shapes_dit_timesteps.py [--workdir DIR] [--only NAME,...]``
(about 5 minutes per configuration on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from opsnn_quant.core.resources import builtin_files

STATIC = ["w8a8", "w8a8_mse", "w8a8_smoothquant"]
# name -> (strategy, probe.schemes or None, candidate dtype)
CONFIGS: dict[str, tuple[str, list[str] | None, str]] = {
    "all-fp16": ("all-fp16", None, "float16"),
    "all-w8a8-minmax": ("all-w8a8-minmax", None, "float32"),
    "all-w8a8-dynamic": ("all-w8a8-dynamic", None, "float32"),
    "static": ("search", STATIC, "float32"),
    "static+timestep": (
        "search",
        [*STATIC, "w8a8_timestep", "w8a8_timestep_smoothquant"],
        "float32",
    ),
    "search": ("search", None, "float32"),
}


def _recipe(workdir: Path, name: str, schemes: list[str] | None) -> Path:
    data = yaml.safe_load(builtin_files("recipes")["shapes-dit"].read_text())
    data["name"] = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    if schemes is not None:
        data["probe"]["schemes"] = schemes
    path = workdir / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(cmd: list[str]) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode not in (0, 3, 4):  # 3 FAIL, 4 INCONCLUSIVE: verdicts like any other
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return proc.stdout


def _row(workdir: Path, name: str) -> dict[str, Any]:
    strategy, schemes, dtype = CONFIGS[name]
    out = workdir / f"{name}.cal"
    report = workdir / f"{name}.report"
    recipe = _recipe(workdir, name, schemes)
    cal = ["opsnn-quant", "calibrate", str(recipe), "-o", str(out), "--force"]
    printed = _run([*cal, "--strategy", strategy])
    share = re.search(r"int8 MAC share overall: (\S+);", printed)
    _run(["opsnn-quant", "evaluate", "--candidate", str(out), "--suite", "shapes-dit",
          "-o", str(report), "--force", "--quiet", "--latency", "none",
          "--candidate-dtype", dtype])  # fmt: skip
    rep = json.loads((report / "report.json").read_text())
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    per_step = sum(
        1 for r in policy.get("rules", []) if (r.get("quant") or {}).get("timestep_bounds")
    )
    return {
        "name": name,
        "report": rep,
        "int8_mac_share": share.group(1) if share else "?",
        "timestep_rules": per_step,
        "probe": out / "probe.json",
    }


def _metric(rep: dict[str, Any], prefix: str) -> tuple[float | None, float | None]:
    """(candidate value, delta vs baseline) of the report's quality row named ``prefix...``."""
    row = next((q for q in rep["quality"] if q["metric"].startswith(prefix)), None)
    return (None, None) if row is None else (row["candidate"], row["delta"])


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The comparison table (markdown)."""
    head = (
        "| configuration | FD vs ref | ΔFD | FD vs fp32 | CLIP | ΔCLIP | PSNR dB (median) | "
        "SSIM (mean) | int8 MACs | per-step rules | verdict |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        rep = r["report"]
        fd, dfd = _metric(rep, "FD vs reference")
        fd_pair, _ = _metric(rep, "FD candidate vs baseline")
        clip, dclip = _metric(rep, "CLIP score")
        psnr, _ = _metric(rep, "PSNR vs baseline (median)")
        ssim, _ = _metric(rep, "SSIM vs baseline (mean)")
        lines.append(
            f"| {r['name']} | {_fmt(fd)} | {_fmt(dfd)} | {_fmt(fd_pair, 4)} | {_fmt(clip, 2)} | "
            f"{_fmt(dclip)} | {_fmt(psnr, 2)} | {_fmt(ssim, 4)} | {r['int8_mac_share']} | "
            f"{r['timestep_rules']} | {rep['verdict']} |"
        )
    return "\n".join(lines)


def step_table(probe_json: Path, limit: int = 12) -> str:
    """Per-step input absmax of the denoiser modules whose range moves most (markdown)."""
    report = json.loads(probe_json.read_text())
    mods = [
        m for m in report["modules"]
        if m.get("timesteps") and m["modality"] == "denoiser"
    ]  # fmt: skip
    mods.sort(key=lambda m: -m["timesteps"]["single_scale_loss_db"])
    steps = mods[0]["timesteps"]["steps"] if mods else []
    head = "| module | " + " | ".join(f"t{s}" for s in steps)
    head += " | max/min | 1-scale loss dB | groups | gain dB |"
    lines = [head, "|" + "---|" * (len(steps) + 5)]
    for m in mods[:limit]:
        ts = m["timesteps"]
        cells = " | ".join(f"{a:.3g}" for a in ts["absmax"])
        lines.append(
            f"| {m['name']} | {cells} | {_fmt(ts['max_min_ratio'], 2)} | "
            f"{ts['single_scale_loss_db']:.2f} | {ts['bounds']} | {ts['groups_gain_db']:.2f} |"
        )
    losses = sorted(m["timesteps"]["single_scale_loss_db"] for m in mods)
    if losses:
        lines.append(
            f"\n{len(mods)} denoiser modules; one static scale loses a median "
            f"{losses[len(losses) // 2]:.2f} dB of input SQNR (max {losses[-1]:.2f} dB)."
        )
    return "\n".join(lines)


def main() -> None:
    """Run the configurations and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--only", default=",".join(CONFIGS))
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-dit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"error: unknown configuration(s) {unknown}; known: {list(CONFIGS)}")
    rows = []
    for name in names:
        rows.append(_row(workdir, name))
        print(f"done {name}", file=sys.stderr, flush=True)
    print(table(rows))
    timestep = next((r for r in rows if r["name"] == "static+timestep"), None)
    if timestep is not None:
        print()
        print(step_table(timestep["probe"]))
    print(f"\nbackend: cpu (exact Ascend int8 reference); outputs in {workdir}")


if __name__ == "__main__":
    main()
