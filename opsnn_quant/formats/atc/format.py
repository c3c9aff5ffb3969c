"""The ATC formats: the graphs and commands of ``export/atc/`` (written from the quantized
model) and ATC's three precision files (written from the policy)."""

from __future__ import annotations

from opsnn_quant.formats.base import Format

_POLICY = "opsnn_quant.formats.atc.precision:atc_config"


class ATCGraphsFormat(Format):
    """Per root, the float and QDQ ONNX graphs and the ATC/AOE commands that compile them."""

    name = "atc"
    kind = "model"
    output = "atc"
    handler = "opsnn_quant.formats.model_writers:atc_graphs"


class ATCKeepDtype(Format):
    """``--keep_dtype``: the nodes kept in their float dtype."""

    name, kind, output, handler = "atc-keep-dtype", "policy", "atc_keep_dtype.cfg", _POLICY


class ATCCustomizeDtypes(Format):
    """``--customize_dtypes``: per-node precisions."""

    name, kind, output, handler = (
        "atc-customize-dtypes", "policy", "atc_customize_dtypes.cfg", _POLICY
    )  # fmt: skip


class ATCModifyMixlist(Format):
    """``--modify_mixlist``: OpTypes moved to the black list."""

    name, kind, output, handler = (
        "atc-modify-mixlist", "policy", "atc_modify_mixlist.json", _POLICY
    )  # fmt: skip
