"""ONNX graphs of quantized models for ATC and ONNX Runtime: tracing with per-module markers
(:mod:`.markers`), the QDQ rewrite (:mod:`.export`), one trace per root for ATC (:mod:`.fast`),
the export's node map (:mod:`.info`) and ONNX Runtime sessions (:mod:`.runtime`)."""
