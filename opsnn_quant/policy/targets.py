"""Deployment targets: a chip and the engine that runs the result, with what each can run.

A :class:`Target` answers one question, :meth:`Target.can_run`, and says why when the answer is
no. :func:`~opsnn_quant.policy.search.build_policy` never assigns a precision the target refuses,
and :meth:`~opsnn_quant.policy.schema.PrecisionPolicy.validate` rejects hand-edited policies that do.

Sources (read 2025; the constraints below are the ones these pages state, nothing more):

* torch_npu ``npu_quant_matmul`` (W8A8 static and per-token): x1/x2 int8, 2-6 dims; ``pertoken_scale``
  "not supported on Atlas inference products" (310P); output float16/bfloat16/int8 on A2, no
  bfloat16 on 310P.
  https://www.hiascend.com/document/detail/zh/Pytorch/700/apiref/apilist/ptaoplist_000172.html
* aclnnQuantMatmulV4 constraints (the kernel behind it, ops-nn docs): on Atlas A2/A3 the last dim
  of x1 (k) and of x2 (n) must not exceed 65535 (a later revision lifts this for fp32/bf16 scales
  with per-channel + per-token; we keep the stricter bound because the fp16-output path uses the
  int64 scale from ``npu_trans_quant_param``).
  https://gitcode.com/cann/ops-nn/pull/6978/diffs
* torch_npu ``npu_weight_quant_batchmatmul`` (W8A16): per-channel int8 weights on A2 and 310P;
  64-alignment of k and n only for the int64 antiquant-scale path, which we do not use.
  https://www.hiascend.com/document/detail/zh/Pytorch/700/apiref/apilist/ptaoplist_000179.html
* AMCT/ATC static W8A8 through an ONNX deploy model: Gemm/MatMul and Conv are quantizable layers
  (MatMulV2/BatchMatMulV2, Conv2D in Ascend IR); AMCT's PTQ is static (IFMR calibration), so
  there is no per-token route through ATC.
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/amct/atlasamct_16_0131.html
* ATC ``--keep_dtype`` keeps a node's original (fp32) precision on every product.
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/atctool/atlasatcparam_16_0074.html

The brief this module was written from mentions "K % 16 == 0 and N % 8 == 0" for per-token; we did
not find that constraint in the torch_npu or aclnn pages above, so the alignment fields default to
1 (no constraint) and can be tightened per target once a source is found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.quant.engines import MINDIE_SD, VLLM_ASCEND, Engine, Smoothing, get_engine
from opsnn_quant.quant.spec import ATTENTION_TYPE, DEFAULT_GROUP_SIZE, QuantSpec
from opsnn_quant.types import Precision

INT8_MODULE_TYPES: frozenset[str] = frozenset({"Linear", "Conv2d"})
"""Module types with int8 weights (as ``opsnn_quant.quant.api.quantizable_modules``)."""
ATTENTION_TYPES: frozenset[str] = frozenset({ATTENTION_TYPE})
"""The module type of int8 attention (precision ``a8``, :mod:`opsnn_quant.quant.attention`)."""


def module_types_of(precision: Precision) -> frozenset[str]:
    """The module types an int8 ``precision`` applies to: attention for ``a8``, Linear/Conv2d
    for the others (none for a float precision)."""
    if precision.is_float:
        return frozenset()
    return ATTENTION_TYPES if precision.is_attention else INT8_MODULE_TYPES


OverflowMode = Literal["inf_nan", "saturate"]


@dataclass(frozen=True)
class Target:
    """What one deployment route can run.

    Attributes:
        name: e.g. ``ascend910b-eager``.
        description: one line for tables.
        route: ``eager`` (torch_npu ops), ``atc`` (ONNX deploy model + ATC) or ``reference``.
        fp16_overflow_mode: ``inf_nan`` (910B default: overflow becomes inf) or ``saturate``
            (310P: clamps to ±65504, silently).
        has_bf16: bfloat16 compute is available.
        int8: precision -> module types that can run it.
        max_k, max_n: documented upper bounds of the reduction / output dims of int8 matmuls
            (None = no bound). Applied to Linear only.
        k_multiple, n_multiple: alignment of k / n for int8 Linear (1 = none documented).
        timestep_scales: static activation scales can switch per denoising step at run time
            (``w8a8_timestep``: an eager route picks the step's scale for each call; a compiled
            ATC graph has one fixed scale).
        engine: the name of whose arithmetic runs the int8 modules, an entry of the engine
            table (:attr:`engine_def`: its smoothing, fused layers, tied modules...); the
            target's QuantSpecs carry it, so the reference computes what that engine computes.
        export: the model export format the engine loads (an exporter table name).
        dtype: the engine's activation and output dtype (``float16``/``bfloat16``) that its
            int8 specs carry (``QuantSpec.output_dtype``); None: the spec's default (float16).
    """

    name: str
    description: str
    route: Literal["eager", "atc", "reference"]
    fp16_overflow_mode: OverflowMode
    has_bf16: bool
    int8: Mapping[Precision, frozenset[str]] = field(default_factory=dict)
    max_k: int | None = None
    max_n: int | None = None
    k_multiple: int = 1
    n_multiple: int = 1
    timestep_scales: bool = False
    engine: str = "opsnn"
    export: str | None = None
    dtype: Literal["float16", "bfloat16"] | None = None

    def __post_init__(self) -> None:
        get_engine(self.engine)  # a known engine

    @property
    def engine_def(self) -> Engine:
        """The entry of the engine table (:mod:`opsnn_quant.quant.engines`) :attr:`engine`
        names: what the engine that runs this target's int8 modules does differently."""
        return get_engine(self.engine)

    @property
    def smoothing(self) -> Smoothing:
        """How SmoothQuant factors deploy: the engine's
        (:data:`~opsnn_quant.quant.engines.Smoothing`; ``fold``: into the norm before)."""
        return self.engine_def.smoothing

    @property
    def step_smoothing(self) -> bool:
        """Per-step static scales combine with SmoothQuant on the engine."""
        return self.engine_def.step_smoothing

    def tie_reason(self, tied_to: str | None) -> str | None:
        """Why this target keeps a module tied to the embedding ``tied_to`` float (None: not
        tied, or the engine loads tied modules as any other)."""
        tied_float = self.engine_def.tied_float
        if tied_to is None or tied_float is None:
            return None
        return f"tied to {tied_to}: {tied_float}"

    def can_run(
        self,
        module_type: str,
        precision: Precision | str,
        in_features: int | None = None,
        out_features: int | None = None,
        *,
        weight_shape: Sequence[int] | None = None,
    ) -> tuple[bool, str]:
        """Whether this target runs ``module_type`` in ``precision``.

        Args:
            module_type: class name, e.g. ``Linear``, ``Conv2d``, ``LayerNorm``.
            precision: the precision asked for.
            in_features, out_features: k and n of a Linear (optional).
            weight_shape: the weight's shape instead of k/n (Linear ``(n, k)``; Conv2d
                ``(out, in/groups, kh, kw)``).

        Returns:
            ``(True, "")`` or ``(False, reason)`` where the reason names the target and the rule.
        """
        p = Precision(precision)
        if p == Precision.BF16 and not self.has_bf16:
            return False, f"{self.name} has no bfloat16"
        if p.is_float:
            return True, ""
        types = self.int8.get(p, frozenset())
        if module_type not in types:
            if not types:
                return False, f"{self.name} cannot run {p.value} at all"
            allowed = "/".join(sorted(types))
            return False, f"{self.name} runs {p.value} only for {allowed}, not {module_type}"
        if module_type != "Linear":
            return True, ""
        k, n = in_features, out_features
        if weight_shape is not None and len(weight_shape) == 2:
            n, k = int(weight_shape[0]), int(weight_shape[1])
        if p == Precision.W4A16 and k is not None and (k % 8 or k <= DEFAULT_GROUP_SIZE):
            # int4 words hold eight values along k; torch_npu's group size lies in [32, k - 1].
            return (
                False,
                f"{self.name}: w4a16 Linear needs k % 8 == 0 and k > {DEFAULT_GROUP_SIZE} "
                f"(its group size), got {k}",
            )
        for dim, value, bound, multiple in (
            ("k", k, self.max_k, self.k_multiple),
            ("n", n, self.max_n, self.n_multiple),
        ):
            if value is None:
                continue
            if bound is not None and value > bound:
                return False, f"{self.name}: {p.value} Linear needs {dim} <= {bound}, got {value}"
            if value % multiple:
                return (
                    False,
                    f"{self.name}: {p.value} Linear needs {dim} % {multiple} == 0, got {value}",
                )
        return True, ""

    def schemes(self, module_type: str | None = None) -> tuple[str, ...]:
        """The probe's candidate schemes this target can run (in the scheme table's order):
        what a probe for this target needs to measure.

        Args:
            module_type: only the schemes it runs on modules of this class (``Linear``,
                ``Conv2d``); None: those it runs on some module type.
        """
        from opsnn_quant.quant.schemes import SCHEMES

        return tuple(
            name
            for name, s in SCHEMES.items()
            if any(
                self.can_run(t, s.precision)[0]
                for t in s.module_types
                if module_type is None or t == module_type
            )
            and (self.timestep_scales or not s.per_step)
            and (self.step_smoothing or not (s.per_step and s.smoothquant))
        )

    def probe_config(self, **overrides: Any) -> ProbeConfig:
        """A :class:`~opsnn_quant.probe.config.ProbeConfig` that measures what this target
        runs and nothing else: its schemes, on the module types it runs each on, in its
        engine's arithmetic and dtype (a probe of every scheme pays for candidates no policy
        for this target can choose).

        Args:
            **overrides: other ProbeConfig fields (e.g. ``max_root_calls=4``); ``schemes``
                narrows the target's.

        Raises:
            ConfigError: a scheme in ``schemes`` the target does not run.
        """
        runs = self.schemes()
        schemes = tuple(overrides.pop("schemes", runs))
        unknown = [s for s in schemes if s not in runs]
        if unknown:
            raise ConfigError(f"{self.name} cannot run {', '.join(unknown)}")
        return ProbeConfig(
            **{
                "schemes": schemes,
                # attention only where the target runs it: the other targets' probe configs
                # (and the reuse of their earlier probes) stay as they were
                "type_schemes": {
                    t: self.schemes(t)
                    for t in sorted(INT8_MODULE_TYPES | ATTENTION_TYPES)
                    if t in INT8_MODULE_TYPES or self.schemes(t)
                },
                "engine": self.engine,
                "engine_dtype": self.dtype,
                "fold_smoothing": self.smoothing == "fold",
                **overrides,
            }
        )

    def spec_for(self, spec: QuantSpec) -> QuantSpec:
        """``spec`` as this target's engine runs it: its arithmetic (``engine``) and dtype."""
        if self.dtype is None and not self.engine_def.model_dtype:
            return spec
        return dataclasses.replace(
            spec, engine=self.engine, output_dtype=self.dtype or spec.output_dtype
        )

    def fused_group(self, name: str) -> tuple[str, ...] | None:
        """The fused group ``name``'s last component belongs to (None: none)."""
        leaf = name.rpartition(".")[2]
        return next((g for g in self.engine_def.fused if leaf in g), None)

    def fused_layers(self, names: Iterable[str]) -> list[list[str]]:
        """The layers the engine fuses among ``names``: siblings (one parent) whose last
        components are in one fused group; only those of two or more, in order."""
        layers: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for name in names:
            group = self.fused_group(name)
            if group is not None:
                layers.setdefault((name.rpartition(".")[0], group), []).append(name)
        return [members for members in layers.values() if len(members) > 1]

    def int8_precisions(self, module_type: str) -> list[Precision]:
        """The int8 precisions this target runs for ``module_type``, in enum order."""
        return [p for p in Precision if p.is_int8 and module_type in self.int8.get(p, ())]


