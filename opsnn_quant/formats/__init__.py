"""The bytes on disk: one folder per format, behind one registry (:mod:`.registry`).

* :mod:`.ascendv1`: msModelSlim's AscendV1 weights (vLLM-Ascend, SGLang): write, read, run.
* :mod:`.mindie_sd`: MindIE-SD's quantized components (``mindiesd.quantize``): write, read.
* :mod:`.atc`: ONNX graphs (float and QDQ), ATC/AOE commands and ATC's precision files.
* :mod:`.amct` (in :mod:`.policy_files`), :mod:`.msmodelslim`: the policy as those tools read it.
* :mod:`.checkpoint`: our own ``quant/`` directory.

A format writes into a directory or file it is given; the command layer owns the output
directory around it.
"""
