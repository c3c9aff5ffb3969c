"""Attention in int8: an attention module's scaled-dot-product attention run as Atlas A2's fused
int8 attention (``npu_fused_infer_attention_score``, prefill branch; :mod:`opsnn_quant.ascend.
attention`), with static per-tensor scales calibrated on the forward loop.

**Which modules.** An attention module is found by what it does, not by its name: a module with
query and key projections (diffusers ``Attention``: ``to_q``/``to_k``/``heads``, every processor
of SD/SD3/FLUX/PixArt/Wan; transformers ``q_proj``/``k_proj``: Whisper, CLIP, T5-style encoders)
whose forward calls ``torch.nn.functional.scaled_dot_product_attention`` (SDPA). The call is
caught with a :class:`~torch.overrides.TorchFunctionMode` entered around the module's own forward,
so the module's projections, norms and rotary embeddings run as they are and only the SDPA call
changes. A module whose forward never reaches SDPA (an eager attention implementation) cannot be
quantized here and is refused once calibration shows it.

**The swap.** :func:`convert_attention` changes the module's class in place to a subclass of its
own (``Int8<Name>``, made once per float class and kept in a registry, as ModelOpt's dynamic
module registry does): every name, parameter and ``isinstance`` check of the float model stays as
it was; the module gains the buffer ``attn_scales`` ((groups, 3) float32: the query, key and
value scales of each group of denoising steps; (groups, 3, N_kv) with per-head scales) and its forward runs SDPA through
:func:`int8_sdpa`. :func:`revert_attention` undoes it.

**The arithmetic**, per call, of float ``q``/``k``/``v`` (B, N, S, D) with scales ``s_q``, ``s_k``,
``s_v`` (``amax / 127``): ``q8 = npu_quantize(q, 1 / s_q)`` (AscendQuantV2, multiply mode: round
half to even, saturate), the same for ``k`` (after subtracting its mean over the keys when the
spec asks for K-mean smoothing: softmax is invariant to a per-query constant, so the float result
is unchanged and the int8 range shrinks, SageAttention's observation) and ``v``; then the fused op
with ``deq_scale1 = s_q * s_k`` (after QK^T), ``quant_scale1 = 127`` (the kernel quantizes the
unnormalised ``P = exp(S - rowmax)`` in [0, 1]) and ``deq_scale2 = s_v / 127`` (after PV), each a
per-tensor float32 (FIA doc l.106-116); the float16 output is cast to the query's dtype.

**What the op refuses** (and so does :func:`check_site`): Q_S = 1 (decode: "qkv全int8：不支持",
FIA doc l.429), a head dim not aligned to 32 bytes (FIA doc l.78, l.400), dropout, a mask that is
not "attend or not" (an additive float mask with values other than 0 and -inf / the dtype's
lowest), a per-head mask (the op takes (B, 1, S1, S2) at most). A module any of whose calibration
calls the op refuses stays float, with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from opsnn_quant.backends import get_backend
from opsnn_quant.core.timesteps import current_step, group_of
from opsnn_quant.errors import CalibrationError, ConfigError
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision

log = logging.getLogger(__name__)

INT8_MAX = 127.0
P_SCALE = 127.0  # quant_scale1: the unnormalised softmax P in [0, 1] onto [0, 127]
ALIGN_D = 32  # int8 head dim: a multiple of 32 bytes (FIA doc l.78, l.400)
# an additive float mask's "not attended": -inf or at most the float16 lowest (PFA's masked
# score is -65504, x910_base.h l.1260; transformers fills finfo(dtype).min)
MASKED_AT_MOST = -65504.0

_SDPA = F.scaled_dot_product_attention


def is_attention_module(module: nn.Module) -> bool:
    """A module with query and key projections and a head count: diffusers ``Attention``
    (``to_q``/``to_k``/``heads``) or a transformers attention (``q_proj``/``k_proj``).
    Whether its forward reaches SDPA is seen when it runs: calibration refuses one that never
    does (:meth:`QuantizedAttention.freeze_attention`)."""
    if isinstance(module, QuantizedAttention):
        return True
    diffusers = all(hasattr(module, a) for a in ("to_q", "to_k", "heads"))
    transformers = all(hasattr(module, a) for a in ("q_proj", "k_proj"))
    return (diffusers or transformers) and isinstance(module, nn.Module)


def attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Named attention modules of ``model`` (:func:`is_attention_module`), in model order;
    an attention module inside another is not listed (its outer one runs it)."""
    out: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer in out)
        if name and is_attention_module(module) and not inside:
            out[name] = module
    return out


