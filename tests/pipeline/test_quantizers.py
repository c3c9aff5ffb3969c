"""The quantizer table (opsnn_quant/pipeline/quantizers.py): who quantizes a calibrate
(``--engine``), resolved once, its fields read by the phases."""

from __future__ import annotations

import sys

import pytest

from opsnn_quant.errors import ConfigError, MissingDependencyError
from opsnn_quant.pipeline.quantizers import QUANTIZERS, get_quantizer
from opsnn_quant.pipeline.run import check_quantizer


def test_unknown_quantizer_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"--engine must be opsnn or amct, got 'tvm'"):
        get_quantizer("tvm")


def test_ours_writes_quant_and_amct_hands_the_policy_to_its_own_run(monkeypatch):
    ours, amct = QUANTIZERS["opsnn"], QUANTIZERS["amct"]
    assert (ours.ours, ours.offloaded, ours.hand_off) == (True, None, "")
    assert check_quantizer("opsnn") is ours  # nothing to install
    assert not amct.ours and "does not run an offloaded model" in (amct.offloaded or "")
    from opsnn_quant.amct import handoff

    seen = []
    monkeypatch.setattr(handoff, "run_amct_roots", lambda *args: seen.append(args))
    amct.run_hand_off("adapter", "policy", "loop", "out/amct")
    assert seen == [("adapter", "policy", "loop", "out/amct")]


def test_amct_is_refused_where_cann_does_not_ship_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "amct_pytorch", None)  # not importable
    with pytest.raises(MissingDependencyError, match="AMCT"):
        check_quantizer("amct")
