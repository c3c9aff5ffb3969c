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


def test_using_the_toolkit_never_loads_the_zoo_training_scripts(tmp_path):
    # The zoo's training stages and gate report are scripts: loading a zoo model, probing and
    # quantizing it and reading its data imports none of them.
    code = (
        "import sys, json, torch; import opsnn_quant as oq\n"
        "a = oq.load_adapter('diffusers-sd', 'zoo:shapes-t2i', steps=1, batch_size=1)\n"
        "loop = a.forward_loop(oq.load_records('zoo:shapes/calibration', 1))\n"
        "oq.quantize(a.model, {'unet.conv_in': 'w8a8'}, loop)\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('opsnn_quant.zoo.training')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_oq_probe_is_the_function_whatever_was_imported_first():
    code = (
        "import opsnn_quant as oq, opsnn_quant.probe.api as api, torch\n"
        "from torch import nn\n"
        "m = nn.Sequential(nn.Linear(4, 4))\n"
        "r = oq.probe(m, lambda mod: mod(torch.randn(2, 4)), api.ProbeConfig(attribution=False))\n"
        "print(type(r).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "SensitivityReport"
