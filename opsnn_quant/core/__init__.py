"""The shared leaves every part of opsnn-quant may use: numerics and tensor helpers, seeds and
determinism, fingerprints, memory, progress, streams, the user-config readers, safetensors
headers and the hub's weight-file rules. Nothing here imports the rest of the package beyond
``errors`` and ``types``."""
