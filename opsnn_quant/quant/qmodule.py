"""The quantized-module base: :class:`QuantModule` (calibrate, freeze, the Ascend quant
arithmetic of its (M, K) rows) and the registry of quantized classes by float module type.

The concrete classes (``QuantLinear``, ``QuantConv2d``) are in :mod:`opsnn_quant.quant.modules`,
which re-exports everything here; see that module for how to add another type.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, Self, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.ascend import engines
from opsnn_quant.ascend.matmul import WEIGHT_CHUNK, native_int8_matmul
from opsnn_quant.backends import get_backend
from opsnn_quant.backends.base import QuantBackend
from opsnn_quant.errors import CalibrationError
from opsnn_quant.quant.engine import TORCH_DTYPES
from opsnn_quant.quant.functional import fold_bias_int32
from opsnn_quant.quant.gptq import Moments, corrected_bias, gptq_round
from opsnn_quant.quant.quantizers import InputQuantizer, WeightQuantizer
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision

log = logging.getLogger(__name__)

# Rows of one reference-backend chunk: about this many elements of the wider operand (16 MB fp32).
ROW_CHUNK_ELEMENTS = 1 << 22
# A call of fewer rows keeps an fp32 copy of a small int8 weight (see _weight_float_t).
CACHE_MAX_ROWS = 64

# a spec's output dtype name -> torch dtype
OUTPUT_DTYPES = TORCH_DTYPES

FloatT = TypeVar("FloatT", bound=nn.Module)


class QuantModule(nn.Module, ABC, Generic[FloatT]):
    """Base of every quantized module: a (N, K) weight applied to (M, K) rows with the spec's
    scheme (static W8A8, dynamic per-token W8A8 or W8A16), calibrated, then frozen.

    Attributes:
        float_type: the float module class this one replaces (set by
            :func:`register_quant_module`).
        spec: the QuantSpec.
        qname: the module's dotted name in the model (for messages).
        in_k, out_n: K (inputs per output) and N (outputs) of the matmul.
        frozen: True once :meth:`freeze` ran (or a checkpoint was loaded into it).
        float_had_bias: the float module it replaces had a bias.
    """

    float_type: ClassVar[type[nn.Module]]
    weight: torch.Tensor
    bias: torch.Tensor | None
    deq_scale: torch.Tensor
    deq_scale_packed: torch.Tensor
    quant_bias: torch.Tensor
    input_quantizer: InputQuantizer
    weight_quantizer: WeightQuantizer

    @classmethod
    @abstractmethod
    def from_float(cls, module: FloatT, spec: QuantSpec, name: str = "") -> Self:
        """A quantized counterpart of float ``module`` to calibrate (the module is left untouched).

        Args:
            module: the float module, of :attr:`float_type`.
            spec: how to quantize it.
            name: its dotted name in the model (for messages and checkpoints).
        """

    def init_quant(self, spec: QuantSpec, n: int, k: int, name: str) -> None:
        """Set up the quantizers for N outputs of K inputs each; call it from ``__init__``
        once the float ``weight`` and ``bias`` are set."""
        self.spec = spec
        self.qname = name
        self.in_k, self.out_n = k, n
        self.frozen = False
        # whether the float module had a bias (static modules fold it into quant_bias; the
        # engines' loaders still want the float bias tensor where the float layer has one)
        self.float_had_bias = getattr(self, "bias", None) is not None
        self.input_quantizer = InputQuantizer(spec, k, name)
        self.weight_quantizer = WeightQuantizer(n)
        self._w_cache: torch.Tensor | None = None
        # The reference backend keeps an fp32 copy of the int8 weight for speed; probes that hold
        # many candidate modules turn it off to bound memory.
        self.cache_weight_float = True

    def _weight2d(self) -> torch.Tensor:
        return self.weight.reshape(self.out_n, -1)

    def decide_smoothing(self) -> None:
        """SmoothQuant decision between the statistics pass and the range pass."""
        self.input_quantizer.decide_smoothing(self._weight2d())

    @property
    def calibration_calls(self) -> int:
        """How many calibration batches reached this module."""
        return self.input_quantizer.calls

    @torch.no_grad()
    def freeze(self, quantized: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Replace the float weight/bias with the int8 weight, biases and (packed) deq scales.

        Args:
            quantized: the integer weight (in :meth:`int8_weight_shape`) and weight scales this
                module's own quantization would give, when a sibling with the same (smoothed)
                weight and precision made them already: they are shared, not recomputed.
        """
        if self.frozen:
            return
        iq = self.input_quantizer
        if iq.calls == 0 and (
            self.spec.static_activations or self.spec.smoothquant or self.spec.needs_moments
        ):
            raise CalibrationError(
                f"module '{self.qname}' was never called by the forward_loop; it cannot be calibrated"
            )
        bias = None if self.bias is None else self.bias.detach().to(torch.float32)
        iq.engine_smoothing()  # a serving engine's mul_scale, before the weight is smoothed
        moments, smooth = iq.moments, iq.smooth
        w = self._weight2d().detach().to(torch.float32)
        if smooth is not None:
            w = w * smooth.to(w.device).unsqueeze(0)
        x_params = iq.freeze()  # (scale, offset) per group of steps (one group without them)
        w_q = self._integer_weight(w, moments, smooth, quantized)
        if self.spec.bias_correction:
            assert moments is not None
            scale = self.weight_quantizer.scale
            bias = corrected_bias(bias, w, w_q, scale, moments.mean(smooth))
        del self.weight
        self.register_buffer("weight", w_q.reshape(self.int8_weight_shape()))
        del self.bias
        if self.spec.static_activations or bias is None:
            self.bias = None
        else:
            self.register_buffer("bias", bias)
        if self.spec.static_activations:
            w_scale = self.weight_quantizer.scale.to(torch.float64)
            deqs = [(x_scale * w_scale).to(torch.float32) for x_scale, _ in x_params]
            # a float16 model's packing: npu_trans_quant_param's for ours, an engine's its own
            packed = [self.spec.engine_def.pack_deq_scale(d) for d in deqs]
            biases = [
                fold_bias_int32(bias, d, off, w_q)
                for d, (_, off) in zip(deqs, x_params, strict=True)
            ]
            if iq.bounds:  # one row per group of steps: what the sampling loop's step selects
                self.register_buffer("deq_scale", torch.stack(deqs))
                self.register_buffer("deq_scale_packed", torch.stack(packed))
                self.register_buffer("quant_bias", torch.stack(biases))
            else:
                self.register_buffer("deq_scale", deqs[0])
                self.register_buffer("deq_scale_packed", packed[0])
                self.register_buffer("quant_bias", biases[0])
        self.frozen = True

    def _integer_weight(
        self,
        w: torch.Tensor,
        moments: Moments | None,
        smooth: torch.Tensor | None,
        quantized: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """The integer weight of the (smoothed) float weight ``w`` (N, K), its scales stored
        in the weight quantizer: a sibling's (``quantized``), int4 per group, or int8 per
        channel rounded to nearest or by GPTQ on the inputs' Hessian."""
        if quantized is not None:
            w_q, self.weight_quantizer.scale = quantized
            return w_q.reshape(self.out_n, -1)
        if self.spec.precision == Precision.W4A16:
            assert self.spec.group_size is not None
            return self.weight_quantizer.quantize_int4(w, self.spec.group_size)
        w_q = self.weight_quantizer.quantize(w, self._engine_weight_scale_dtype())
        if self.spec.weight_rounding == "gptq":
            assert moments is not None
            w_q = gptq_round(w, self.weight_quantizer.scale, moments.hessian(smooth))
        return w_q.to(w.device)

    def _engine_weight_scale_dtype(self) -> torch.dtype | None:
        """The dtype a serving engine keeps this module's weight scales in (its per-token and
        weight-only Linears; None: float32, as this package's arithmetic and static W8A8)."""
        if self.spec.engine_def.weight_scales == "float32" or self.spec.static_activations:
            return None
        return OUTPUT_DTYPES[self.spec.output_dtype]

    def int8_weight_shape(self) -> tuple[int, ...]:
        """Shape of the frozen integer weight: (N, K) int8 unless a subclass keeps its layout;
        (N, K // 8) int32 for w4a16 (eight int4 values per word along K)."""
        if self.spec.precision == Precision.W4A16:
            return (self.out_n, self.in_k // 8)
        return (self.out_n, self.in_k)

    @property
    def weight_cache_bytes(self) -> int:
        """Bytes of the fp32 weight copy this module keeps for the reference backend (0: none)."""
        c = self._w_cache
        return 0 if c is None else c.numel() * c.element_size()

    def reference_weight(self, x2d: torch.Tensor, backend: QuantBackend) -> torch.Tensor | None:
        """The fp32 copy of the int8 weight (transposed) a reference-backend call on the (M, K)
        rows ``x2d`` takes (see :meth:`_weight_float_t`); None on other backends."""
        return self._weight_float_t(x2d.shape[0]) if backend.name == "reference" else None

    def _weight_float_t(self, rows: int) -> torch.Tensor | None:
        """fp32 copy of the int8 weight, transposed, kept for calls of few rows (a decoder's
        per-token steps, where converting it each call costs more than the matmul); None: the
        matmul converts it per call (in column blocks when large), or runs the int8 weight
        itself (a CPU's native int8 GEMM). Reference-backend speed-up, not saved; the products
        are exact either way.

        Kept for every call, the copies made a quantized model grow a float copy of its
        quantized weights as it ran (the AscendV1 export's fold trace, the held-out measure).
        """
        w = self.weight.reshape(self.out_n, self.in_k)
        if native_int8_matmul(w.device, rows):
            return None  # the int8 GEMM takes the int8 weight itself
        if self._w_cache is not None and self._w_cache.device == w.device:
            return self._w_cache
        if self.cache_weight_float and rows < CACHE_MAX_ROWS and w.numel() <= WEIGHT_CHUNK:
            self._w_cache = w.t().to(torch.float32)
            return self._w_cache
        return None

    def _float_rows(self, x2d: torch.Tensor) -> torch.Tensor:
        return F.linear(x2d, self._weight2d(), self.bias)

    def matmul_rows(self, x2d: torch.Tensor) -> torch.Tensor:
        """(M, K) -> (M, N): float during calibration, Ascend quant arithmetic once frozen."""
        if not self.frozen:
            self.input_quantizer.collect(x2d)
            return self._float_rows(x2d)
        backend = get_backend(x2d.device)
        step = max(256, ROW_CHUNK_ELEMENTS // max(self.out_n, self.in_k))
        if backend.name != "reference" or x2d.shape[0] <= step:
            return self._quant_rows(x2d, backend)
        # The reference keeps a few fp32/int32 copies of its operands and output at once; in row
        # chunks (rows are independent: per-tensor or per-token quantization, exact integer
        # products) the result is bit-identical and the transient memory bounded.
        first = self._quant_rows(x2d[:step], backend)
        out = first.new_empty((x2d.shape[0], first.shape[1]))
        out[:step] = first
        for i in range(step, x2d.shape[0], step):
            out[i : i + step] = self._quant_rows(x2d[i : i + step], backend)
        return out

    def _quant_rows(self, x2d: torch.Tensor, backend: QuantBackend) -> torch.Tensor:
        """(M, K) -> (M, N) in the rows' dtype: the spec's engine's Linear on the frozen
        parameters (:attr:`QuantSpec.engine_def`)."""
        return self.spec.engine_def.linear_rows(self, x2d, backend)

    def describe(self) -> dict[str, Any]:
        """Per-module entry of ``description.json``."""
        iq = self.input_quantizer
        d: dict[str, Any] = {
            "type": type(self).__name__,
            "precision": self.spec.precision.value,
            "spec": self.spec.to_dict(),
            # the float weight's shape (what a model to load into must have)
            "weight_shape": (
                [self.out_n, self.in_k]
                if self.spec.precision == Precision.W4A16
                else list(self.weight.shape)
            ),
            "in_features": self.in_k,
            "out_features": self.out_n,
            "smoothquant_alpha": getattr(iq, "chosen_alpha", None),
        }
        if self.spec.static_activations and self.frozen:
            if iq.bounds:  # the scale table: one entry per group of steps
                d["input_scale"] = [float(v) for v in iq.scale]
                d["input_offset"] = [float(v) for v in iq.offset]
                d["timestep_bounds"] = list(iq.bounds)
            else:
                d["input_scale"] = float(iq.scale)
                d["input_offset"] = float(iq.offset)
        return d


# ---- each engine's Linear on a frozen module's (M, K) rows (``Engine.rows``) ----------------


def opsnn_rows(module: QuantModule[Any], x2d: torch.Tensor, backend: QuantBackend) -> torch.Tensor:
    """(M, K) -> (M, N): this package's Ascend quant arithmetic (the backend's torch_npu ops or
    their CPU reference) on ``module``'s frozen parameters, in the rows' dtype."""
    spec = module.spec
    if spec.precision == Precision.W4A16:
        # (K // 8, N): the transposed view of the (N, K // 8) words npu_weight_quant_
        # batchmatmul takes (as npu_convert_weight_to_int4pack lays them out).
        packed_t = module.weight.reshape(module.out_n, module.in_k // 8).t()
        return backend.weight_quant_matmul(
            x2d,
            packed_t,
            module.weight_quantizer.scale,
            module.bias,
            group_size=spec.group_size or 0,
        )
    w_q_t = module.weight.reshape(module.out_n, module.in_k).t()
    if spec.precision == Precision.W8A16:
        return backend.weight_quant_matmul(x2d, w_q_t, module.weight_quantizer.scale, module.bias)
    wf = module.reference_weight(x2d, backend)
    out_dtype = TORCH_DTYPES[spec.output_dtype]
    iq = module.input_quantizer
    if spec.static_activations:
        g = iq.group_index()  # the step group's row of every static parameter, if grouped

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if g is None else t[g]

        offset = None if spec.activation_symmetric else pick(iq.offset).reshape(1).to(x2d.dtype)
        x_q = backend.quantize_static(x2d, pick(iq.inv_scale).to(x2d.dtype), offset)
        # fp16 output goes through the fixpipe's packed FP19 scale; bf16 takes fp32.
        scale = pick(module.deq_scale_packed if out_dtype == torch.float16 else module.deq_scale)
        y = backend.quant_matmul(
            x_q, w_q_t, scale, pertoken_scale=None, bias=pick(module.quant_bias),
            output_dtype=out_dtype, w_float_t=wf,
        )  # fmt: skip
    else:
        smooth = getattr(iq, "smooth_scales", None)
        smooth = None if smooth is None else smooth.to(x2d.dtype)
        x_q, tok_scale = backend.quantize_dynamic(x2d, smooth)
        y = backend.quant_matmul(
            x_q, w_q_t, module.weight_quantizer.scale, pertoken_scale=tok_scale,
            bias=module.bias, output_dtype=out_dtype, w_float_t=wf,
        )  # fmt: skip
    return y.to(x2d.dtype)


def mindie_sd_rows(
    module: QuantModule[Any], x2d: torch.Tensor, backend: QuantBackend
) -> torch.Tensor:
    """(M, K) -> (M, N) in the rows' dtype: MindIE-SD's Linear (:mod:`opsnn_quant.ascend.engines`)
    on ``module``'s parameters as its loader holds them (see
    :mod:`opsnn_quant.formats.mindie_sd`'s reader): activations times ``mul_scale`` in the
    engine dtype, the float32 bias of a weight-only Linear."""
    wf = module.reference_weight(x2d, backend)
    spec, iq = module.spec, module.input_quantizer
    dtype = TORCH_DTYPES[spec.output_dtype]
    w_t = module.weight.reshape(module.out_n, module.in_k).t()
    mul = getattr(iq, "mul_scale", None)
    if spec.weight_only:  # MindIE-SD holds the bias in float32
        y = engines.weight_only(x2d, w_t, module.weight_quantizer.scale, module.bias, dtype)
    elif spec.static_activations:
        g = iq.group_index()  # W8A8_TIMESTEP: the row of the step the loop is at
        rows = (lambda t: t) if g is None else (lambda t: t[g])
        offset = rows(iq.offset).reshape(1).to(torch.int8)
        # input_scale: bfloat16 in a bfloat16 model, float32 in a float16 one
        held = rows(iq.scale).reshape(1).to(dtype if dtype == torch.bfloat16 else torch.float32)
        y = engines.mindie_sd_static(
            x2d, w_t, rows(module.deq_scale), rows(module.quant_bias), held, offset, mul, dtype,
            wf,
        )  # fmt: skip
    else:
        scale = module.weight_quantizer.scale.to(dtype)
        bias = None if module.bias is None else module.bias.to(dtype)
        held = scale if dtype == torch.bfloat16 else scale.to(torch.float32)
        y = engines.mindie_sd_dynamic(x2d, w_t, held, bias, mul, dtype, wf)
    return y.to(x2d.dtype)


def vllm_ascend_rows(
    module: QuantModule[Any], x2d: torch.Tensor, backend: QuantBackend
) -> torch.Tensor:
    """(M, K) -> (M, N) in the rows' dtype: vLLM-Ascend's Linear
    (:mod:`opsnn_quant.ascend.engines`) on ``module``'s parameters as its loader holds them (see
    :mod:`opsnn_quant.formats.ascendv1`'s consumers): a SmoothQuant factor is folded into the
    norm before (the rows divided by it here), the bias in the params dtype."""
    wf = module.reference_weight(x2d, backend)
    spec, iq = module.spec, module.input_quantizer
    dtype = TORCH_DTYPES[spec.output_dtype]
    w_t = module.weight.reshape(module.out_n, module.in_k).t()
    folded = getattr(iq, "smooth", None)
    # what the norm with the factor divided into it hands the Linear
    x = x2d if folded is None else x2d.to(torch.float32) / folded
    bias = None if module.bias is None else module.bias.to(dtype)
    if spec.weight_only:
        y = engines.weight_only(x, w_t, module.weight_quantizer.scale, bias, dtype)
    elif spec.static_activations:
        offset = iq.offset.reshape(1).to(torch.int8)
        deq = module.deq_scale_packed if dtype == torch.float16 else module.deq_scale
        y = engines.vllm_ascend_static(
            x, w_t, deq, module.quant_bias, iq.scale.reshape(1).to(dtype), offset, dtype, wf
        )
    else:
        scale = module.weight_quantizer.scale.to(dtype)
        y = engines.vllm_ascend_dynamic(x, w_t, scale, bias, dtype, wf)
    return y.to(x2d.dtype)


QuantT = TypeVar("QuantT", bound=QuantModule[Any])
# float module class -> its quantized class, and quantized class name -> class (checkpoints)
_BY_FLOAT_TYPE: dict[type[nn.Module], type[QuantModule[Any]]] = {}
_BY_NAME: dict[str, type[QuantModule[Any]]] = {}


def register_quant_module(float_type: type[nn.Module]) -> Callable[[type[QuantT]], type[QuantT]]:
    """Class decorator: :func:`~opsnn_quant.quant.api.quantize` swaps every module of exactly
    ``float_type`` (not its subclasses) for the decorated :class:`QuantModule` subclass.

    A later registration for the same float type, or of a class with the same name, replaces
    the earlier one (checkpoints record the class name).

    Example:
        ``@register_quant_module(nn.Linear)`` above ``class QuantLinear(QuantModule[nn.Linear])``.

    Raises:
        TypeError: the decorated class is not a QuantModule subclass.
    """

    def register(cls: type[QuantT]) -> type[QuantT]:
        if not (isinstance(cls, type) and issubclass(cls, QuantModule)):
            raise TypeError(f"register_quant_module decorates QuantModule subclasses, not {cls!r}")
        for old in (_BY_FLOAT_TYPE.get(float_type), _BY_NAME.get(cls.__name__)):
            if old is not None and old is not cls:
                log.debug("registering %s for %s replaces %s", cls, float_type, old)
        cls.float_type = float_type
        _BY_FLOAT_TYPE[float_type] = cls
        _BY_NAME[cls.__name__] = cls
        return cls

    return register


def quant_module_class(float_type: type[nn.Module]) -> type[QuantModule[Any]] | None:
    """The class registered for float modules of exactly ``float_type`` (None: none is)."""
    return _BY_FLOAT_TYPE.get(float_type)


def quant_module_named(name: str) -> type[QuantModule[Any]] | None:
    """The registered quantized class called ``name`` (as ``description.json`` records it)."""
    return _BY_NAME.get(name)


def is_quant_module(module: nn.Module) -> bool:
    """True for quantized modules (any :class:`QuantModule`)."""
    return isinstance(module, QuantModule)


@contextmanager
def no_weight_copies(model: nn.Module) -> Iterator[None]:
    """Inside: no quantized module of ``model`` makes an fp32 copy of its weight (a replay or
    two of the model gains nothing from one, and they add up to its quantized weights in fp32)."""
    modules = [m for m in model.modules() if isinstance(m, QuantModule)]
    before = [m.cache_weight_float for m in modules]
    for m in modules:
        m.cache_weight_float = False
    try:
        yield
    finally:
        for m, flag in zip(modules, before, strict=True):
            m.cache_weight_float = flag


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at dotted ``name`` in ``model``, replacing what is there."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)
