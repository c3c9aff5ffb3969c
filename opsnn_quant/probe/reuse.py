"""An earlier probe taken instead of probing again (``calibrate --from-probe``): only when it was
made with the same configuration on the same model family, model and data.

The model and the data are compared by their fingerprints (:mod:`opsnn_quant.core.fingerprint`),
the configuration field by field, as the report records it (its JSON form).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from opsnn_quant.core.fingerprint import differences
from opsnn_quant.errors import ConfigError
from opsnn_quant.probe.config import ProbeConfig
from opsnn_quant.probe.report import SensitivityReport


def reusable_report(
    file: Path,
    config: ProbeConfig,
    family: str,
    inputs: dict[str, str],
    *,
    needs_estimates: bool,
    staged: ProbeConfig | None = None,
) -> SensitivityReport:
    """The probe report ``file`` when it was made with ``config`` on a ``family`` model whose
    model and data have the fingerprints ``inputs``
    (:func:`~opsnn_quant.core.fingerprint.probe_inputs`).

    Args:
        file: the report (``probe.json``).
        config: the configuration this run would probe with.
        family: this run's model family.
        inputs: this run's model and data fingerprints.
        needs_estimates: the decision may read the estimators' figures (a search): a report of
            pass 1 alone is refused.
        staged: pass 1's configuration where this run stages its probe (decides first): a
            report of pass 1 alone made with it is this run's too.

    Raises:
        ConfigError: a report of pass 1 alone where estimates are needed, or one made with
            other settings, on another model or other data.
    """
    report = SensitivityReport.load(file)
    if report.not_estimated is not None and needs_estimates:
        raise ConfigError(
            f"--from-probe {file}: that probe ran pass 1 alone ({report.not_estimated}); a "
            "search may need its estimates: rerun without --from-probe"
        )
    if report.not_estimated is not None and staged is not None:
        config = staged  # what pass 1 ran with
    wanted = {"family": family, **json.loads(json.dumps(dataclasses.asdict(config)))}
    changed = sorted(k for k in set(wanted) | set(report.config)
                     if report.config.get(k) != wanted.get(k))  # fmt: skip
    if changed:
        raise ConfigError(
            f"--from-probe {file}: the probe ran with other settings ({', '.join(changed)}); "
            "rerun without --from-probe"
        )
    other = differences(report.inputs, inputs)
    if other:
        raise ConfigError(
            f"--from-probe {file}: the probe ran on another {' and '.join(other)} than this run's "
            "(fingerprints differ); rerun without --from-probe"
        )
    return report
