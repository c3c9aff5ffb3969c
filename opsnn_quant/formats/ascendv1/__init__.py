"""Deployable outputs: AscendV1 weights for vLLM-Ascend / SGLang, MindIE-SD weights per
component, a consumer of each that runs them with the engine's arithmetic, and the ATC/AOE
command lines.

* :func:`export_ascendv1` writes ``export/ascendv1/`` from a quantized model;
  :mod:`opsnn_quant.formats.mindie_sd.export` writes ``export/mindie-sd/`` and
  :mod:`opsnn_quant.formats.mindie_sd.reader` loads it as MindIE-SD does.
* :func:`read_ascendv1` checks an AscendV1 directory (ours or msModelSlim's) against the tensor
  contract (:mod:`opsnn_quant.formats.ascendv1.contract`); :func:`apply_ascendv1` loads it into a float
  model, its quantized Linears as :class:`AscendV1Linear` (the engines' formulas).
"""

from opsnn_quant.formats.ascendv1.consumer import AscendV1Linear, apply_ascendv1
from opsnn_quant.formats.ascendv1.contract import AscendV1Error
from opsnn_quant.formats.ascendv1.export import AscendV1Export, export_ascendv1
from opsnn_quant.formats.ascendv1.reader import AscendV1Checkpoint, is_ascendv1_dir, read_ascendv1

__all__ = [
    "AscendV1Checkpoint",
    "AscendV1Error",
    "AscendV1Export",
    "AscendV1Linear",
    "apply_ascendv1",
    "export_ascendv1",
    "is_ascendv1_dir",
    "read_ascendv1",
]