_LIN = frozenset({"Linear"})
_LIN_CONV = frozenset({"Linear", "Conv2d"})

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="ascend910b-eager",
            description="Atlas A2 (910B), this package's quantized modules on torch_npu (eager)",
            route="eager",
            fp16_overflow_mode="inf_nan",
            has_bf16=True,
            # npu_quant_matmul (static, per-token) and npu_weight_quant_batchmatmul (w8a16,
            # w4a16: int4 weights per group on A2/A3) are matmuls: Linear only. There is no int8
            # conv op in torch_npu's list we rely on.
            int8={
                Precision.W8A8: _LIN,
                Precision.W8A8_DYNAMIC: _LIN,
                Precision.W8A16: _LIN,
                Precision.W4A16: _LIN,
                # npu_fused_infer_attention_score with int8 query/key/value (A2/A3, Q_S > 1:
                # opsnn_quant/ascend/attention.py): an attention module's SDPA
                Precision.A8: ATTENTION_TYPES,
            },
            max_k=65535,
            max_n=65535,
            timestep_scales=True,  # npu_quantize takes the step's scale on every call
        ),
        Target(
            name="ascend910b-mindie-sd",
            description="Atlas A2 (910B), MindIE-SD (mindiesd.quantize of a diffusers component)",
            route="eager",
            fp16_overflow_mode="inf_nan",
            has_bf16=True,
            # mindiesd/quantization/quantize.py replaces nn.Linear only: W8A8 (static, and
            # W8A8_TIMESTEP: a static scale per denoising step), W8A8_DYNAMIC and W8A16 (W4A16's
            # WeightQuantLinear takes per-channel scales only).
            int8={Precision.W8A8: _LIN, Precision.W8A8_DYNAMIC: _LIN, Precision.W8A16: _LIN},
            max_k=65535,
            max_n=65535,
            timestep_scales=True,
            engine=MINDIE_SD.name,
            export="mindie-sd",
            dtype="bfloat16",  # mindiesd.quantize's default dtype
        ),
        Target(
            name="ascend910b-vllm-ascend",
            description="Atlas A2 (910B), vLLM-Ascend / SGLang (AscendV1 weights of one model)",
            route="eager",
            fp16_overflow_mode="inf_nan",
            has_bf16=True,
            # vllm_ascend/quantization/methods: W8A8 (w8a8_static.py), W8A8_DYNAMIC, W8A16 Linear
            # schemes; W4A16 is registered for MoE only. No SmoothQuant at run time: folded.
            int8={Precision.W8A8: _LIN, Precision.W8A8_DYNAMIC: _LIN, Precision.W8A16: _LIN},
            max_k=65535,
            max_n=65535,
            engine=VLLM_ASCEND.name,
            export="ascendv1",
            # served with --dtype bfloat16: every dtype combination its Linear methods pass to
            # npu_quant_matmul is a documented one (float16 per-token takes a float16 weight
            # scale, which the torch_npu table does not list); export/ascendv1/config.json says
            # so, since vLLM's --dtype auto reads nothing else
            dtype="bfloat16",
        ),
        Target(
            name="ascend910b-atc",
            description="Atlas A2 (910B), ONNX deploy model compiled by ATC",
            route="atc",
            fp16_overflow_mode="inf_nan",
            has_bf16=True,
            # AMCT's static PTQ quantizes Gemm/MatMul and Conv; no per-token or weight-only here.
            int8={Precision.W8A8: _LIN_CONV},
            export="atc",
        ),
        Target(
            name="ascend310p-atc",
            description="Atlas inference (310P), ONNX deploy model compiled by ATC",
            route="atc",
            # 310P runs fp16 in saturation mode: an overflow clamps to ±65504 without inf/nan.
            fp16_overflow_mode="saturate",
            has_bf16=False,
            int8={Precision.W8A8: _LIN_CONV},
            export="atc",
        ),
        Target(
            name="cpu-reference",
            description="CPU reference of the Ascend int8 arithmetic (every scheme)",
            route="reference",
            fp16_overflow_mode="inf_nan",
            has_bf16=True,
            # int4 weights are a matmul format (QuantLinear only).
            int8={
                p: ATTENTION_TYPES
                if p.is_attention
                else _LIN
                if p == Precision.W4A16
                else _LIN_CONV
                for p in Precision
                if p.is_int8
            },
            timestep_scales=True,
        ),
    )
}
# Earlier names, read in recipes and policies written before the engine was part of the target.
ALIASES: dict[str, str] = {"ascend310p": "ascend310p-atc"}
CPU_REFERENCE: Target = TARGETS["cpu-reference"]
"""The target a policy is decided for when none is given: the CPU reference of every scheme."""


def get_target(name: str | Target) -> Target:
    """The target called ``name`` (a :class:`Target` is returned as is).

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    if isinstance(name, Target):
        return name
    try:
        return TARGETS[ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join(TARGETS)
        raise ConfigError(f"unknown target {name!r}; known targets: {known}") from None
