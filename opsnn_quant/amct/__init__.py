"""The AMCT hand-off: the policy run by CANN's AMCT instead of our engine (``--engine amct``).

:mod:`~opsnn_quant.amct.run` drives AMCT's PyTorch PTQ on one module from a policy;
:mod:`~opsnn_quant.amct.handoff` does it for every modality root of a model adapter.
"""
