"""Run an AscendV1 model as the serving engines do, through :mod:`opsnn_quant.ascend`.

Written from the engines' tensor contract and formulas, without importing them:

* W8A8 (vLLM-Ascend ``methods/w8a8_static.py`` ``AscendW8A8LinearMethod``; SGLang
  ``hardware_backend/npu/quantization/linear_method_npu.py``): after loading,
  ``aclnn_input_scale_reciprocal = 1 / input_scale.repeat(k)`` and
  ``aclnn_input_offset = input_offset.repeat(k)`` in the activation dtype, the weight transposed;
  per call ``npu_quantize(x, reciprocal, offset, qint8, -1, False)`` then
  ``npu_quant_matmul(x_q, weight^T, deq_scale, bias=quant_bias, output_dtype=params_dtype)``. The
  float ``bias`` is not used (it is folded into ``quant_bias``).
* W8A8_DYNAMIC (``methods/w8a8_dynamic.py``): ``x_q, s_t = npu_dynamic_quant(x)`` then
  ``npu_quant_matmul(x_q, weight^T, weight_scale (flattened, fp32), pertoken_scale=s_t,
  bias=bias, output_dtype=params_dtype)``. W8A8_MIX runs this path too, as vLLM-Ascend's
  ``w8a8_pdmix.py`` does on every instance that is not a disaggregated decode (KV-consumer) one.
* W8A16 / W4A16 (``methods/w8a16.py``; MindIE-LLM ``utils/quantize/w4a16.py``):
  ``npu_weight_quant_batchmatmul(x, weight^T, antiquant_scale, antiquant_offset, bias,
  antiquant_group_size)``. The stored ``weight_offset`` is the weight's zero point: MindIE-LLM
  passes ``-weight_offset`` (``(w + offset) * scale`` is the op's formula); vLLM-Ascend's W8A16
  passes it unnegated. We follow MindIE-LLM (the two agree for symmetric weights, all we write).

Dtypes: the engine runs every tensor in one ``params_dtype`` (fp16 when ``deq_scale`` is int64,
bf16 when it is float32). Each quantized Linear here computes in it as vLLM-Ascend's methods do
(:mod:`opsnn_quant.ascend.engines`: activations cast to it, ``input_scale`` held in it and its
reciprocal computed in it, weight scales and bias in it) and casts its output back to the host
model's dtype (the CPU reference runs the float layers in float32).
"""

from __future__ import annotations

import torch
from torch import nn

from opsnn_quant import ascend
from opsnn_quant.ascend import engines
from opsnn_quant.formats.ascendv1.contract import AscendV1Error
from opsnn_quant.formats.ascendv1.reader import AscendV1Checkpoint, QuantLinearEntry


def unpack_w4a16(packed: torch.Tensor, per_group: bool) -> torch.Tensor:
    """int4 values [n, k] (int8) from msModelSlim's packed W4A16 weight.

    ``_w4a16_pack_int4`` (msModelSlim ``complex_quantifier.py``) packs two values per byte, the
    first in the low nibble: along k for per-channel weights (stored [n, k / 2]), along n for
    per-group ones (stored [n / 2, k]).
    """
    p = packed.to(torch.int16)
    low = ((p & 0x0F) ^ 0x08) - 0x08  # sign-extend the nibbles
    high = (((p >> 4) & 0x0F) ^ 0x08) - 0x08
    if per_group:  # [n/2, k]: row i holds outputs 2i (low) and 2i+1 (high)
        return torch.stack([low, high], dim=1).reshape(-1, packed.shape[1]).to(torch.int8)
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1).to(torch.int8)


