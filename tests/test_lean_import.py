"""``import opsnn_quant`` stays light (checked in a fresh interpreter, as torchao's test does)."""

import json
import subprocess
import sys

HEAVY = ["torch_npu", "transformers", "diffusers", "torchmetrics", "onnxruntime", "datasets"]


def test_import_does_not_pull_heavy_dependencies():
    code = (
        "import sys, json; import opsnn_quant, opsnn_quant.quant.api, opsnn_quant.ascend, "
        "opsnn_quant.backends, opsnn_quant.zoo; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
