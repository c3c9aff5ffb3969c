"""The exporter table (opsnn_quant/formats/registry.py): one entry per format, looked up by
calibrate, policy export and export-weights alike."""

from __future__ import annotations

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats import registry as table
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
