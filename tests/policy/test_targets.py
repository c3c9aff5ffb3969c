"""Targets: what each deployment route runs, and the reasons when it does not."""

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.targets import TARGETS, get_target
from opsnn_quant.types import Precision


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(ConfigError) as exc:
        get_target("ascend999")
    for name in ("ascend910b-eager", "ascend910b-atc", "ascend310p-atc", "cpu-reference"):
        assert name in str(exc.value)
    for name in ("ascend910b-mindie-sd", "ascend910b-vllm-ascend"):
        assert name in str(exc.value)


def test_get_target_passes_objects_through_and_reads_earlier_names():
    t = TARGETS["ascend310p-atc"]
    assert get_target(t) is t
    assert get_target("ascend310p") is t  # the name before the engine was part of the target


def test_engine_targets_carry_their_engines_capabilities():
    mindie, vllm = get_target("ascend910b-mindie-sd"), get_target("ascend910b-vllm-ascend")
    # MindIE-SD replaces nn.Linear only (mindiesd/quantization/quantize.py); non-fusion
    # SmoothQuant (<linear>.div.mul_scale) is applied at run time, in bfloat16 by default
    assert (mindie.engine, mindie.smoothing, mindie.export, mindie.dtype) == (
        "mindie-sd", "mul_scale", "mindie-sd", "bfloat16",
    )  # fmt: skip
    assert not mindie.can_run("Conv2d", "w8a8")[0] and mindie.can_run("Linear", "w8a8")[0]
    assert "w8a8_smoothquant" in mindie.schemes("Linear") and mindie.schemes("Conv2d") == ()
    # vLLM-Ascend: no smoothing at run time (w8a8_static.py quantizes x as it comes), so a
    # factor is folded into the norm: SmoothQuant is measured (on the probe's smoothing
    # groups); q/k/v and gate/up load as one fused layer of one type
    assert (vllm.engine, vllm.smoothing, vllm.export) == ("vllm-ascend", "fold", "ascendv1")
    assert vllm.schemes("Linear") == (
        "w8a8", "w8a8_mse", "w8a8_smoothquant", "w8a8_dynamic", "w8a8_dynamic_smoothquant",
        "w8a8_gptq", "w8a8_smoothquant_gptq", "w8a8_dynamic_gptq",
    )  # fmt: skip
    assert vllm.fused_group("model.layers.0.self_attn.k_proj") == ("q_proj", "k_proj", "v_proj")
    assert vllm.fused_group("model.layers.0.mlp.down_proj") is None


def test_eager_runs_int8_on_linear_only():
    t = get_target("ascend910b-eager")
    for p in (Precision.W8A8, Precision.W8A8_DYNAMIC, Precision.W8A16):
        assert t.can_run("Linear", p) == (True, "")
    ok, why = t.can_run("Conv2d", Precision.W8A8)
    assert not ok and "ascend910b-eager" in why and "Linear" in why and "Conv2d" in why
    assert t.can_run("LayerNorm", "bf16") == (True, "")
    assert t.can_run("LayerNorm", "fp32") == (True, "")


def test_eager_matmul_dims_bounded_by_65535():
    t = get_target("ascend910b-eager")
    assert t.can_run("Linear", "w8a8", in_features=65535, out_features=8)[0]
    ok, why = t.can_run("Linear", "w8a8", weight_shape=(8, 65536))  # (n, k)
    assert not ok and "k <= 65535" in why
    ok, why = t.can_run("Linear", "w8a8_dynamic", in_features=16, out_features=70000)
    assert not ok and "n <= 65535" in why


def test_atc_targets_static_only_linear_and_conv():
    for name in ("ascend910b-atc", "ascend310p-atc"):
        t = get_target(name)
        assert t.can_run("Conv2d", "w8a8")[0] and t.can_run("Linear", "w8a8")[0]
        ok, why = t.can_run("Linear", "w8a8_dynamic")
        assert not ok and "cannot run w8a8_dynamic" in why
        assert not t.can_run("LayerNorm", "w8a8")[0]


def test_310p_saturates_and_has_no_bf16():
    t = get_target("ascend310p")
    assert t.fp16_overflow_mode == "saturate" and not t.has_bf16
    ok, why = t.can_run("Linear", Precision.BF16)
    assert not ok and "bfloat16" in why
    b = get_target("ascend910b-eager")
    assert b.fp16_overflow_mode == "inf_nan" and b.has_bf16


def test_cpu_reference_runs_everything_on_linear_and_conv():
    t = get_target("cpu-reference")
    assert t.int8_precisions("Conv2d") == [Precision.W8A8, Precision.W8A8_DYNAMIC, Precision.W8A16]
    assert t.int8_precisions("LayerNorm") == []
    assert t.can_run("Conv2d", "w8a8_dynamic", weight_shape=(8, 4, 3, 3))[0]


def test_a_targets_probe_config_measures_what_it_runs_in_its_engines_arithmetic():
    atc = get_target("ascend910b-atc").probe_config()
    assert atc.schemes == ("w8a8", "w8a8_mse", "w8a8_smoothquant", "w8a8_gptq",
                           "w8a8_smoothquant_gptq")  # fmt: skip
    assert atc.type_schemes == {"Conv2d": ("w8a8", "w8a8_mse", "w8a8_gptq"),
                                "Linear": atc.schemes}  # fmt: skip
    assert (atc.engine, atc.engine_dtype, atc.fold_smoothing) == ("opsnn", None, False)
    # vLLM-Ascend folds SmoothQuant into the norm before (fold_smoothing) and computes in bf16
    vllm = get_target("ascend910b-vllm-ascend").probe_config(max_root_calls=2)
    assert (vllm.engine, vllm.engine_dtype, vllm.fold_smoothing) == ("vllm-ascend", "bfloat16",
                                                                      True)  # fmt: skip
    assert vllm.max_root_calls == 2 and vllm.type_schemes["Conv2d"] == ()
    assert get_target("ascend910b-atc").probe_config(schemes=("w8a8",)).schemes == ("w8a8",)
    with pytest.raises(ConfigError, match="ascend910b-atc cannot run w8a8_dynamic"):
        get_target("ascend910b-atc").probe_config(schemes=("w8a8", "w8a8_dynamic"))


def test_the_schemes_of_a_module_type_are_those_the_target_runs_on_it():
    eager, atc = get_target("ascend910b-eager"), get_target("ascend910b-atc")
    assert eager.schemes("Conv2d") == ()  # no int8 conv among the torch_npu ops we rely on
    # its attention modules: the fused int8 attention, the key as it is or less its mean
    # per step (it switches scales per step) and per key/value head (one op call per head)
    assert eager.schemes("SDPA") == ("a8", "a8_kmean", "a8_step", "a8_head")
    assert eager.schemes("Linear") + eager.schemes("SDPA") == eager.schemes()
    assert atc.schemes("SDPA") == ()
    # ATC: AMCT's static PTQ of Gemm and Conv; SmoothQuant's factors only on a Linear's input;
    # GPTQ's static integers on a conv's im2col rows too
    assert atc.schemes("Conv2d") == ("w8a8", "w8a8_mse", "w8a8_gptq")
    assert atc.schemes("Linear") == atc.schemes() == (
        "w8a8", "w8a8_mse", "w8a8_smoothquant", "w8a8_gptq", "w8a8_smoothquant_gptq",
    )  # fmt: skip
    assert get_target("cpu-reference").schemes("Conv2d") == (
        "w8a8", "w8a8_mse", "w8a8_dynamic", "w8a8_gptq",
    )  # fmt: skip
