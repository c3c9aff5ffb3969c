"""Compact rules resolve every module exactly as one rule per module does (PrecisionPolicy.resolve),
on hand-built reports, seeded random ones and a real probe of a tiny Stable Diffusion pipeline.
"""

from __future__ import annotations

import random

import pytest

from opsnn_quant.policy._compress import plan_rules
from opsnn_quant.policy.budget import Budget, ModalityLimit
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import SensitivityReport
from opsnn_quant.types import Modality

from ._factory import linear, other, overflow_stats, report

SCHEMES = ("w8a8", "w8a8_mse", "w8a8_smoothquant", "w8a8_dynamic", "w8a8_dynamic_smoothquant")


def _resolution(policy: PrecisionPolicy, types: dict[str, str]) -> dict[str, tuple]:
    return {
        name: (policy.spec_of(res), res.rule == "unassigned")
        for name, res in policy.resolve(list(types), types).items()
    }


def _with_containers(rep: SensitivityReport) -> dict[str, str]:
    """The report's inventory plus what a real model also has: every dotted ancestor (a
    container) and a Dropout beside each module, none of them in the report."""
    types: dict[str, str] = {}
    for m in rep.modules:
        parts = m.name.split(".")
        for depth in range(1, len(parts)):
            types.setdefault(".".join(parts[:depth]), "ModuleList")
        types[m.name] = m.type
        types.setdefault(f"{m.name}_dropout", "Dropout")
    return types


def assert_same_resolution(rep: SensitivityReport, **kwargs) -> tuple[PrecisionPolicy, ...]:
    compact = build_policy(rep, **kwargs)
    single = build_policy(rep, compact=False, **kwargs)
    report_types = {m.name: m.type for m in rep.modules}
    for types in (report_types, _with_containers(rep)):
        assert _resolution(compact, types) == _resolution(single, types)
    compact.check_rules(list(report_types), report_types)  # every rule still matches a module
    assert len(compact.rules) <= len(single.rules)
    assert build_policy(rep, **kwargs).to_yaml() == compact.to_yaml()  # deterministic
    return compact, single


def test_plan_rules_is_minimal_on_a_hand_checked_tree():
    names = ["a.x", "a.y", "a.z", "b.x", "b.y"]
    labels = {"a.x": "A", "a.y": "A", "a.z": "B", "b.x": "A", "b.y": "C"}
    plan = plan_rules(names, labels, lambda node, label: True)
    # '*' = A covers a.x, a.y, b.x; a.z and b.y are the exceptions: 3 rules, not 5.
    assert [(p.match, p.label, p.decides) for p in plan] == [
        ("a.z", "B", ["a.z"]),
        ("b.y", "C", ["b.y"]),
        ("*", "A", ["a.x", "a.y", "b.x"]),
    ]
    # No glob at the root allowed: one per subtree where it pays off.
    plan = plan_rules(names, labels, lambda node, label: node != "")
    assert [p.match for p in plan] == ["a.z", "b.x", "b.y", "a.*"]


def test_never_ran_modules_merge_into_one_rule_with_a_true_reason():
    idle = [
        linear(f"vae.encoder.down.{i}.conv", 1e-6, type_="Conv2d", modality="other").model_copy(
            update={"calls": 0, "e2e": None}
        )
        for i in range(5)
    ]
    rep = report(
        *idle,
        other("vae.encoder.down.0.norm", "GroupNorm", modality="other"),
        linear("unet.a", 1e-5),
        linear("unet.b", 1e-5),
    )
    compact, _ = assert_same_resolution(rep, target=get_target("ascend910b-atc"))
    (rule,) = [r for r in compact.rules if r.precision.is_float]
    assert rule.match == "vae.encoder.down.*"  # ties go to the deepest glob, the most precise
    assert rule.reason == "stays float: never ran in the calibration forward_loop (5 modules)"


def test_pins_stay_one_exact_rule_each():
    rep = report(
        other("te.l0.norm", "LayerNorm", modality="text_encoder", **overflow_stats(0.5)),
        other("te.l1.norm", "LayerNorm", modality="text_encoder", **overflow_stats(0.5)),
        linear("te.l0.fc", 1e-5, modality="text_encoder"),
        linear("te.l1.fc", 1e-5, modality="text_encoder"),
    )
    compact, _ = assert_same_resolution(rep, target=get_target("ascend310p"))
    assert [r.match for r in compact.rules] == ["te.l0.norm", "te.l1.norm", "te.*"]


def test_names_with_glob_metacharacters():
    rep = report(
        linear("blk[0].fc*", 1e-5),
        linear("blk[0].fc?", 1e-5, sqnr={"w8a8": 30.0, "w8a8_mse": 33.0}),
        linear("blk[1].fc*", 1e-5),
        other("blk[1].norm", "LayerNorm"),
    )
    assert_same_resolution(rep, target=get_target("ascend910b-atc"))


