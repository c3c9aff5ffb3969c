"""``policy build``: a policy from an earlier probe under another budget or target.

The probe is the expensive part of a run; the policy is cheap to decide again. A budget with
``metric`` measures candidates on the model, which this command does not run: that is
``calibrate --from-probe``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.calibrate_output import PROBE_FILE
from opsnn_quant.io import atomic_write_text, read_text
from opsnn_quant.policy.budget import Budget
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.policy.search import build_policy
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import SensitivityReport


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
        ConfigError: a missing/invalid report, target or budget; ``out`` exists and is not a
            policy (unless ``force``).
    """
    file = probe / PROBE_FILE if probe.is_dir() else probe
    if not file.is_file():
        raise ConfigError(
            f"{probe}: no probe report there (a probe or calibrate output, or its {PROBE_FILE})"
        )
    report = SensitivityReport.load(file)
    tgt, parsed = get_target(target), parse_budget(budget)
    if out.exists() and not force:
        try:
            PrecisionPolicy.load(out)
        except ConfigError as exc:
            raise ConfigError(f"{out} exists and is not a policy file; pass --force") from exc
    policy = build_policy(report, parsed, tgt)
    atomic_write_text(out, policy.to_yaml())
    return policy
