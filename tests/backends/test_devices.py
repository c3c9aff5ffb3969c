"""Device and dtype names: resolution, availability errors, labels."""

from __future__ import annotations

import pytest
import torch

from opsnn_quant.backends.devices import backend_label, resolve_device, resolve_dtype
from opsnn_quant.errors import ConfigError, DeviceUnavailableError, InputError


def test_cpu_and_dtypes_resolve():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype("float16") is torch.float16


@pytest.mark.parametrize("name", ["tpu", "npu0", "cuda:x", "CPU", ""])
def test_unknown_device_names_are_config_errors(name):
    with pytest.raises(ConfigError, match="device must be cpu, npu, npu:N, cuda or cuda:N"):
        resolve_device(name)


def test_an_npu_without_torch_npu_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torch_npu(name, *a, **k):
        if name == "torch_npu":
            raise ImportError("no torch_npu")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch_npu)
    with pytest.raises(DeviceUnavailableError, match="device npu:1 needs torch_npu") as err:
        resolve_device("npu:1")
    assert isinstance(err.value, InputError)  # bad input: the CLI exits 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_missing_is_bad_input():
    with pytest.raises(
        DeviceUnavailableError, match=r"device cuda:0 is not available here \(0 cuda"
    ):
        resolve_device("cuda:0")


def test_unknown_dtype():
    with pytest.raises(ConfigError, match="dtype must be one of float32, float16, bfloat16"):
        resolve_dtype("int8")


def test_labels_name_the_backend():
    assert backend_label(torch.device("cpu")) == "cpu-reference"
    # torch knows "npu" only once torch_npu registered it: a stand-in with its type.
    assert backend_label(type("Npu", (), {"type": "npu"})()) == "npu"  # type: ignore[arg-type]
    assert backend_label(torch.device("cuda", 0)) == "cuda-reference"
