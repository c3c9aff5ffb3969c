"""run_amct hand-off, checked against a STAND-IN ``amct_pytorch`` module.

AMCT ships with CANN, not PyPI, so it is not installed here. The stand-in below only records the
calls and their arguments (and writes the files the real ``save_model`` is documented to write);
it does no quantization. The tests check that run_amct calls AMCT's documented API in the
documented order with the policy's settings.
"""

import sys
import types
from pathlib import Path

import pytest
import torch

from opsnn_quant.amct.run import run_amct
from opsnn_quant.errors import CalibrationError, MissingDependencyError
from opsnn_quant.policy.rule import QuantFields, Rule
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.types import Precision
from tests.tiny_models import TinyMLP, forward_loop_for


def _standin(calls: list) -> types.ModuleType:
    mod = types.ModuleType("amct_pytorch")

    def create_quant_config(config_file, model, input_data, skip_layers=None, batch_num=1,
                            activation_offset=True, config_defination=None):  # fmt: skip
        calls.append(("create_quant_config", {
            "config_file": config_file, "model": model, "input_data": input_data,
            "skip_layers": skip_layers, "batch_num": batch_num,
            "activation_offset": activation_offset, "config_defination": config_defination,
        }))  # fmt: skip
        Path(config_file).write_text("{}")

    def quantize_model(config_file, modfied_onnx_file, record_file, model, input_data,
                       input_names=None, output_names=None, dynamic_axes=None):  # fmt: skip
        calls.append(("quantize_model", (config_file, modfied_onnx_file, record_file, model, input_data),
                      {"input_names": input_names, "output_names": output_names, "dynamic_axes": dynamic_axes}))  # fmt: skip
        return model  # the real one returns a calibration torch.nn.Module

    def save_model(modfied_onnx_file, record_file, save_path):
        calls.append(("save_model", (modfied_onnx_file, record_file, save_path)))
        for kind in ("deploy_model", "fake_quant_model"):
            Path(f"{save_path}_{kind}.onnx").write_bytes(b"")

    mod.create_quant_config = create_quant_config  # type: ignore[attr-defined]
    mod.quantize_model = quantize_model  # type: ignore[attr-defined]
    mod.save_model = save_model  # type: ignore[attr-defined]
    return mod


POLICY = PrecisionPolicy(
    model="tiny-mlp",
    target="ascend910b-atc",
    rules=[
        Rule(match="fc1", precision=Precision.W8A8, quant=QuantFields(activation_symmetric=False)),
        Rule(match="fc2", precision=Precision.FP16, reason="fallback"),
    ],
)


def test_run_amct_calls_the_documented_api(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setitem(sys.modules, "amct_pytorch", _standin(calls))
    model = TinyMLP().eval()
    data = model.example_inputs()
    run = run_amct(model, POLICY, data, tmp_path / "amct", forward_loop=forward_loop_for(model, batches=3),
                   batch_num=3, input_names=["x"], output_names=["y"])  # fmt: skip
    assert [c[0] for c in calls] == ["create_quant_config", "quantize_model", "save_model"]
    create = calls[0][1]
    assert create["config_defination"] == str(run.simplified_config)
    assert create["model"] is model and create["input_data"] == tuple(data)
    cfg = run.simplified_config.read_text()
    assert (
        'skip_layers : "fc2"' in cfg
        and "batch_num : 3" in cfg
        and "activation_offset : true" in cfg
    )
    _, args, kwargs = calls[1]
    assert args == (
        str(run.config_file),
        str(run.modified_onnx),
        str(run.record_file),
        model,
        tuple(data),
    )
    assert kwargs == {"input_names": ["x"], "output_names": ["y"], "dynamic_axes": None}
    assert calls[2][1] == (
        str(run.modified_onnx),
        str(run.record_file),
        str(tmp_path / "amct" / "model"),
    )
    assert run.batches == 3
    assert [p.name for p in run.outputs] == [
        "model_deploy_model.onnx",
        "model_fake_quant_model.onnx",
    ]


def test_run_amct_plain_arguments(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setitem(sys.modules, "amct_pytorch", _standin(calls))
    model = TinyMLP().eval()
    run_amct(model, POLICY, model.example_inputs(), tmp_path, forward_loop=forward_loop_for(model, 2),
             batch_num=2, use_simplified_config=False)  # fmt: skip
    create = calls[0][1]
    assert create["skip_layers"] == ["fc2"] and create["batch_num"] == 2
    assert create["activation_offset"] is True and create["config_defination"] is None


def test_run_amct_needs_batch_num_passes(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "amct_pytorch", _standin([]))
    model = TinyMLP().eval()
    with pytest.raises(
        CalibrationError,
        match="needs 4 calibration batches before save_model; the forward loop ran 1",
    ):
        run_amct(model, POLICY, model.example_inputs(), tmp_path, forward_loop=forward_loop_for(model, 1),
                 batch_num=4)  # fmt: skip


def test_without_amct_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "amct_pytorch", None)  # import now raises ImportError
    with pytest.raises(MissingDependencyError) as exc:
        run_amct(
            torch.nn.Linear(2, 2),
            POLICY,
            (torch.zeros(1, 2),),
            tmp_path,
            forward_loop=lambda m: None,
        )
    assert "ships with the CANN toolkit" in str(exc.value) and "\n" not in str(exc.value)
