"""The msModelSlim format of the exporter table (written from the policy)."""

from __future__ import annotations

from opsnn_quant.formats.base import Format


class MsModelSlimV1(Format):
    """msModelSlim's one-click ``modelslim_v1`` YAML."""

    name, kind, output, handler = (
        "msmodelslim-v1", "policy", "msmodelslim_v1.yaml",
        "opsnn_quant.formats.msmodelslim.export:msmodelslim_v1",
    )  # fmt: skip
