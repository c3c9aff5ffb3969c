"""The exporter table (opsnn_quant/formats/registry.py): one entry per format, looked up by
calibrate, policy export and export-weights alike."""

from __future__ import annotations

import json

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats import registry as table
from opsnn_quant.formats.base import Format, register_format
from opsnn_quant.formats.policy_files import EXPORT_FILES, FORMATS, export_policy
from opsnn_quant.formats.registry import exporter, exporters, register_exporter
from opsnn_quant.formats.result import ExportResult
from opsnn_quant.policy.schema import PrecisionPolicy


def test_the_table_holds_every_format_once_with_its_file():
    assert FORMATS == ("amct-cfg", "amct-eager", "atc-keep-dtype", "atc-customize-dtypes",
                       "atc-modify-mixlist", "msmodelslim-v1", "ascendv1", "mindie-sd", "atc")  # fmt: skip
    assert EXPORT_FILES["amct-cfg"] == "amct.cfg" and "ascendv1" not in EXPORT_FILES
    assert [e.name for e in exporters("model")] == ["ascendv1", "mindie-sd", "atc"]
    outputs = [e.output for e in exporters()]
    assert len(set(outputs)) == len(outputs)
    for e in exporters():
        assert callable(e.writer()), e.name  # every handler resolves


def test_unknown_and_model_formats_are_refused_by_policy_export():
    policy = PrecisionPolicy(model="m", target="cpu-reference")
    with pytest.raises(
        ConfigError, match="unknown export format 'onnx-magic'; choose one of amct-cfg"
    ):
        exporter("onnx-magic")
    with pytest.raises(ConfigError, match="written from the quantized model"):
        export_policy(policy, "ascendv1", {"fc": "Linear"})


def test_a_registered_format_is_exported_like_the_built_in_ones():
    saved = dict(table.TABLE)  # the table as it was, put back after the test
    try:
        register_exporter("modules-list", "policy", "modules.txt", f"{__name__}:_modules_list")
        policy = PrecisionPolicy(model="m", target="cpu-reference")
        result = export_policy(policy, "modules-list", {"a": "Linear", "b": "Conv2d"})
        assert result == ExportResult("modules-list", "a\nb\n", ())
        with pytest.raises(ConfigError, match="registered already"):
            register_exporter("modules-list", "policy", "x", f"{__name__}:_modules_list")
    finally:
        table.TABLE.clear()
        table.TABLE.update(saved)


def _modules_list(fmt, resolved, options) -> ExportResult:
    return ExportResult(fmt, "".join(f"{m}\n" for m in resolved.modules), ())


# ---- a model format added from outside the package: one class, one registration -------------


class ToyFormat(Format):
    """A toy engine's format: the int8 modules of the quantized model, what the command layer
    handed the writer (one recorded call per root), and the float weight of the first int8
    module as the format staged it before quantizing."""

    name = "toy-int8-list"
    kind = "model"
    output = "toy"
    handler = f"{__name__}:_write_toy"
    root_calls = "always"
    root_calls_for = "the toy's input shapes"
    float_model = True
    stager = f"{__name__}:_stage_toy"


def _stage_toy(adapter, policy, calls, export_dir, *, say):
    first = next(iter(policy.int8()))
    return first, adapter.model.get_submodule(first).weight.detach().clone()


def _write_toy(ctx, directory):
    from opsnn_quant.formats.model_writers import ExportOutcome
    from opsnn_quant.quant.modules import QuantModule

    int8 = [n for n, m in ctx.adapter.model.named_modules() if isinstance(m, QuantModule)]
    name, weight = ctx.staged
    import torch

    torch.save({name: weight}, directory / "float_weight.pt")
    (directory / "int8.txt").write_text("".join(f"{n}\n" for n in int8))
    calls = {root: len(c) for root, c in ctx.calls.items()}
    (directory / "calls.json").write_text(json.dumps(calls, sort_keys=True))
    return ExportOutcome([f"{len(int8)} modules listed"], int8)


def test_a_model_format_registered_from_outside_the_package_is_calibrated_into(tmp_path):
    import torch

    from opsnn_quant.cli import main
    from opsnn_quant.formats.checkpoint import read_description
    from opsnn_quant.models import load_adapter
    from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe

    save_tiny_sd(tmp_path / "pipe")
    recipe = tiny_sd_recipe(tmp_path, "toy", target="cpu-reference",
                            extra="exports: [amct-cfg, toy-int8-list]\n")  # fmt: skip
    saved = dict(table.TABLE)  # the table as it was, put back after the test
    try:
        register_format(ToyFormat)  # the one registration
        out = tmp_path / "out"
        assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 0
    finally:
        table.TABLE.clear()
        table.TABLE.update(saved)
    toy = out / "export" / "toy"
    # the writer listed the modules the checkpoint holds quantized
    quantized = sorted(read_description(out / "quant")["modules"])
    assert quantized and sorted((toy / "int8.txt").read_text().split()) == quantized
    # it was handed one recorded call per root, as it declared
    float_pipe = load_adapter("diffusers-sd", str(tmp_path / "pipe"))
    assert json.loads((toy / "calls.json").read_text()) == dict.fromkeys(float_pipe.roots(), 1)
    # and what it staged came from the float model, before quantizing
    [(name, weight)] = torch.load(toy / "float_weight.pt", weights_only=True).items()
    assert name in quantized
    assert torch.equal(weight, float_pipe.model.get_submodule(name).weight.detach())
    # the command layer owns its directory and its notes, as any format's
    assert (toy / ".opsnn-quant.json").is_file()
    assert (out / "export" / "toy-int8-list.notes.txt").read_text() == (
        f"{len(quantized)} modules listed\n"
    )
    assert (out / "export" / "amct.cfg").is_file()
    assert not (out / "export" / "ascendv1").exists()  # only the exports the recipe asks for
