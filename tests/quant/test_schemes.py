"""The one scheme table: the probe's candidates and the QuantSpec each name stands for."""

import pytest
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.local import CONV_SCHEMES, LINEAR_SCHEMES, LocalProbe
from opsnn_quant.quant.schemes import SCHEMES, get_scheme, scheme_spec, schemes_for
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


def test_table_names_specs_and_preference_order():
    assert list(SCHEMES) == [
        "w8a8",
        "w8a8_mse",
        "w8a8_smoothquant",
        "w8a8_dynamic",
        "w8a8_dynamic_smoothquant",
        "w8a8_gptq",
        "w8a8_smoothquant_gptq",
        "w8a8_dynamic_gptq",
        "w4a16",
        "w8a8_timestep",
        "w8a8_timestep_smoothquant",
        "a8",
        "a8_kmean",
        "a8_step",
        "a8_head",
    ]
    assert scheme_spec("a8_kmean") == QuantSpec(Precision.A8, k_mean=True)
    assert scheme_spec("a8_head") == QuantSpec(Precision.A8, per_head=True)
    assert get_scheme("a8_step").spec(None, (0, 5)) == QuantSpec(
        Precision.A8, timestep_bounds=(0, 5)
    )
    assert scheme_spec("w8a8") == QuantSpec(Precision.W8A8, observer="minmax")
    per_step = get_scheme("w8a8_timestep").spec(None, (0, 3))
    assert per_step == QuantSpec(Precision.W8A8, timestep_bounds=(0, 3))
    both = get_scheme("w8a8_timestep_smoothquant").spec(0.5, (0, 3))
    assert both == QuantSpec(Precision.W8A8, smoothquant_alpha=0.5, timestep_bounds=(0, 3))
    assert scheme_spec("w4a16") == QuantSpec(Precision.W4A16, group_size=128)
    assert scheme_spec("w8a8_mse") == QuantSpec(Precision.W8A8, observer="mse")
    assert scheme_spec("w8a8_smoothquant", 0.6) == QuantSpec(Precision.W8A8, smoothquant_alpha=0.6)
    assert scheme_spec("w8a8_dynamic", 0.6) == QuantSpec(Precision.W8A8_DYNAMIC)  # no SQ
    assert scheme_spec("w8a8_dynamic_smoothquant", "auto").smoothquant_alpha == "auto"
    # the alpha search turned smoothing off: the plain template
    assert not scheme_spec("w8a8_smoothquant", None).smoothquant
    # GPTQ-rounded weights; the static ones with their bias corrected in quant_bias
    assert scheme_spec("w8a8_gptq") == QuantSpec(
        Precision.W8A8, weight_rounding="gptq", bias_correction=True
    )
    assert scheme_spec("w8a8_smoothquant_gptq", 0.5) == QuantSpec(
        Precision.W8A8, smoothquant_alpha=0.5, weight_rounding="gptq", bias_correction=True
    )
    assert scheme_spec("w8a8_dynamic_gptq") == QuantSpec(
        Precision.W8A8_DYNAMIC, weight_rounding="gptq"
    )


def test_module_types_drive_the_probe_candidates():
    assert schemes_for("Linear") == LINEAR_SCHEMES == tuple(SCHEMES)[:-4]
    assert schemes_for("SDPA") == ("a8", "a8_kmean", "a8_step", "a8_head")
    assert (
        schemes_for("Conv2d") == CONV_SCHEMES == ("w8a8", "w8a8_mse", "w8a8_dynamic", "w8a8_gptq")
    )
    assert schemes_for("LayerNorm") == ()
    # int4 packs eight values per word along K: measured only where K allows it
    # per-step scales only where a sampling loop set the step (none here)
    stepless = ("w8a8", "w8a8_mse", "w8a8_smoothquant", "w8a8_dynamic", "w8a8_dynamic_smoothquant")
    gptq = ("w8a8_gptq", "w8a8_smoothquant_gptq", "w8a8_dynamic_gptq")
    assert LocalProbe("fc", nn.Linear(16, 4)).schemes == (*stepless, *gptq, "w4a16")
    assert LocalProbe("fc", nn.Linear(12, 4)).schemes == (*stepless, *gptq)
    # GPTQ's K x K Hessian is kept only up to GPTQ_K_MAX input channels
    assert LocalProbe("fc", nn.Linear(4104, 1)).schemes == (*stepless, "w4a16")
    assert LocalProbe("conv", nn.Conv2d(2, 2, 1)).schemes == CONV_SCHEMES
    # a conv's K is C * KH * KW (its im2col rows): 456 * 3 * 3 = 4104 > GPTQ_K_MAX
    assert LocalProbe("conv", nn.Conv2d(456, 2, 3)).schemes == CONV_SCHEMES[:3]
    # a conv QuantConv2d cannot take as im2col (groups > 1) is not offered GPTQ
    assert LocalProbe("conv", nn.Conv2d(4, 4, 3, groups=2)).schemes == CONV_SCHEMES[:3]


def test_unknown_scheme_names_the_known_ones():
    with pytest.raises(ConfigError, match="unknown scheme 'w4a8'; choose one of w8a8, w8a8_mse"):
        get_scheme("w4a8")
