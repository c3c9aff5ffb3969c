"""Judged backends per target, the criterion's note, and what each --latency mode times."""

from __future__ import annotations

import pytest

from opsnn_quant.errors import ConfigError, InputError
from opsnn_quant.evaluation.gate import (
    check_latency_mode,
    judged_backends,
    latency_note,
    pick_source,
    plan_latency,
)
from opsnn_quant.evaluation.suite import load_suite, parse_suite
from opsnn_quant.policy.targets import get_target


def suite(latency=None, **thresholds):
    return parse_suite({
        "name": "s", "task": "t2i", "data": {"dataset": "shapes", "samples": 4},
        "metrics": {"fid_features": None, "thresholds": thresholds}, "latency": latency or {},
    })  # fmt: skip


def test_judged_backends_per_target():
    for ascend in ("ascend910b-eager", "ascend910b-atc", "ascend310p"):
        assert judged_backends(get_target(ascend)) == {"npu"}
    assert judged_backends(get_target("cpu-reference")) == {"cpu", "cpu-onnxruntime"}
    assert judged_backends(None) == frozenset()
    # The suite can narrow the target's set, never widen it.
    assert judged_backends(get_target("cpu-reference"), ["cpu-onnxruntime", "npu"]) == {
        "cpu-onnxruntime"
    }
    assert judged_backends(get_target("ascend910b-atc"), ["cpu-onnxruntime"]) == frozenset()
    with pytest.raises(ConfigError, match="unknown target 'tpu-v5'"):
        get_target("tpu-v5")  # the name fails where it enters, before any gate reads it


def test_latency_note_wording():
    npu = frozenset({"npu"})
    assert latency_note("npu", get_target("ascend910b-atc"), npu) == (
        "judged on npu: the policy targets ascend910b-atc"
    )
    assert latency_note("cpu-onnxruntime", get_target("ascend910b-atc"), npu) == (
        "not judged on cpu-onnxruntime: the policy targets ascend910b-atc (judged on npu)"
    )
    assert "no deployment target is known" in latency_note("npu", None, frozenset())


def test_pick_source_prefers_judged_then_onnxruntime():
    cpu = [("onnxruntime", "cpu-onnxruntime"), ("eager", "cpu-reference")]
    assert pick_source(cpu, frozenset({"npu"})) == 0  # neither judged: ORT is the better stand-in
    assert pick_source(cpu, frozenset({"cpu-onnxruntime"})) == 0
    npu = [("onnxruntime", "cpu-onnxruntime"), ("eager", "npu")]
    assert pick_source(npu, frozenset({"npu"})) == 1
    assert pick_source([("eager", "cpu")], frozenset()) == 0
    assert pick_source([], frozenset({"npu"})) is None


def test_check_latency_mode():
    assert [check_latency_mode(m) for m in ("none", "target", "all")] == ["none", "target", "all"]
    with pytest.raises(InputError, match="--latency must be one of none, target, all, got 'bogus'"):
        check_latency_mode("bogus")


def _plan(s, mode, target="ascend910b-atc", candidate="cpu-reference", int8=True):
    return plan_latency(s, mode, target=get_target(target), baseline_backend="cpu",
                        candidate_backend=candidate, onnx_possible=int8)  # fmt: skip


def test_demo_suite_on_cpu_times_nothing_its_npu_target_does_not_judge():
    # Issue 43: the criterion reads the ONNX Runtime figure, NOT JUDGED for an Ascend target on
    # a CPU: under the default mode nothing is timed for it, and the report says why.
    demo = load_suite("shapes-t2i")
    p = _plan(demo, "target")
    assert (p.source, p.backend) == ("onnxruntime", "cpu-onnxruntime")
    assert (p.eager, p.onnx, p.profile, p.stability) == (False, False, False, False)
    assert p.judged == {"npu"}
    why = (
        "not judged on cpu-onnxruntime: the policy targets ascend910b-atc (judged on npu) "
        "(--latency all measures it)"
    )
    assert p.skipped == (
        f"eager timing of baseline (cpu) and candidate (cpu-reference): {why}",
        f"stages and top-10 module profile: {why}",
        f"ONNX Runtime speed figure (cpu-onnxruntime): {why}",
    )
    # a CPU deployment judges that figure: it is timed, and only it
    cpu = _plan(demo, "target", target="cpu-reference")
    assert (cpu.eager, cpu.onnx, cpu.profile, cpu.stability) == (False, True, False, False)
    assert cpu.skipped[0].endswith(
        "no criterion uses it (--latency target; --latency all measures it)"
    )
    everything = _plan(demo, "all")
    assert (everything.eager, everything.onnx, everything.profile) == (True, True, True)
    assert everything.skipped == () and everything.backend == "cpu-onnxruntime"
    nothing = _plan(demo, "none")
    assert (nothing.eager, nothing.onnx, nothing.profile) == (False, False, False)
    assert nothing.backend == "cpu-onnxruntime"  # where the criterion would have been measured
    assert nothing.skipped[-1] == "ONNX Runtime speed figure (cpu-onnxruntime): --latency none"


def test_target_mode_on_the_device_times_eagerly_with_profile_and_stability():
    s = suite({"onnx_speed": True, "profile_top": 5, "stability_k": 4}, latency_p99_ratio_max=1.0)
    p = _plan(s, "target", candidate="npu")
    assert (p.source, p.backend) == ("eager", "npu")
    assert (p.eager, p.onnx, p.profile, p.stability) == (True, False, True, True)
    assert p.skipped == (
        "ONNX Runtime speed figure (cpu-onnxruntime): no criterion uses it (--latency target; "
        "--latency all measures it)",
    )


def test_no_latency_criterion_times_nothing_by_default():
    s = suite({"onnx_speed": True, "profile_top": 0}, psnr_min=20.0)
    p = _plan(s, "target")
    assert p.source is None and p.backend is None
    assert (p.eager, p.onnx) == (False, False) and len(p.skipped) == 2
    assert _plan(s, "all").eager and _plan(s, "all").onnx


def test_float_candidate_has_no_onnx_figure():
    s = suite({"onnx_speed": True}, memory_ratio_max=1.0)
    p = _plan(s, "target", target="cpu-reference", candidate="cpu", int8=False)
    assert (p.source, p.backend, p.eager, p.onnx) == ("eager", "cpu", True, False)
    assert p.judged == {"cpu", "cpu-onnxruntime"}
