"""CPU speed figure of an acceptance run: the candidate's heaviest root exported as ONNX QDQ and as
fp32, timed with ONNX Runtime (backend ``cpu-onnxruntime``)."""

from __future__ import annotations

from typing import Any

import torch

from opsnn_quant.evaluation.suite import Suite
from opsnn_quant.models.base import ModelAdapter


class _RootCall(torch.nn.Module):
    """A root module called with a recorded call's tensors as positional inputs (for export)."""

    def __init__(
        self, root: torch.nn.Module, kwargs: dict[str, Any], tensor_keys: list[str]
    ) -> None:
        super().__init__()
        self.root = root
        self.fixed = {k: v for k, v in kwargs.items() if k not in tensor_keys}
        self.tensor_keys = tensor_keys

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        from opsnn_quant.core.tensors import first_tensor

        n_args = len(tensors) - len(self.tensor_keys)
        kwargs = dict(self.fixed, **dict(zip(self.tensor_keys, tensors[n_args:], strict=True)))
        out = first_tensor(self.root(*tensors[:n_args], **kwargs))
        assert out is not None
        return out


def onnx_speed(
    candidate: ModelAdapter, records: list[dict[str, Any]], suite: Suite, notes: list[str]
) -> Any:
    """ORT timing of the candidate's heaviest root (QDQ, uint8 weights) against its fp32 export.

    Returns an :class:`OrtSpeedResult`, or None (with a note) when the export is not possible.
    """
    import tempfile

    from opsnn_quant.evaluation.ort_speed import ort_speed
    from opsnn_quant.formats.atc.onnx.export import export_onnx
    from opsnn_quant.formats.atc.onnx.runtime import to_uint8_weights
    from opsnn_quant.recording import record_roots

    modality = candidate.primary_modality()
    roots = candidate.roots_of(modality) if modality is not None else []
    root_name = roots[0] if roots else None
    if modality is None or root_name is None:
        what = "primary modality" if modality is None else f"{modality.value} root"
        notes.append(f"ONNX speed figure skipped: the model has no {what}")
        return None
    from opsnn_quant.quant.modules import is_quant_module

    root = dict(candidate.model.named_modules())[root_name]
    if not any(is_quant_module(m) for m in root.modules()):
        # Both exports would be the same fp32 graph: a ratio of two identical graphs is noise.
        notes.append(
            f"ONNX speed figure skipped: the candidate's {root_name or 'model'} has no int8 "
            "modules (ONNX Runtime's CPU kernels give no fp16 speed figure)"
        )
        return None
    sample = records[: max(1, min(2, len(records)))]
    recorded = record_roots(candidate, candidate.forward_loop(sample), max_calls=1)
    if root_name not in recorded.calls:
        notes.append("ONNX speed figure skipped: the root module was not called")
        return None
    args, kwargs = recorded.calls[root_name][0]
    tensor_keys = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    kwargs = {k: v for k, v in kwargs.items() if k != "return_dict"}
    module = _RootCall(root, kwargs, tensor_keys)
    inputs = tuple(a for a in args if isinstance(a, torch.Tensor)) + tuple(
        kwargs[k] for k in tensor_keys
    )
    # A 0-d tensor (the diffusion timestep) is broadcast inside the model; the exporter traces
    # that wrongly, so give it the batch dimension the model would expand it to.
    batch = inputs[0].shape[0] if inputs and inputs[0].dim() else 1
    inputs = tuple(t.reshape(1).expand(batch).contiguous() if t.dim() == 0 else t for t in inputs)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            qdq = export_onnx(module, inputs, f"{tmp}/qdq.onnx", opset=18)
            export_onnx(module, inputs, f"{tmp}/fp32.onnx", opset=18, fp32_baseline=True)
            to_uint8_weights(qdq.path, f"{tmp}/qdq_u8.onnx")
            import onnx

            names = [
                i.name for i in onnx.load(f"{tmp}/fp32.onnx", load_external_data=False).graph.input
            ]
            feeds = {n: t.detach().numpy() for n, t in zip(names, inputs, strict=True)}
            result = ort_speed(
                f"{tmp}/fp32.onnx", f"{tmp}/qdq_u8.onnx", feeds, runs=max(3, suite.latency.runs)
            )
    except Exception as exc:  # an exporter limitation must not sink the acceptance report
        notes.append(
            f"ONNX speed figure unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        )
        return None
    notes.append(
        f"cpu-onnxruntime: {root_name or 'model'} exported as QDQ (uint8 weights, ORT int8 kernels) "
        "and as fp32, timed with ONNX Runtime on this CPU"
    )
    return result
