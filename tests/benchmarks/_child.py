"""The start of a memory benchmark's child process: the int8 GEMM path forced to ``fp32-chunk``
(the CPU kind does not matter), one thread, ``run_calibrate`` imported, and ``hwm()`` (the
process's peak RSS, VmHWM, in bytes). A test appends what its child runs."""

PRELUDE = r"""
import json, os, sys
os.environ["OPSNN_QUANT_INT8_GEMM"] = "fp32-chunk"
from opsnn_quant.core.determinism import set_reproducible
set_reproducible(seed=0, threads=1)
from opsnn_quant.pipeline.calibrate import run_calibrate
from opsnn_quant.pipeline.recipe import Recipe

def hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
"""
