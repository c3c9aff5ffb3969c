"""What ``--max-memory`` saves (issue 43 §5): a FLUX pipeline whose transformer blocks dominate
the process's memory (512 wide, 2 double- + 6 single-stream blocks, ~170 MB of block weights in
fp32; tiny text encoders and VAE, a 16 px image), calibrated in a child process of its own all
in memory and with a cap that offloads every block, for each strategy of ``--strategies``:

* ``all-w8a8-dynamic``: a naive baseline (pass 1, quantize, quant/ and the exports);
* ``search``: the recipe's search (also GPTQ's moments, the SmoothQuant search and the
  structured estimator's replay, whose backward runs checkpointed block by block when
  offloaded, each block loaded through its backward for its modules' candidates);
* ``search-diagonal``: the same with ``probe.estimator: diagonal`` (the local errors in pass 2,
  each call's candidates built in its loaded block).

Prints each child's peak RSS (VmHWM), its wall time, the bytes offloaded, and whether the two
runs wrote the same files (``timings.json`` and the run record aside). Backend: cpu, the int8
GEMM forced to ``fp32-chunk``, one thread.

    python benchmarks/bench_offload_memory.py [--strategies all-w8a8-dynamic,search,search-diagonal]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.real_widths import build_flux

# The child: the GEMM path forced, one thread, the offloader's bytes and the peak RSS printed.
CHILD = r"""
import json, os, sys
os.environ["OPSNN_QUANT_INT8_GEMM"] = "fp32-chunk"
from opsnn_quant.core.determinism import set_reproducible
set_reproducible(seed=0, threads=1)
from opsnn_quant.models import offload
from opsnn_quant.pipeline.calibrate import run_calibrate
from opsnn_quant.pipeline.recipe import Recipe

init = offload.BlockOffload.__init__

def record(self, *args, **kwargs):
    init(self, *args, **kwargs)
    sizes = [offload._nbytes(b.module) for b in self.blocks.values()]  # on meta: shapes only
    print("OFFLOADED", sum(sizes), len(sizes))

offload.BlockOffload.__init__ = record

recipe = Recipe.model_validate(json.loads(sys.argv[1]))
cap = None if sys.argv[3] == "none" else int(sys.argv[3])
run_calibrate(recipe, sys.argv[2], force=True, max_memory=cap)
with open("/proc/self/status") as f:
    print("PEAK", next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:")))
"""
CAP = 32 << 20  # below the rest of the pipeline and one block: every block offloaded
STRATEGIES = {
    "all-w8a8-dynamic": {"strategy": "all-w8a8-dynamic", "probe": {"max_root_calls": 1}},
    "search": {"probe": {"max_root_calls": 1}},  # the structured estimator (the default)
    "search-diagonal": {"probe": {"max_root_calls": 1, "estimator": "diagonal"}},
}
IGNORED = ("timings.json", ".opsnn-quant.json")  # times, and the run's record of them


def build(root: Path) -> dict[str, Any]:
    """The pipeline (``root/pipe``) and one prompt (``root/prompts.txt``); its counts."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "prompts.txt").write_text("a red circle\n")
    return build_flux(
        root / "pipe", double=2, single=6, heads=4, head_dim=128, t5=(64, 128, 2, 32),
        clip=(64, 128, 2), text_layers=1, real_vae=False,
    )  # fmt: skip


def peak(root: Path, out: Path, cap: int | None, strategy: str) -> dict[str, Any]:
    """One child's calibrate of ``root``'s pipeline into ``out``: ``peak`` (bytes),
    ``offloaded`` (bytes), ``seconds``."""
    recipe = {
        "name": "offload-peak",
        "model": {"family": "diffusers-dit", "source": str(root / "pipe"),
                  "settings": {"steps": 1, "batch_size": 1, "height": 16, "width": 16,
                               "max_sequence_length": 8}},
        "data": {"calibration": str(root / "prompts.txt"), "limit": 1},
        "target": "ascend910b-mindie-sd",
        **STRATEGIES[strategy],
    }  # fmt: skip
    env = {**os.environ, "OPSNN_QUANT_INT8_GEMM": "fp32-chunk", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(recipe), str(out), str(cap or "none")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    lines = proc.stdout.splitlines()
    peaks = [ln for ln in lines if ln.startswith("PEAK ")]
    if proc.returncode != 0 or not peaks:
        raise RuntimeError(f"the calibrate child failed:\n{proc.stderr[-3000:]}")
    offloaded = sum(int(ln.split()[1]) for ln in lines if ln.startswith("OFFLOADED "))
    return {"peak": int(peaks[-1].split()[1]), "offloaded": offloaded, "seconds": seconds}


def differing(a: Path, b: Path) -> list[str]:
    """The files of output ``a`` missing from ``b`` or with other bytes (times aside)."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return [
        str(p) for p in files
        if p.name not in IGNORED
        and (not (b / p).is_file() or (a / p).read_bytes() != (b / p).read_bytes())
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-offload-"))
    counts = build(root)
    mib = 2**20
    print(f"FLUX 512 wide, 2 + 6 blocks: {counts['block_params'] * 4 / mib:.0f} MiB of block "
          "weights (fp32); cpu backend, fp32-chunk int8 GEMM, one thread")  # fmt: skip
    for strategy in args.strategies.split(","):
        mem = peak(root, root / f"{strategy}-mem", None, strategy)
        off = peak(root, root / f"{strategy}-off", CAP, strategy)
        differ = differing(root / f"{strategy}-mem", root / f"{strategy}-off")
        same = "yes" if not differ else ", ".join(differ) + " differ"
        print(f"{strategy:18} in memory {mem['peak'] / mib:6.0f} MiB {mem['seconds']:6.1f} s | "
              f"capped {off['peak'] / mib:6.0f} MiB {off['seconds']:6.1f} s | offloaded "
              f"{off['offloaded'] / mib:.0f} MiB | same files: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
