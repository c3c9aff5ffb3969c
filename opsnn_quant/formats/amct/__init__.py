"""AMCT's configs of a policy (:mod:`.config`), their table entries (:mod:`.format`). The
hand-off that runs AMCT itself is :mod:`opsnn_quant.amct`."""
