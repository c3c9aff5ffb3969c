"""MindIE-SD: each component's quantized Linears as ``mindiesd.quantize`` loads them (write, read)."""
