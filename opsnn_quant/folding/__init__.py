"""SmoothQuant folding: where a factor can go when an engine has no place for it, and the
numerical check of a fold on a float twin of the quantized model."""