def _random_report(seed: int) -> SensitivityReport:
    rnd = random.Random(seed)
    roots = {"te": "text_encoder", "unet": "denoiser", "vae": "image_decoder"}
    modules = []
    for root, modality in list(roots.items())[: rnd.randint(1, 3)]:
        for block in range(rnd.randint(1, 3)):
            for sub in range(rnd.randint(1, 3)):
                prefix = f"{root}.blocks.{block}.sub.{sub}"
                if rnd.random() < 0.2:
                    modules.append(
                        other(f"{prefix}.norm", "LayerNorm", modality=modality, **overflow_stats())
                    )
                else:
                    modules.append(other(f"{prefix}.norm", "LayerNorm", modality=modality))
                for leaf in ("q", "k", "v", "out", "conv"):
                    if rnd.random() < 0.3:
                        continue
                    type_ = "Conv2d" if leaf == "conv" else "Linear"
                    schemes = [s for s in SCHEMES if type_ == "Linear" or "smooth" not in s]
                    sqnr = {s: rnd.choice([28.0, 30.0, 33.0, 36.0]) for s in schemes}
                    m = linear(
                        f"{prefix}.{leaf}",
                        rnd.choice([1e-6, 1e-5, 1e-4, 3e-3]),
                        type_=type_,
                        modality=modality,
                        sqnr=sqnr,
                        alpha=rnd.choice([0.5, 0.8]),
                        macs=rnd.choice([1000, 100_000]),
                    )
                    if rnd.random() < 0.1:
                        m = m.model_copy(update={"calls": 0, "e2e": None})
                    modules.append(m)
    return report(*modules)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("target", ["ascend910b-atc", "ascend910b-eager", "cpu-reference"])
def test_random_reports_resolve_identically(seed, target):
    rep = _random_report(seed)
    budget = Budget(
        limits={Modality("denoiser"): ModalityLimit(min_sqnr_db=30.0)}, min_int8_mac_share=0.2
    )
    assert_same_resolution(rep, budget=budget, target=get_target(target))


@pytest.mark.slow
def test_a_real_probe_of_a_tiny_sd_pipeline(tmp_path):
    pytest.importorskip("diffusers")
    from opsnn_quant.formats.policy_files import modules_from_model
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.probe.api import ProbeConfig, probe
    from tests.tiny_pipelines import save_tiny_sd

    save_tiny_sd(tmp_path / "pipe")
    (tmp_path / "prompts.txt").write_text("a red circle\na blue square\n")
    adapter = load_adapter("diffusers-sd", str(tmp_path / "pipe"), steps=2, batch_size=2)
    data = load_records(str(tmp_path / "prompts.txt"), None)
    rep = probe(adapter, adapter.forward_loop(data), ProbeConfig(max_root_calls=2))
    budget = Budget(limits={Modality("denoiser"): ModalityLimit(min_sqnr_db=20.0)})
    compact, single = assert_same_resolution(
        rep, budget=budget, target=get_target("ascend910b-atc")
    )
    inventory = modules_from_model(adapter.model)  # every module of the real model
    assert _resolution(compact, inventory) == _resolution(single, inventory)
    assert compact.resolved_for(adapter.model) is not None


def test_a_compaction_that_changes_a_resolution_is_refused(monkeypatch):
    from opsnn_quant.policy import _rules

    real = _rules.compact_rules
    monkeypatch.setattr(_rules, "compact_rules", lambda *a: real(*a)[1:])  # drop one rule
    rep = report(linear("a", 1e-5), linear("b", 1e-5, sqnr={"w8a8": 30.0, "w8a8_mse": 33.0}))
    with pytest.raises(RuntimeError, match="compact rules resolve"):
        build_policy(rep, target=get_target("ascend910b-atc"))


def test_module_rows_keep_the_per_module_detail_of_a_compact_policy():
    from opsnn_quant.policy.summary import module_rows

    rep = report(
        linear("unet.a", 1e-5, sqnr={"w8a8": 30.0, "w8a8_mse": 31.5}),
        linear("unet.b", 2e-5, sqnr={"w8a8": 33.0, "w8a8_mse": 34.0}),
        linear("unet.c", 3e-5),
        other("unet.norm", "LayerNorm"),
    )
    policy = build_policy(rep, target=get_target("ascend910b-atc"))
    rows = {r.name: r for r in module_rows(policy.resolved(rep.inventory()), rep)}
    assert list(rows) == [m.name for m in rep.modules]
    assert rows["unet.a"].match == rows["unet.b"].match == "unet.*"  # one glob decides both
    assert rows["unet.a"].spec.observer == "mse" and rows["unet.a"].local_sqnr_db == 31.5
    assert rows["unet.b"].local_sqnr_db == 34.0 and rows["unet.b"].contribution == 2e-5
    assert rows["unet.c"].match == "unet.c" and rows["unet.c"].local_sqnr_db == 30.0
    assert rows["unet.norm"].rule == "default" and rows["unet.norm"].spec is None