class AscendV1Linear(nn.Module):
    """One quantized Linear of an AscendV1 checkpoint, run with the engine's arithmetic.

    Attributes:
        qtype: the AscendV1 type.
        in_features, out_features: k and n.
        params_dtype: the engine's model dtype (output of the quantized matmul).
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    input_scale: torch.Tensor
    input_offset: torch.Tensor
    quant_bias: torch.Tensor
    deq_scale: torch.Tensor
    weight_scale: torch.Tensor
    antiquant_scale: torch.Tensor
    antiquant_offset: torch.Tensor

    def __init__(
        self,
        name: str,
        entry: QuantLinearEntry,
        tensors: dict[str, torch.Tensor],
        params_dtype: torch.dtype,
        group_size: int,
    ) -> None:
        super().__init__()
        self.qname, self.qtype = name, entry.qtype
        self.in_features, self.out_features = entry.k, entry.n
        self.params_dtype = params_dtype
        self.group_size = group_size if entry.per_group else 0
        t = tensors
        if entry.qtype == "W4A16":
            values = unpack_w4a16(t["weight"], entry.per_group).t().contiguous()  # (k, n)
            # torch_npu takes int4 weights as int32 holding eight values (npu_convert_weight_
            # to_int4pack of the (k, n) weight), as MindIE-SD's WeightQuantLinear does; that
            # needs n % 8 == 0. The int4 values in int8 give the op the same arithmetic.
            weight = (
                ascend.npu_convert_weight_to_int4pack(values.to(torch.int32))
                if entry.n % 8 == 0
                else values
            )
        else:
            weight = t["weight"].t().contiguous()  # [k, n], as process_weights_after_loading
        self.register_buffer("weight", weight)
        self.register_buffer("bias", t.get("bias"))
        if entry.qtype == "W8A8":
            self.register_buffer("input_scale", t["input_scale"].reshape(1).to(torch.float32))
            self.register_buffer("input_offset", t["input_offset"].reshape(1).to(torch.float32))
            self.register_buffer("quant_bias", t["quant_bias"])
            self.register_buffer("deq_scale", t["deq_scale"])
            if params_dtype == torch.bfloat16 and t["deq_scale"].dtype == torch.int64:
                raise AscendV1Error(f"{name}.deq_scale: int64 (fp16 packing) in a bf16 model")
        elif entry.qtype in ("W8A8_DYNAMIC", "W8A8_MIX"):
            self.register_buffer("weight_scale", t["weight_scale"].reshape(-1).to(torch.float32))
        else:
            scale = t["weight_scale"].to(torch.float32)
            offset = t.get("weight_offset")
            offset = torch.zeros_like(scale) if offset is None else offset.to(torch.float32)
            # per channel: (n,); per group: (k / G, n), the op's layouts
            if entry.per_group:
                scale, offset = scale.t().contiguous(), offset.t().contiguous()
            self.register_buffer(
                "antiquant_scale", scale.reshape(-1) if not entry.per_group else scale
            )
            self.register_buffer(
                "antiquant_offset", -(offset.reshape(-1) if not entry.per_group else offset)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        p = self.params_dtype
        if self.qtype == "W8A8":
            # vLLM's params: input_scale in the params dtype, input_offset int8 (copy_ casts)
            y = engines.vllm_ascend_static(
                x2d, self.weight, self.deq_scale, self.quant_bias, self.input_scale.to(p),
                self.input_offset.to(torch.int8), p,
            )  # fmt: skip
        elif self.qtype in ("W8A8_DYNAMIC", "W8A8_MIX"):
            bias = None if self.bias is None else self.bias.to(p)
            y = engines.vllm_ascend_dynamic(x2d, self.weight, self.weight_scale.to(p), bias, p)
        else:
            y = ascend.npu_weight_quant_batchmatmul(
                x2d.to(p), self.weight, self.antiquant_scale.to(p), self.antiquant_offset.to(p),
                bias=None if self.bias is None else self.bias.to(p),
                antiquant_group_size=self.group_size,
            )  # fmt: skip
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.qtype}"


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


@torch.no_grad()
def apply_ascendv1(
    model: nn.Module, ckpt: AscendV1Checkpoint, *, params_dtype: torch.dtype | None = None
) -> nn.Module:
    """Load an AscendV1 checkpoint into ``model`` (in place): quantized Linears become
    :class:`AscendV1Linear`, every other tensor is copied into the model (cast to its dtype).

    Every tensor of ``model`` must come from the checkpoint (tied tensors count once) and every
    checkpoint tensor must name a tensor of ``model``.

    Args:
        model: the float model the checkpoint was made from (same architecture and names).
        ckpt: from :func:`~opsnn_quant.formats.ascendv1.reader.read_ascendv1`.
        params_dtype: the engine's model dtype (default: :meth:`AscendV1Checkpoint.params_dtype`).

    Raises:
        AscendV1Error: a quantized name that is not an ``nn.Linear`` of that size in the model,
            a model tensor the checkpoint lacks, a checkpoint tensor the model lacks, or a shape
            that differs.
    """
    dtype = params_dtype or ckpt.params_dtype()
    modules = dict(model.named_modules())
    strip = name_prefix(model, ckpt)
    for full, entry in ckpt.linears.items():
        name = full[len(strip) :]
        target = modules.get(name)
        if not isinstance(target, nn.Linear):
            kind = "nothing" if target is None else f"a {type(target).__name__}"
            raise AscendV1Error(
                f"{name}.weight: is {entry.qtype}, but {name} is {kind} in the model"
            )
        if (target.out_features, target.in_features) != (entry.n, entry.k):
            raise AscendV1Error(
                f"{name}.weight: {entry.n}x{entry.k} in the checkpoint, "
                f"{target.out_features}x{target.in_features} in the model"
            )
        if target.bias is not None and "bias" not in entry.suffixes and entry.qtype != "W8A8":
            # W8A8 folds the bias into quant_bias; the other types add the float bias
            raise AscendV1Error(f"{full}.bias: the model's Linear has a bias the checkpoint lacks")
        device = target.weight.device
        tensors = {s: ckpt.load(f"{full}.{s}").to(device) for s in entry.suffixes}
        bias = tensors.get("bias")
        if bias is not None:
            tensors["bias"] = bias.to(target.weight.dtype)
        _set_module(model, name, AscendV1Linear(full, entry, tensors, dtype, ckpt.group_size))
    quantized = tuple(f"{n[len(strip) :]}." for n in ckpt.linears)
    state = {
        k: v for k, v in model.state_dict(keep_vars=True).items() if not k.startswith(quantized)
    }
    _copy_floats(state, ckpt, strip)
    return model


def name_prefix(model: nn.Module, ckpt: AscendV1Checkpoint) -> str:
    """The prefix of the checkpoint's names that the model's names lack ("" when they match).

    Checkpoints carry the float model's on-disk names; a library may load them under other
    module names (transformers 5 loads ``text_model.encoder...`` of a CLIP text encoder as
    ``encoder...``). Only a prefix common to every checkpoint name is dropped.

    Raises:
        AscendV1Error: no such prefix makes the names fit the model.
    """
    modules = {n for n, _ in model.named_modules()}
    state = set(model.state_dict())
    names = [*ckpt.linears, *ckpt.floats]
    parts = names[0].split(".") if names else []
    for i in range(len(parts)):
        p = ".".join(parts[:i]) + ("." if i else "")
        if (
            all(n.startswith(p) for n in names)
            and all(n[len(p) :] in modules for n in ckpt.linears)
            and all(n[len(p) :] in state for n in ckpt.floats)
        ):
            return p
    missing = next((n for n in ckpt.linears if n not in modules), None)
    if missing is not None:
        raise AscendV1Error(f"{missing}.weight: names no Linear of the model")
    bad = next(n for n in ckpt.floats if n not in state)
    raise AscendV1Error(f"{bad}: in the checkpoint but not a tensor of the model")


def _copy_floats(state: dict[str, torch.Tensor], ckpt: AscendV1Checkpoint, strip: str) -> None:
    """Copy the checkpoint's FLOAT tensors into the model's, strictly (tied ones once)."""
    floats = {n[len(strip) :]: n for n in ckpt.floats}
    storage = {state[name].data_ptr() for name in floats}
    for name, t in state.items():
        if name in floats:
            src = ckpt.load(floats[name])
            if tuple(src.shape) != tuple(t.shape):
                raise AscendV1Error(
                    f"{name}: shape {list(src.shape)} in the checkpoint, {list(t.shape)} in the model"
                )
            t.data.copy_(src.to(t.dtype))
        elif t.data_ptr() not in storage:  # a tensor tied to a loaded one is loaded with it
            raise AscendV1Error(f"{name}: a tensor of the model that the checkpoint lacks")
