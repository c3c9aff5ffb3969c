"""Test-session setup: reproducible math before torch loads MKL (see opsnn_quant.cli)."""

import os

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
