"""AscendV1: msModelSlim's weight format, loaded by vLLM-Ascend and SGLang.

* :func:`~.export.export_ascendv1` writes a quantized model into a directory in this layout
  (:mod:`.export`, one component's tensors in :mod:`.writer`);
* :func:`~.reader.read_ascendv1` checks an AscendV1 directory (ours or msModelSlim's) against
  the tensor contract (:mod:`.contract`, its refusal :class:`~.contract.AscendV1Error`);
  :func:`~.consumer.apply_ascendv1` loads it into a float model, its quantized Linears as
  :class:`~.consumer.AscendV1Linear` (the engines' formulas, :mod:`.consumer`).
"""