# ----------------------------------------------------------------------------- one SDPA call


@dataclass(frozen=True)
class SdpaCall:
    """The arguments of one SDPA call, read once: BNSD tensors, the op's boolean mask (True =
    not attended) and the softmax scale."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    masked: torch.Tensor | None
    scale: float
    problem: str | None = None  # why the int8 op cannot run this call (None: it can)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the scores and of their weighted sum of the values."""
        b, n, s1, d = self.q.shape
        return b * n * s1 * self.k.shape[-2] * (d + self.v.shape[-1])


def _bool_mask(mask: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """SDPA's ``attn_mask`` (bool: True = attend; float: added to the scores) as the op's
    (True = masked), or why it has none."""
    if mask.dtype == torch.bool:
        return ~mask, None
    if not mask.is_floating_point():
        return None, f"an attention mask of dtype {mask.dtype}"
    masked = mask <= MASKED_AT_MOST
    if not bool(((mask == 0) | masked).all()):
        return None, "an additive mask with values other than 0 and -inf (a bias, not a mask)"
    return masked, None


def _one_head_mask(
    masked: torch.Tensor, b: int, s1: int, s2: int
) -> tuple[torch.Tensor | None, str | None]:
    """The mask as (B, 1, S1, S2) (the op takes no per-head mask)."""
    m = masked
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.shape[1] != 1:
        if not bool((m == m[:, :1]).all()):
            return None, "a mask that differs between heads"
        m = m[:, :1]
    return m.expand(b, 1, s1, s2).contiguous(), None


def read_call(args: tuple, kwargs: dict[str, Any]) -> SdpaCall:
    """One SDPA call's arguments as the int8 op would take them."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    given = dict(zip(names, args, strict=False)) | kwargs
    q, k, v = given["query"], given["key"], given["value"]
    mask = given.get("attn_mask")
    dropout = float(given.get("dropout_p") or 0.0)
    causal = bool(given.get("is_causal") or False)
    scale = given.get("scale")
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    problem: str | None = None
    masked: torch.Tensor | None = None
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        problem = f"query of {q.dim()} dims (the op takes BNSD)"
    elif dropout:
        problem = f"dropout_p={dropout}"
    elif q.shape[-2] == 1:
        problem = "a single query (decode: the op refuses int8 query/key/value, FIA doc l.429)"
    elif q.shape[-1] % ALIGN_D or v.shape[-1] != q.shape[-1]:
        problem = f"head dim {q.shape[-1]} (int8 needs a multiple of {ALIGN_D}, and V's the same)"
    elif q.shape[1] % k.shape[1]:
        problem = f"{q.shape[1]} query heads over {k.shape[1]} key heads"
    else:
        b, _, s1, _ = q.shape
        s2 = k.shape[-2]
        if causal:
            masked = torch.ones(s1, s2, dtype=torch.bool, device=q.device).tril().logical_not()
        if mask is not None:
            if causal:
                problem = "both a mask and is_causal"
            else:
                masked, problem = _bool_mask(mask)
        if masked is not None and problem is None:
            masked, problem = _one_head_mask(masked, b, s1, s2)
    return SdpaCall(q, k, v, masked, scale, problem)


# ----------------------------------------------------------------------------- the arithmetic


def smooth_k(k: torch.Tensor) -> torch.Tensor:
    """``k`` less its mean over the keys, per (batch, head, channel): every score of a query
    moves by the same amount, which softmax removes."""
    return k - k.mean(dim=-2, keepdim=True)


def head_group(call: SdpaCall, g: int) -> SdpaCall:
    """The part of ``call`` of key/value head ``g``: its query heads, its key and value."""
    r = call.q.shape[1] // call.k.shape[1]
    part = slice(g * r, (g + 1) * r)
    kv = slice(g, g + 1)
    return SdpaCall(call.q[:, part], call.k[:, kv], call.v[:, kv], call.masked, call.scale)


@torch.no_grad()
def int8_sdpa(call: SdpaCall, scales: torch.Tensor, k_mean: bool) -> torch.Tensor:
    """SDPA of ``call`` through the fused int8 attention with ``scales`` float32 (3,) =
    (s_q, s_k, s_v) per tensor, or (3, N_kv) per key/value head: then one op call per key/value
    head with its query heads (the op takes one scale per call); see the module docstring. The
    result in the query's dtype."""
    if call.problem is not None:
        raise ConfigError(f"int8 attention cannot run {call.problem}")
    if scales.dim() == 2:
        heads = call.k.shape[1]
        if scales.shape[1] != heads:
            raise ConfigError(
                f"int8 attention: {scales.shape[1]} per-head scales for {heads} key/value heads"
            )
        parts = [int8_sdpa(head_group(call, g), scales[:, g], k_mean) for g in range(heads)]
        return torch.cat(parts, dim=1)
    backend = get_backend(call.q.device)
    s = scales.to(device=call.q.device, dtype=torch.float32)
    inv = torch.reciprocal(s)
    k = smooth_k(call.k) if k_mean else call.k
    q8, k8, v8 = (
        backend.quantize_static(t.to(torch.float32).contiguous(), inv[i].reshape(1), None)
        for i, t in enumerate((call.q, k, call.v))
    )
    out = backend.quant_attention(
        q8,
        k8,
        v8,
        deq_scale1=(s[0] * s[1]).reshape(1),
        quant_scale1=torch.tensor([P_SCALE], dtype=torch.float32, device=s.device),
        deq_scale2=(s[2] / P_SCALE).reshape(1),
        num_heads=call.q.shape[1],
        num_key_value_heads=call.k.shape[1],
        scale=call.scale,
        input_layout="BNSD",
        atten_mask=call.masked,
    )
    return out.to(call.q.dtype)


def call_ranges(call: SdpaCall, k_mean: bool, per_head: bool = False) -> torch.Tensor:
    """(3,) float32: the absolute maxima of this call's query, (smoothed) key and value; with
    ``per_head``, (3, N_kv): per key/value head, the query's over that head's query heads."""
    k = smooth_k(call.k) if k_mean else call.k
    if not per_head:
        return torch.stack([t.detach().abs().amax().to(torch.float32) for t in (call.q, k, call.v)])
    b, n, s1, d = call.q.shape
    g = call.k.shape[1]
    q = call.q.detach().abs().reshape(b, g, n // g, s1, d).amax(dim=(0, 2, 3, 4))
    kv = [t.detach().abs().amax(dim=(0, 2, 3)) for t in (k, call.v)]
    return torch.stack([q, *kv]).to(torch.float32)


def scales_of(amax: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 scales of absolute maxima (``amax / 127``; 1 where a tensor was all 0)."""
    s = amax.to(torch.float32) / INT8_MAX
    return torch.where(s > 0, s, torch.ones_like(s))


# ----------------------------------------------------------------------------- the module


class _Catch(TorchFunctionMode):
    """Routes the SDPA calls made inside one attention module's forward to ``handle``."""

    def __init__(self, handle: Callable[[tuple, dict[str, Any]], torch.Tensor]) -> None:
        super().__init__()
        self.handle = handle

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is _SDPA:
            return self.handle(args, kwargs)
        return func(*args, **kwargs)


@dataclass
class _Calibration:
    """What calibration saw: per group of steps, the running maxima; calls; the first problem."""

    amax: torch.Tensor
    calls: int = 0
    sdpa_calls: int = 0
    problem: str | None = None


class QuantizedAttention(nn.Module):
    """Mixed into an attention module's class by :func:`convert_attention`: its SDPA runs as
    the fused int8 attention once frozen (float, observed, while calibrating).

    Attributes:
        attn_spec: the module's :class:`QuantSpec` (precision ``a8``).
        attn_name: its dotted name (for messages).
        attn_scales: (groups, 3) float32 buffer: (s_q, s_k, s_v) per group of steps; (groups, 3,
            N_kv) with per-head scales (one per key/value head).
        attn_frozen: True once :meth:`freeze_attention` ran or a checkpoint was loaded.
    """

    attn_float_type: type[nn.Module]  # the float class this one was made from
    attn_spec: QuantSpec
    attn_name: str
    attn_scales: torch.Tensor
    attn_frozen: bool
    _attn_calib: _Calibration | None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The float module's forward, its SDPA calls caught (:class:`_Catch`)."""
        with _Catch(self._sdpa):
            out = super().forward(*args, **kwargs)
        if self._attn_calib is not None:
            self._attn_calib.calls += 1
        return out

    def _group(self) -> int:
        bounds = self.attn_spec.timestep_bounds
        step = current_step()
        return 0 if bounds is None or step is None else group_of(step, bounds)

    def _sdpa(self, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
        call = read_call(args, kwargs)
        calib = self._attn_calib
        if calib is not None:  # calibrating: observe, answer in float
            calib.sdpa_calls += 1
            if call.problem is not None:
                calib.problem = calib.problem or call.problem
            else:
                self._observe(calib, call)
            return _SDPA(*args, **kwargs)
        if not self.attn_frozen:
            raise CalibrationError(
                f"attention '{self.attn_name}' is neither calibrating nor frozen"
            )
        return int8_sdpa(call, self.attn_scales[self._group()], self.attn_spec.k_mean)

    def _observe(self, calib: _Calibration, call: SdpaCall) -> None:
        spec = self.attn_spec
        ranges = call_ranges(call, spec.k_mean, spec.per_head)
        if calib.amax.shape[1:] != ranges.shape:
            if calib.amax.shape[-1] != 0:  # per head: sized by the first call
                calib.problem = calib.problem or (
                    f"calls with {ranges.shape[-1]} and {calib.amax.shape[-1]} key/value heads"
                )
                return
            calib.amax = torch.zeros(calib.amax.shape[0], *ranges.shape).to(calib.amax)
        g = self._group()
        calib.amax[g] = torch.maximum(calib.amax[g], ranges)

    def seed_calibration(self, amax: torch.Tensor, calls: int) -> None:
        """What calibration would have seen, observed elsewhere on the same data (the probe's
        pass 1): the (groups, 3) maxima and the SDPA calls (then :meth:`freeze_attention`)."""
        calib = self._attn_calib
        assert calib is not None
        calib.amax = amax.to(calib.amax).clone()
        calib.sdpa_calls = calls

    @property
    def attention_calls(self) -> int:
        """The SDPA calls calibration saw."""
        return 0 if self._attn_calib is None else self._attn_calib.sdpa_calls

    def freeze_attention(self) -> None:
        """The calibrated maxima become the scales; calibration ends.

        Raises:
            CalibrationError: the forward loop never reached this module's SDPA, or one of its
                calls is one the int8 op refuses (the reason is named).
        """
        if self.attn_frozen:
            return
        calib = self._attn_calib
        assert calib is not None
        if calib.sdpa_calls == 0:
            raise CalibrationError(
                f"attention '{self.attn_name}' never called scaled_dot_product_attention "
                f"during calibration ({calib.calls} forward calls): it cannot run in int8"
            )
        if calib.problem is not None:
            raise CalibrationError(
                f"attention '{self.attn_name}': int8 attention cannot run {calib.problem}"
            )
        # a new buffer: per head, its shape is known only from the calls
        self.attn_scales = scales_of(calib.amax).to(self.attn_scales)
        self._attn_calib = None
        self.attn_frozen = True


_CLASSES: dict[type[nn.Module], type[nn.Module]] = {}


def quant_attention_class(float_type: type[nn.Module]) -> type[nn.Module]:
    """The quantized class of attention modules of ``float_type`` (made once, then reused)."""
    if issubclass(float_type, QuantizedAttention):
        return float_type
    cls = _CLASSES.get(float_type)
    if cls is None:
        cls = type(
            f"Int8{float_type.__name__}",
            (QuantizedAttention, float_type),
            {"attn_float_type": float_type},
        )
        cls.__module__ = __name__
        _CLASSES[float_type] = cls
    return cls


def _groups(spec: QuantSpec) -> int:
    return 1 if spec.timestep_bounds is None else len(spec.timestep_bounds)


def check_attention_spec(spec: QuantSpec, name: str) -> None:
    """Refuse a spec that is not an attention one (precision ``a8``)."""
    if spec.precision != Precision.A8:
        raise ConfigError(
            f"module '{name}' is an attention module: its int8 precision is a8, not "
            f"{spec.precision.value}"
        )


def convert_attention(module: nn.Module, spec: QuantSpec, name: str = "") -> QuantizedAttention:
    """Make attention ``module`` (:func:`is_attention_module`) a :class:`QuantizedAttention` in
    place, ready to calibrate.

    Raises:
        ConfigError: not an attention module, already converted, or ``spec`` not ``a8``.
    """
    if isinstance(module, QuantizedAttention):
        raise ConfigError(f"attention '{name}' is int8 already")
    if not is_attention_module(module):
        raise ConfigError(f"module '{name}' ({type(module).__name__}) is not an attention module")
    check_attention_spec(spec, name)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    module.__class__ = quant_attention_class(type(module))
    assert isinstance(module, QuantizedAttention)
    # (groups, 3), or (groups, 3, key/value heads) sized by the first call
    shape = (_groups(spec), 3, *((0,) if spec.per_head else ()))
    module.attn_spec = spec
    module.attn_name = name
    module.attn_frozen = False
    module.register_buffer("attn_scales", torch.ones(shape, dtype=torch.float32, device=device))
    module._attn_calib = _Calibration(amax=torch.zeros(shape, dtype=torch.float32, device=device))
    return module


def revert_attention(module: QuantizedAttention) -> nn.Module:
    """The float module again (its class and state as before :func:`convert_attention`)."""
    float_type = type(module).attn_float_type
    del module._buffers["attn_scales"]
    for attr in ("attn_spec", "attn_name", "attn_frozen", "_attn_calib"):
        module.__dict__.pop(attr, None)
    module.__class__ = float_type  # type: ignore[assignment]
    return module


def frozen_attention(
    module: nn.Module, spec: QuantSpec, name: str, scales: torch.Tensor
) -> QuantizedAttention:
    """Attention ``module`` converted and frozen with ``scales`` (a checkpoint's)."""
    q = convert_attention(module, spec, name)
    want = tuple(q.attn_scales.shape)
    got = tuple(scales.shape)
    heads_ok = spec.per_head and len(got) == 3 and got[-1] > 0
    if got[:2] != want[:2] or len(got) != len(want) or (spec.per_head and not heads_ok):
        shown = "(groups, 3, heads)" if spec.per_head else str(want)
        raise ConfigError(f"attention '{name}': scales of shape {got}, expected {shown}")
    q.attn_scales = scales.to(q.attn_scales)
    q._attn_calib = None
    q.attn_frozen = True
    return q


def quantized_attention(model: nn.Module) -> dict[str, QuantizedAttention]:
    """The int8 attention modules of ``model`` by dotted name, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantizedAttention)}
