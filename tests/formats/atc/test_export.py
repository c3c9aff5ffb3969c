"""``export/atc/``: the commands checked against the manuals' rules, and the graphs they name."""

from __future__ import annotations

import copy
import shlex

import numpy as np
import onnx
import pytest
import torch

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.atc.commands import check_aoe, check_atc
from opsnn_quant.formats.atc.export import write_atc
from opsnn_quant.formats.atc.onnx.runtime import onnxruntime_session
from opsnn_quant.formats.policy_files import modules_from_model
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.quant.api import quantize
from tests.tiny_models import TinyAttention, forward_loop_for

GOOD = ["atc", "--framework=5", "--model=m.onnx", "--output=m", "--soc_version=Ascend910B3",
        "--input_format=ND", "--input_shape=x:1,8,64;t:1", "--precision_mode_v2=mixed_float16",
        "--keep_dtype=k.cfg", "--modify_mixlist=mix.json", "--log=error"]  # fmt: skip


def _with(*changes: str, drop: str | None = None) -> list[str]:
    names = {c.split("=")[0] for c in changes}
    kept = [a for a in GOOD if a.split("=")[0] not in names and a.split("=")[0] != drop]
    return [*kept, *changes]


def test_a_manual_conforming_atc_command_passes():
    check_atc(GOOD)
    check_aoe(["aoe", "--framework=5", "--model=m.onnx", "--job_type=2",
               "--precision_mode=allow_mix_precision_fp16", "--modify_mixlist=mix.json"])  # fmt: skip


BAD_ATC = [
    (_with("--frobnicate=1"), "--frobnicate is not a documented atc flag"),
    (_with("--framework=2"), "--framework must be 0, 1, 3 or 5"),
    (_with("--precision_mode=force_fp16"), "exclude each other"),  # E10056
    (_with("--precision_mode_v2=fp16"), "--modify_mixlist needs a mixed precision mode"),  # E10001
    (_with("--precision_mode_v2=origin", drop="--modify_mixlist"), "--keep_dtype needs a precision mode"),
    (_with("--precision_mode_v2=mixed_half"), "not a documented value"),
    (_with("--input_shape=x:1:2"), "is not name:d1,d2"),
    (_with("--input_format=NHWC"), "for ONNX is NCHW, ND or NCDHW"),
    (_with("--output=m.om"), "ATC appends .om"),
    (_with(drop="--soc_version"), "--soc_version is required"),
    (_with("--soc_version=910B3"), "is not Ascend<chip>"),
    (_with("--log=verbose"), "not a documented level"),
    ([*GOOD, "--log=error"], "--log given twice"),
    ([*GOOD, "-m", "x"], "is not --name=value"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), BAD_ATC, ids=[m for _, m in BAD_ATC])
def test_an_atc_command_breaking_a_manual_rule_is_refused(args, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        check_atc(args)


def test_aoe_rules():
    base = ["aoe", "--framework=5", "--model=m.onnx"]
    with pytest.raises(ConfigError, match="--job_type must be 1"):
        check_aoe([*base, "--job_type=3"])
    with pytest.raises(ConfigError, match="--precision_mode_v2 is not a documented aoe flag"):
        check_aoe([*base, "--job_type=1", "--precision_mode_v2=fp16"])


POLICY = """\
schema_version: 1
model: tiny
target: ascend910b-atc
modalities: {'': denoiser}
defaults: {denoiser: fp16}
rules:
- {match: norm2, precision: fp32, reason: pinned}
- {match: '*', precision: w8a8, reason: bulk}
"""


def _commands(script: str) -> list[list[str]]:
    text = script.replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines()]
    return [shlex.split(ln) for ln in lines if ln.startswith(("atc ", "aoe "))]


def test_scripts_name_graphs_and_files_that_exist_and_fit(tmp_path):
    float_model = TinyAttention()
    model = copy.deepcopy(float_model)
    quantize(model, {"*": "w8a8"}, forward_loop_for(model))
    x = model.example_inputs(seed=5)
    policy = PrecisionPolicy.from_yaml(POLICY).resolved(modules_from_model(float_model))
    out = tmp_path / "atc"
    notes = write_atc(model, float_model, [""], {"": [(x, {})]}, policy, out)
    assert notes == []
    script = (out / "model.sh").read_text()
    assert (
        script.startswith("#!/bin/sh\n") and 'SOC_VERSION="${SOC_VERSION:-Ascend910B3}"' in script
    )
    commands = _commands(script)
    assert [c[0] for c in commands] == ["atc", "atc", "aoe", "aoe"]
    for cmd in commands:
        (check_atc if cmd[0] == "atc" else check_aoe)(cmd)
        flags = dict(a[2:].split("=", 1) for a in cmd[1:])
        graph = onnx.load(str(out / flags["model"]))
        names = {n.name for n in graph.graph.node}
        # ATC fails on a --keep_dtype name that is not in the graph (E10042)
        listed = (out / flags["keep_dtype"]).read_text().split()
        assert listed and set(listed) <= names
        assert any(n.endswith("LayerNormalization") for n in listed)
        shapes = dict(s.split(":") for s in flags["input_shape"].split(";"))
        assert shapes == {"input_0": ",".join(map(str, x[0].shape))}
        assert [i.name for i in graph.graph.input] == ["input_0"]
    with torch.no_grad():
        want_float, want_int8 = float_model(*x).numpy(), model(*x).numpy()
    for graph, want, tol in (("model.onnx", want_float, 1e-5), ("model.qdq.onnx", want_int8, 2e-2)):
        got = onnxruntime_session(str(out / graph)).run(None, {"input_0": x[0].numpy()})[0]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < tol, graph
