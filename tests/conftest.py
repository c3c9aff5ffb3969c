"""Test-session setup: reproducible math before torch loads MKL (see opsnn_quant.cli)."""

import os

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# Idle OpenMP threads spin by default; on a shared 2-core machine that slows every other process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
