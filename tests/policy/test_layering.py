"""The policy modules import downwards only: no cycle, no back-import (checked in fresh
interpreters, where an import order hides nothing)."""

import json
import subprocess
import sys

import pytest


def _loaded_after(module: str) -> set[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("module", "must_not_load"),
    [
        ("opsnn_quant.policy._rules", "opsnn_quant.policy.search"),
        ("opsnn_quant.formats.atc.precision", "opsnn_quant.formats.policy_files"),
        ("opsnn_quant.output.directories", "onnx"),
        ("opsnn_quant.formats.atc.onnx.files", "onnx"),
        ("opsnn_quant.formats.policy_files", "torch"),
    ],
)
def test_module_does_not_pull_in(module, must_not_load):
    assert must_not_load not in _loaded_after(module)


def test_onnx_helpers_have_one_home_each():
    pytest.importorskip("onnx")
    from opsnn_quant.formats.atc.onnx import export as onnx_export
    from opsnn_quant.formats.atc.onnx import runtime as onnx_runtime

    assert callable(onnx_runtime.to_uint8_weights) and callable(onnx_runtime.onnxruntime_session)
    for moved in ("to_uint8_weights", "onnxruntime_session", "load_node_map"):
        assert not hasattr(onnx_export, moved), moved  # no re-exports: import the defining module
