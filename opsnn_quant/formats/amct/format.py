"""The AMCT formats of the exporter table (written from the policy)."""

from __future__ import annotations

from opsnn_quant.formats.base import Format

_CONFIG = "opsnn_quant.formats.amct.config"


class AMCTConfig(Format):
    """AMCT's simplified quantization config (``amct.cfg``)."""

    name, kind, output, handler = "amct-cfg", "policy", "amct.cfg", f"{_CONFIG}:amct_cfg"


class AMCTEager(Format):
    """AMCT's eager-mode JSON config."""

    name, kind, output, handler = (
        "amct-eager", "policy", "amct_eager.json", f"{_CONFIG}:amct_eager"
    )  # fmt: skip
