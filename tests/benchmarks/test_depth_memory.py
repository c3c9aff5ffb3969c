"""Calibrate's peak memory grows with a model's depth no faster than its weights (issue 43 §4).

A width-heavy, tiny-depth FLUX pipeline (transformer 1152 wide = 9 heads x 128, tiny text
encoders and VAE, a 16 px image: its weights dominate the process's memory) is built at depth 1
(one double- + one single-stream block) and depth 2; ``run_calibrate`` runs on each in a child
process of its own (the int8 GEMM path forced to ``fp32-chunk``, so the CPU kind does not
matter), and the children's peak RSS (VmHWM) are compared. The issue's goal: doubling the depth
adds at most the extra parameters' bytes + 10 %; not met yet, so the test guards what is reached
(less than twice the extra bytes; see ``GUARD``).

The recipe is the user's default search (the SmoothQuant search, GPTQ candidates, attribution,
every export) made cheap only where the per-module memory does not change: one prompt, one
step, one recorded root call, one replayed sample, the diagonal estimator, and one scheme of
each kind that holds memory per module (``SCHEMES``), not every variant the target runs. 1152 keeps every input width below GPTQ's K limit (4096) except
the MLP down-projections (4608, 5760), whose GPTQ would dominate the time.

GPTQ's K x K input moments (24 bytes per K^2 per Linear while collected) are what grew most
here (x4.1 the extra weights): both depths now exceed the moments' memory cap
(``opsnn_quant.probe.moments``, 512 MiB), so they are collected in groups and spilled to files,
and pass 2 drops each module's candidates after its last call (see the xfail for what remains).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.real_widths import build_flux
from tests.benchmarks._child import PRELUDE

CHILD = (
    PRELUDE
    + r"""
recipe = Recipe.model_validate(json.loads(sys.argv[1]))
run_calibrate(recipe, sys.argv[2], force=True)
print("PEAK", hwm())
"""
)


def _start(source: Path, prompts: Path, out: Path) -> tuple[subprocess.Popen[bytes], Path]:
    recipe = {
        "name": "depth",
        "model": {"family": "diffusers-dit", "source": str(source),
                  "settings": {"steps": 1, "batch_size": 1, "height": 16, "width": 16,
                               "max_sequence_length": 8}},
        "data": {"calibration": str(prompts)},
        "probe": {"max_root_calls": 1, "estimator": "diagonal", "estimator_samples": 1,
                  "schemes": list(SCHEMES)},
        "target": "ascend910b-eager",
    }  # fmt: skip
    env = {**os.environ, "OPSNN_QUANT_INT8_GEMM": "fp32-chunk", "OMP_NUM_THREADS": "1"}
    # output to a file, not a pipe: a child whose pipe is full would wait for the other to end
    log = out.with_suffix(".log")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(recipe), str(out)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return proc, log


def _peak_bytes(child: tuple[subprocess.Popen[bytes], Path]) -> int:
    proc, log = child
    proc.wait()
    text = log.read_text(errors="replace")
    peaks = [ln for ln in text.splitlines() if ln.startswith("PEAK ")]
    assert proc.returncode == 0 and peaks, text[-3000:]
    return int(peaks[-1].split()[1])


# One scheme of each kind whose statistics or candidates hold memory per module: static (its
# ranges and histograms), per-token dynamic, and SmoothQuant with GPTQ (the row reservoirs the
# alpha search reads, GPTQ's K x K moments, the candidates pass 2 keeps until a module's last
# call). The target's other GPTQ variants (plain, dynamic) add the same terms again at two more
# roundings per module each: 67 -> 50 s per child, where GPTQ's roundings at K = 1152 were most
# of the time (cProfile, one thread).
SCHEMES = ("w8a8", "w8a8_dynamic", "w8a8_smoothquant_gptq")

# Issue 43 §4's goal is +10 % (x1.10): NOT MET. Measured 2026-12-05 (AVX-512 VNNI, 2 busy
# cores, seven runs): depth 1 -> 2 adds 250-370 MB for 258 MB more weights (x0.97-1.42; with
# MALLOC_MMAP_THRESHOLD_=131072 x1.66): freed heap pages glibc keeps between trims and pass 1's
# per-module statistics (SmoothQuant's row reservoirs, histograms), with +-60 MB of run-to-run
# noise in the peaks. Before GPTQ's K x K moments were grouped and spilled (d68420a) it was
# x4.1. This test guards against that term coming back: it fails above x2. With SCHEMES
# (2026-12-06, same machine, one run): 1139 -> 1487 MB, x1.35, inside that range.
GUARD = 2.0


@pytest.mark.slow
def test_doubling_depth_adds_less_than_twice_the_extra_weights(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    params = {}
    children = {}
    for depth in (1, 2):
        info = build_flux(tmp_path / f"d{depth}", double=depth, single=depth, heads=9,
                          head_dim=128, t5=(256, 512, 4, 64), clip=(64, 128, 2), text_layers=1,
                          real_vae=False)  # fmt: skip
        params[depth] = info["params"]
    # Both depths at once, one thread each: each child's peak (VmHWM) is its own process's, so
    # running them side by side changes no figure, and the suite's slowest test takes half as long.
    for depth in (1, 2):
        children[depth] = _start(tmp_path / f"d{depth}", prompts, tmp_path / f"out{depth}")
    peaks = {depth: _peak_bytes(proc) for depth, proc in children.items()}
    extra = (params[2] - params[1]) * 4  # float32 weights
    added = peaks[2] - peaks[1]
    mb = 2**20
    print(f"depth 1 -> 2: {peaks[1] / mb:.0f} -> {peaks[2] / mb:.0f} MB, +{added / mb:.0f} MB for "
          f"{extra / mb:.0f} MB more weights (x{added / extra:.2f})")  # fmt: skip
    assert added <= GUARD * extra, (
        f"doubling the depth added {added / mb:.0f} MB to calibrate's peak RSS "
        f"({peaks[1] / mb:.0f} -> {peaks[2] / mb:.0f} MB) for {extra / mb:.0f} MB more weights "
        f"(x{added / extra:.2f}; guard x{GUARD}, goal x1.10)"
    )
