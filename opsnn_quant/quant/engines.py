"""The engine table: what each serving engine does differently, one :class:`Engine` per engine.

An engine is whose arithmetic a quantized module computes once frozen (``QuantSpec.engine``,
the name a checkpoint and a policy record) and whose loader reads its export: ``opsnn`` (this
package's modules on torch_npu's quant ops or the CPU reference; ATC's QDQ graphs are built from
them), ``mindie-sd`` (``mindiesd.quantize``'s Linear classes) and ``vllm-ascend`` (its ModelSlim
Linear methods). A spec or a target looks its engine up here once (``QuantSpec.engine_def``,
``Target.engine_def``); ``quant/``, ``probe/``, ``policy/`` and ``formats/`` read its fields and
never compare engine names. Adding an engine is one :class:`Engine` and :func:`register_engine`.

The arithmetic behind an engine (``rows``, ``input_scale``, ``deq_scale_pack``) is named
``"module:function"`` and imported on first use, as a format's writer is: this table, and the
specs and policies that check against it, import no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from opsnn_quant.errors import ConfigError
from opsnn_quant.types import Precision

if TYPE_CHECKING:
    import torch

    from opsnn_quant.backends.base import QuantBackend

Smoothing = Literal["multiplier", "mul_scale", "fold"]
"""How a SmoothQuant factor ``s`` reaches an engine's Linear: ``multiplier`` (this package's
modules fold ``1 / s`` into AscendQuantV2's per-channel multiplier, DynamicQuant's
``smooth_scales`` when per token), ``mul_scale`` (MindIE-SD multiplies the activations by
``<linear>.div.mul_scale``, ``1 / s`` in the engine dtype, before quantizing) or ``fold``
(vLLM-Ascend's Linear applies none: the factor is divided into the norm that feeds it, one factor
shared by every Linear that norm feeds)."""

_ENGINE_MATH = "opsnn_quant.quant.engine"  # the parameters in the form each engine holds them
_ROWS = "opsnn_quant.quant.qmodule"  # each engine's Linear on a frozen module's rows


@dataclass(frozen=True)
class Engine:
    """What one serving engine does differently.

    Attributes:
        name: the name a spec, a policy and a checkpoint record (``QuantSpec.engine``).
        description: one line for messages and docs.
        linear: the precisions its Linear classes run.
        conv: it runs an int8 Conv2d (``QuantConv2d``; the engines' Linear classes do not).
        step_scales: static activation scales may switch per denoising step
            (``QuantSpec.timestep_bounds``: MindIE-SD's ``W8A8TimeStepQuantLinear``).
        step_smoothing: per-step scales combine with SmoothQuant (MindIE-SD's per-step Linear
            as exported here takes no ``mul_scale``).
        smoothing: how a SmoothQuant factor reaches its Linear (:data:`Smoothing`).
        model_dtype: it computes in the served model's dtype: a spec made for it carries that
            dtype (``QuantSpec.output_dtype``); False: ``output_dtype`` is only the quant
            matmul's output dtype (this package's modules take fp32 activations).
        weight_scales: the dtype it keeps the weight scales of its per-token and weight-only
            Linears in: ``model`` (rounded up to that dtype before the weight is quantized, so the
            int8 values never need clipping) or ``float32``; static W8A8 folds them into the
            float32 ``deq_scale`` either way.
        input_scale: ``"module:function"``, ``(calibrated scale, torch dtype) -> (stored,
            effective)``: the static ``input_scale`` to store and the scale the engine
            effectively quantizes with (what ``deq_scale`` and ``quant_bias`` are made from).
        deq_scale_pack: ``"module:function"``, float32 ``deq_scale`` -> the int64 form a
            float16 model's quant matmul takes (torch_npu's ``npu_trans_quant_param`` for ours,
            the fp32 bits for the engines' loaders).
        rows: ``"module:function"``, ``(frozen module, (M, K) rows, backend) -> (M, N)`` in the
            rows' dtype: the engine's Linear on the module's parameters as it loads them.
        run_dtypes: the dtypes a pipeline whose Linears it runs can run in (the first: when
            another is asked for); empty: any.
        fused: groups of sibling Linear names its loader fuses into one layer (vLLM's
            ``qkv_proj`` from ``q_proj``/``k_proj``/``v_proj``): every member present under
            one parent gets the same QuantSpec (one type and one input scale per layer).
        tied_float: why it runs a module tied to an embedding (a head sharing its token
            embedding's weight) in float, loaded from that embedding; None: it loads the
            module's own tensors like any other.
        int8_attention: it runs an attention module's SDPA as the fused int8 attention
            (precision ``a8``, :mod:`opsnn_quant.quant.attention`).
        attention_note: why its attention stays float when it does not.
    """

    name: str
    description: str
    linear: frozenset[Precision]
    conv: bool
    step_scales: bool
    step_smoothing: bool
    smoothing: Smoothing
    model_dtype: bool
    weight_scales: Literal["model", "float32"]
    input_scale: str
    deq_scale_pack: str
    rows: str
    run_dtypes: tuple[str, ...] = ()
    fused: tuple[tuple[str, ...], ...] = ()
    tied_float: str | None = None
    int8_attention: bool = False
    attention_note: str = "its loader quantizes no attention: attention runs in float"

    def runs(self, precision: Precision) -> bool:
        """Whether its Linear classes run ``precision``."""
        return Precision(precision) in self.linear

    def input_scale_of(self, scale: float, dtype: torch.dtype) -> tuple[float, float]:
        """``(stored, effective)`` of a calibrated static activation ``scale`` in ``dtype``
        (see :attr:`input_scale`)."""
        stored, effective = _handler(self.input_scale)(scale, dtype)
        return stored, effective

    def pack_deq_scale(self, deq_scale: torch.Tensor) -> torch.Tensor:
        """The int64 ``deq_scale`` of a float16 model (see :attr:`deq_scale_pack`)."""
        packed: torch.Tensor = _handler(self.deq_scale_pack)(deq_scale)
        return packed

    def linear_rows(self, module: Any, x2d: torch.Tensor, backend: QuantBackend) -> torch.Tensor:
        """A frozen ``QuantModule``'s (M, K) rows through this engine's Linear (see
        :attr:`rows`; the module is not typed here: the quantized modules import this table)."""
        out: torch.Tensor = _handler(self.rows)(module, x2d, backend)
        return out

    def run_dtype(self, dtype: str) -> str:
        """The dtype a pipeline whose Linears this engine runs runs in when ``dtype`` is asked
        for (see :attr:`run_dtypes`)."""
        if not self.run_dtypes or dtype in self.run_dtypes:
            return dtype
        return self.run_dtypes[0]


@cache
def _handler(spec: str) -> Callable[..., Any]:
    module, _, func = spec.partition(":")
    handler: Callable[..., Any] = getattr(importlib.import_module(module), func)
    return handler


_W8 = frozenset({Precision.W8A8, Precision.W8A8_DYNAMIC, Precision.W8A16})

# vllm 0.23.0 model_executor/models/whisper.py: load_weights skips every ``proj_out.*`` tensor
# (AutoWeightsLoader(skip_prefixes=["proj_out."])) and ``ParallelLMHead.tie_weights`` makes the
# head's weight the decoder's embedding Parameter; a quantized head (vllm-ascend
# modelslim_config.py get_quant_method: AscendEmbeddingMethod) keeps unloaded scales and its
# process_weights_after_loading transposes the shared embedding, so no token lookup works.
TIED_HEAD_VLLM = (
    "vLLM loads a head tied to an embedding from that embedding, in float (it skips the head's "
    "own tensors; a quantized head would transpose the shared embedding)"
)
# Linear names vLLM loads as one fused layer (its models' packed_modules_mapping: qkv_proj,
# gate_up_proj; Whisper's cross-attention kv_proj is k_proj + v_proj, inside the q/k/v group).
VLLM_FUSED: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))

OPSNN = Engine(
    name="opsnn",
    description="this package's quantized modules (torch_npu's quant ops, the CPU reference)",
    linear=frozenset(p for p in Precision if p.is_int8 and not p.is_attention),
    conv=True,
    step_scales=True,  # npu_quantize takes the step's scale on every call
    step_smoothing=True,
    smoothing="multiplier",
    model_dtype=False,
    weight_scales="float32",
    input_scale=f"{_ENGINE_MATH}:calibrated_input_scale",
    deq_scale_pack="opsnn_quant.ascend:npu_trans_quant_param",
    rows=f"{_ROWS}:opsnn_rows",
    int8_attention=True,  # torch_npu's npu_fused_infer_attention_score, int8 full quant (A2/A3)
    attention_note="",
)
# mindiesd 3.1.0 mindiesd/quantization: quantize.py replaces nn.Linear only (W8A8, W8A8_TIMESTEP,
# W8A8_DYNAMIC, W8A16; W4A16's WeightQuantLinear takes per-channel scales only); layer.py 347-363
# runs its Linear in QuantConfig.dtype (bfloat16 by default) or float16.
MINDIE_SD = Engine(
    name="mindie-sd",
    description="MindIE-SD (mindiesd.quantize's Linear classes)",
    linear=_W8,
    conv=False,
    step_scales=True,
    # W8A8TimeStepQuantLinear does multiply by mul_scale in both branches (layer.py 422-423,
    # 440-441), but the export and the reader do not carry that combination yet
    step_smoothing=False,
    smoothing="mul_scale",
    model_dtype=True,
    weight_scales="model",  # a float16 model rounds dynamic scales through float16 too
    input_scale=f"{_ENGINE_MATH}:mindie_sd_input_scale",
    deq_scale_pack=f"{_ENGINE_MATH}:deqscale2int64",
    rows=f"{_ROWS}:mindie_sd_rows",
    run_dtypes=("bfloat16", "float16"),
    # mindiesd 3.1.0 quantization/layer.py l.456-574: FP8RotateQuantFA / MXFP8RotateQuantFA call
    # FIA-v2 with float8_e4m3fn query/key/value (Ascend 950); the int8 QuantFA is gone
    attention_note=(
        "MindIE-SD 3.1.0 loads FP8 rotated attention only (FP8RotateQuantFA, Ascend 950 FP8 "
        "hardware); on A2 its attention runs in float"
    ),
)
# vllm_ascend/quantization/methods: W8A8 (w8a8_static.py), W8A8_DYNAMIC, W8A16 Linear schemes;
# W4A16 is registered for MoE only. No SmoothQuant at run time: folded.
VLLM_ASCEND = Engine(
    name="vllm-ascend",
    description="vLLM-Ascend / SGLang (ModelSlim Linear methods on AscendV1 weights)",
    linear=_W8,
    conv=False,
    step_scales=False,  # one static scale per Linear
    step_smoothing=False,
    smoothing="fold",
    model_dtype=True,
    weight_scales="model",
    input_scale=f"{_ENGINE_MATH}:vllm_ascend_input_scale",
    deq_scale_pack=f"{_ENGINE_MATH}:deqscale2int64",
    rows=f"{_ROWS}:vllm_ascend_rows",
    fused=VLLM_FUSED,
    tied_float=TIED_HEAD_VLLM,
    # vllm_ascend/quantization/methods/kv_c8.py l.30, l.75: its "attention" schemes (FAKQuant,
    # INT8_DYNAMIC) quantize an MLA model's KV cache (kv_lora_rank); none takes Whisper's
    attention_note=(
        "vLLM-Ascend 0.23's attention schemes quantize MLA KV caches only: Whisper's attention "
        "runs in float"
    ),
)

ENGINES: dict[str, Engine] = {e.name: e for e in (OPSNN, MINDIE_SD, VLLM_ASCEND)}


def register_engine(engine: Engine) -> Engine:
    """Add ``engine`` to the table (specs and targets may then name it).

    Raises:
        ConfigError: an engine of that name is registered already.
    """
    if engine.name in ENGINES:
        raise ConfigError(f"engine {engine.name!r} is registered already")
    ENGINES[engine.name] = engine
    return engine


def get_engine(name: str) -> Engine:
    """The engine called ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown engine {name!r}; choose one of {tuple(ENGINES)}") from None
