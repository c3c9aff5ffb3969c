"""``opsnn-quant calibrate`` wall time and peak RSS on tiny random-config diffusion transformers.

Rows: SD3 (three text encoders, MMDiT), FLUX.1-dev-like (CLIP + T5, guidance embedding),
PixArt-Σ (T5), Wan2.1-like text to video (UMT5, 3-D VAE, 5 frames): the tiny 2-layer pipelines
the tests build (``tests/tiny_pipelines.py``), 16x16 px, 4 steps, 4 calibration prompts, target
910B eager (every scheme, ``w8a8_timestep`` included). Each calibrate runs in its own child
process; its peak RSS is that child's ``ru_maxrss``.

Random weights: the cost of each architecture's pipeline through the whole calibrate (probe,
search, quantize, exports), not its accuracy. Backend: cpu (PyTorch eager fp32 and the exact
Ascend int8 reference).

Run from the repository root: ``python benchmarks/bench_tiny_dit_calibrate.py [--workdir DIR]``.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' tiny builders

from tests import tiny_pipelines

ROWS = {
    "sd3": (tiny_pipelines.save_tiny_sd3, {}),
    "flux": (tiny_pipelines.save_tiny_flux, {}),
    "pixart-sigma": (lambda p: tiny_pipelines.save_tiny_pixart(p, sigma=True), {}),
    "wan-t2v": (tiny_pipelines.save_tiny_wan, {"num_frames": 5}),
}


def _measure(recipe: Path, out: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (MiB) of one calibrate, in a child process of its own."""
    probe = (
        "import resource, subprocess, sys;"
        "rc = subprocess.run(sys.argv[1:]).returncode;"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
        "sys.exit(rc)"
    )
    cmd = ["opsnn-quant", "calibrate", str(recipe), "-o", str(out), "--force", "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"calibrate failed on {recipe}")
    return seconds, int(proc.stdout.strip().splitlines()[-1]) // 1024


def main() -> None:
    """Build each tiny pipeline, calibrate it, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-tiny-dit-"))
    print("| pipeline | calibrate wall s | peak RSS MiB |\n|---|---|---|")
    for name, (build, extra) in ROWS.items():
        root = workdir / name
        root.mkdir(parents=True, exist_ok=True)
        build(root / "pipe")
        seconds, rss = _measure(
            tiny_pipelines.tiny_dit_recipe(root, name, target="ascend910b-eager", extra=extra),
            root / "out",
        )
        print(f"| {name} | {seconds:.1f} | {rss} |", flush=True)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"\nbackend: cpu; this process (building the pipelines) peaked at {own} MiB")


if __name__ == "__main__":
    main()
