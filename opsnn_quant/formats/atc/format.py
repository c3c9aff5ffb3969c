"""The ATC formats: the graphs and commands of ``export/atc/`` (written from the quantized
model) and ATC's three precision files (written from the policy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opsnn_quant.formats.base import Format

if TYPE_CHECKING:
    from opsnn_quant.policy.targets import Target

_POLICY = "opsnn_quant.formats.atc.precision"


class ATCGraphsFormat(Format):
    """Per root, the float and QDQ ONNX graphs and the ATC/AOE commands that compile them."""

    name = "atc"
    kind = "model"
    output = "atc"
    handler = "opsnn_quant.formats.atc.model_export:write"
    root_calls = "always"  # one call per root gives each graph's input shapes
    root_calls_for = "the ATC graphs"
    float_model = True  # the float graphs beside the QDQ ones, exported before quantizing
    stager = "opsnn_quant.formats.atc.model_export:stage_float_graphs"
    # AMCT's PTQ quantizes Conv/Gemm/MatMul of weights it calibrates; the graphs here carry
    # the QDQ of our Linear/Conv2d only
    attention = "its graphs quantize Linear/Conv2d only (QDQ of their weights and inputs)"

    def left_out(self, target: Target) -> str | None:
        if target.route == "atc":
            return None
        # ONNX exports cost ~25 s per demo UNet graph: only where ATC is the deployment route
        return (
            f"{target.name} does not deploy through ATC; no graphs written "
            "(opsnn-quant export-weights OUT -f atc --data SRC writes them)"
        )


class ATCKeepDtype(Format):
    """``--keep_dtype``: the nodes kept in their float dtype."""

    name, kind, output = "atc-keep-dtype", "policy", "atc_keep_dtype.cfg"
    handler = f"{_POLICY}:keep_dtype"


class ATCCustomizeDtypes(Format):
    """``--customize_dtypes``: per-node precisions."""

    name, kind, output = "atc-customize-dtypes", "policy", "atc_customize_dtypes.cfg"
    handler = f"{_POLICY}:customize_dtypes"


class ATCModifyMixlist(Format):
    """``--modify_mixlist``: OpTypes moved to the black list."""

    name, kind, output = "atc-modify-mixlist", "policy", "atc_modify_mixlist.json"
    handler = f"{_POLICY}:modify_mixlist"
