"""Evaluation building blocks: quality metrics, latency/memory, acceptance suites, reports.

Modules (each imports its heavy dependency — torchmetrics, transformers, scikit-image, jiwer,
onnxruntime, matplotlib — only inside the functions that need it):

- :mod:`.fid`: Fréchet distances; TF-Inception FID offline, CLIP-space FD (labelled as such).
- :mod:`.clip_score`: CLIP score via torchmetrics on a local CLIP.
- :mod:`.image_similarity`: per-pair PSNR/SSIM of candidate vs baseline images.
- :mod:`.wer`: WER/CER after Whisper normalisation, agreement WER, worst-first diffs.
- :mod:`.latency`, :mod:`.profile`, :mod:`.ort_speed`: timing, memory, stages, top modules,
  stability, ONNX Runtime fp32 vs QDQ.
- :mod:`.gate`: which backend's latency is judged for a policy target (``npu`` for Ascend,
  ``cpu-onnxruntime``/``cpu`` for ``cpu-reference``; NOT JUDGED elsewhere) and what
  ``--latency none|target|all`` times; :mod:`.timing` runs that plan.
- :mod:`.quality`: PSNR/SSIM, CLIP score, FID/FD and WER figures of candidate vs baseline.
- :mod:`.suite`: acceptance-suite schema (``evaluate/*.yaml``).
- :mod:`.report`, :mod:`.render`, :mod:`.plots`: ``AcceptanceReport`` and its JSON/MD/HTML.
- :mod:`.runner`: criteria, verdict and report assembly (``evaluate`` is built from it).
"""
