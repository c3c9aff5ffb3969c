"""ATC: ONNX graphs of a quantized model, the ATC/AOE commands that compile them, and ATC's
precision files (``--keep_dtype``, ``--customize_dtypes``, ``--modify_mixlist``)."""
