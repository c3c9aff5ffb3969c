"""``policy build``: a policy from an earlier probe under another budget or target.

The probe is the expensive part of a run; the policy is cheap to decide again. A budget with
``metric`` measures candidates on the model, which this command does not run: that is
``calibrate --from-probe``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from opsnn_quant.core.readers import read_text
from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.calibrate_output import probe_report_file
from opsnn_quant.output.loose import check_output_file, write_output_file
from opsnn_quant.policy.budget import Budget
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import Target, get_target
from opsnn_quant.probe.report import SensitivityReport

POLICY_KIND = "policy"  # the ledger's kind of a policy file `policy build` writes


def parse_budget(text: str) -> Budget:
    """A budget from a YAML file's path or inline YAML.

    Raises:
        ConfigError: unreadable or invalid (the field named), or a ``metric`` budget.
    """
    source = Path(text)
    raw = read_text(source) if text.endswith((".yaml", ".yml")) else text
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--budget is not YAML: {str(exc).splitlines()[0]}") from exc
    try:
        budget = Budget.model_validate(data or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"--budget {where}: {err['msg']}") from exc
    if budget.metric is not None:
        raise ConfigError(
            "--budget metric: a metric budget measures candidates on the model; use "
            "`calibrate RECIPE --from-probe OUT` for it"
        )
    return budget


def build_from_probe(
    probe: Path, target: str, budget: str, out: Path, *, force: bool = False
) -> PrecisionPolicy:
    """Decide the policy of ``probe``'s report for ``target`` under ``budget`` and write it.

    Raises:
        ConfigError: a missing/invalid report, target or budget, a report that did not measure
            what the target runs (:func:`check_probe_serves`).
        OutputError: ``out`` exists and is not a policy opsnn-quant wrote there (a policy it
            wrote and that was changed since: unless ``force``).
    """
    file = probe_report_file(probe)
    report = SensitivityReport.load(file)
    tgt, parsed = get_target(target), parse_budget(budget)
    check_probe_serves(report, tgt, file)
    # replaced only when opsnn-quant wrote it (the ledger beside it), never a user's policy
    check_output_file(out, POLICY_KIND, force=force, inputs=[file])
    policy = build_policy(report, parsed, tgt)
    write_output_file(out, policy.to_yaml(), POLICY_KIND, force=force)
    return policy


def _arithmetic(engine: object, dtype: object, folded: object) -> str:
    """An engine's arithmetic in words, for a message."""
    return f"{engine}'s ({dtype or 'the model dtype'}" + (
        ", SmoothQuant folded)" if folded else ")"
    )


def check_probe_serves(report: SensitivityReport, target: Target, file: Path) -> None:
    """Refuse a probe report that cannot decide for ``target``: one measured in another
    engine's arithmetic (its dtype, SmoothQuant folded into the norms or not: the errors it
    holds are not ``target``'s) or that did not measure every scheme ``target`` runs on the
    module types the model has (a probe for one target measures that target's only). A probe
    of every scheme in the reference arithmetic (``probe MODEL``) serves every target that
    computes so.

    Raises:
        ConfigError: what the probe lacks, and how to get one that serves.
    """
    cfg, wanted = report.config, target.probe_config()
    reasons = []
    keys = ("engine", "engine_dtype", "fold_smoothing")
    if any(k in cfg and cfg[k] != getattr(wanted, k) for k in keys):
        had = _arithmetic(*(cfg.get(k, getattr(wanted, k)) for k in keys))
        reasons.append(
            f"it measured the errors of {had} arithmetic, {target.name} computes "
            f"{_arithmetic(*(getattr(wanted, k) for k in keys))}"
        )
    measured, per_type = cfg.get("schemes"), cfg.get("type_schemes") or {}
    present = {m.type for m in report.modules}
    missing = []
    for kind, runs in sorted((wanted.type_schemes or {}).items()):
        lacking = [s for s in runs if kind in present and (
            (measured is not None and s not in measured) or (per_type and s not in per_type.get(kind, ()))
        )]  # fmt: skip
        if lacking:
            missing.append(f"{', '.join(lacking)} on {kind}")
    if missing:
        reasons.append(f"it did not measure {' or '.join(missing)}, which {target.name} runs")
    if reasons:
        raise ConfigError(
            f"{file} cannot decide a policy for {target.name}: {'; '.join(reasons)}; probe for "
            f"it: `opsnn-quant calibrate RECIPE --target {target.name} --strategy search` (its "
            "probe.json serves later policy builds for that target)"
        )
