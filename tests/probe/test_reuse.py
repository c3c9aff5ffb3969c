"""An earlier probe taken instead of probing again (probe/reuse.py): only with this run's
configuration, family, model and data."""

from __future__ import annotations

import dataclasses
import json

import pytest

from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.reuse import reusable_report
from tests.policy._factory import linear, report

INPUTS = {"model": "m" * 64, "data": "d" * 64}


def _saved(tmp_path, cfg: ProbeConfig, family: str = "toy", **update):
    config = {"family": family, **json.loads(json.dumps(dataclasses.asdict(cfg)))}
    rep = report(linear("a", 1e-4)).model_copy(
        update={"config": config, "inputs": INPUTS, **update}
    )
    file = tmp_path / "probe.json"
    rep.save(file)
    return file


def test_the_same_configuration_family_model_and_data_is_reused(tmp_path):
    cfg = ProbeConfig(schemes=("w8a8",), seed=3)
    file = _saved(tmp_path, cfg)
    got = reusable_report(file, cfg, "toy", dict(INPUTS), needs_estimates=True)
    assert got.inputs == INPUTS and [m.name for m in got.modules] == ["a"]


def test_another_setting_family_model_or_data_is_refused(tmp_path):
    cfg = ProbeConfig(schemes=("w8a8",), seed=3)
    file = _saved(tmp_path, cfg)
    with pytest.raises(ConfigError, match=r"other settings \(seed\); rerun without --from-probe"):
        reusable_report(
            file, dataclasses.replace(cfg, seed=4), "toy", INPUTS, needs_estimates=False
        )
    with pytest.raises(ConfigError, match=r"other settings \(family\)"):
        reusable_report(file, cfg, "whisper", INPUTS, needs_estimates=False)
    with pytest.raises(ConfigError, match=r"another data than this run's \(fingerprints differ\)"):
        reusable_report(file, cfg, "toy", {**INPUTS, "data": "x"}, needs_estimates=False)
    with pytest.raises(ConfigError, match=r"another data and model than"):
        reusable_report(file, cfg, "toy", {"model": "y", "data": "x"}, needs_estimates=False)


def test_a_pass_one_report_is_refused_where_the_estimates_may_be_read(tmp_path):
    cfg = ProbeConfig()
    file = _saved(tmp_path, cfg, not_estimated="strategy all-fp16 reads pass 1 only")
    with pytest.raises(ConfigError, match=r"ran pass 1 alone \(strategy all-fp16 reads pass 1"):
        reusable_report(file, cfg, "toy", INPUTS, needs_estimates=True)
    assert reusable_report(file, cfg, "toy", INPUTS, needs_estimates=False).not_estimated
