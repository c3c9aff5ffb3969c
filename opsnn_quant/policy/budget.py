"""``Budget``: how much error each modality may take, and the optional final check.

The limits are on a modality's final output (e.g. the UNet's noise prediction), as predicted from
the probe's end-to-end attribution. A cosine limit is turned into a noise limit with the
uncorrelated-noise relation ``cos = 1 / sqrt(1 + r)``, where ``r`` is the relative noise energy
``||dy||^2 / ||y||^2``; an SQNR limit is ``r <= 10 ** (-sqnr / 10)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field, field_validator

from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.core.user_config import StrictModel
from opsnn_quant.types import Modality

# No NaN or infinity in a limit: a NaN floor compares false with everything and passes every
# check; "no limit" is a field left out.
_Frozen = StrictModel


class ModalityLimit(_Frozen):
    """Accuracy floor of one modality's output (either or both; None = no limit).

    Attributes:
        min_sqnr_db: minimum predicted SQNR of the modality output vs fp32, in dB.
        min_cosine: minimum predicted cosine similarity of the modality output vs fp32.
    """

    min_sqnr_db: float | None = None
    min_cosine: float | None = Field(default=None, gt=0.0, le=1.0)

    def max_noise(self) -> float:
        """The largest relative noise energy the limits allow (``inf`` without limits)."""
        bounds = [math.inf]
        if self.min_sqnr_db is not None:
            bounds.append(10.0 ** (-self.min_sqnr_db / 10.0))
        if self.min_cosine is not None:
            bounds.append(1.0 / self.min_cosine**2 - 1.0)
        return min(bounds)

    def describe(self) -> str:
        """The limits in words, e.g. ``>= 30 dB, cos >= 0.999``."""
        parts = []
        if self.min_sqnr_db is not None:
            parts.append(f">= {self.min_sqnr_db:g} dB")
        if self.min_cosine is not None:
            parts.append(f"cos >= {self.min_cosine:g}")
        return ", ".join(parts) or "no limit"


class FinalCheckSettings(_Frozen):
    """How the optional end-to-end check is judged and retried.

    Attributes:
        metric: the evaluator's metric name (e.g. ``clip_score``, ``wer``).
        max_delta: largest allowed degradation of that metric vs the float baseline.
        max_iterations: failed checks after which failing modalities go fully fp16.
        tighten_db: how much each failed check tightens a failing modality's noise cap.
    """

    metric: str
    max_delta: float
    max_iterations: int = Field(default=3, ge=0, le=20)
    tighten_db: float = Field(default=3.0, gt=0.0)


# Measurements a measured search spends when the budget does not say.
DEFAULT_MAX_EVALUATIONS = 8


class MetricBudget(Thresholds):
    """A budget in the user's terms: bounds on a suite's metrics (the suite's threshold names,
    e.g. ``wer_delta_max_points: 0.5``), measured on a slice of the suite's data that its own
    acceptance samples do not include (see :mod:`opsnn_quant.policy.front`). The metric table
    (:mod:`opsnn_quant.evaluation.registry`) checks the bounds: a recipe's when it is read, the
    suite's task's when a run starts.

    Attributes:
        suite: the acceptance suite (built-in name or file) whose generation settings and
            metrics measure each candidate (and whose data, unless ``data`` is given).
        data: another data source for the slice (a calibration-data source, e.g.
            ``zoo:speech/train``), so that a suite with few records keeps them for acceptance;
            left out: the suite's ``data.tuning`` if it names one (``whisper-tiny-en``: its
            512 eval-large utterances are all its own), else the suite's data.
        samples: records in the slice.
        start: its first record; left out: 0 in ``data`` (or the suite's tuning data), else
            right after the suite's own ``samples``, so that the acceptance run judges data the
            search never tuned on.
    """

    suite: str = Field(min_length=1)
    data: str | None = Field(default=None, min_length=1)
    samples: int = Field(default=32, gt=0)
    start: int | None = Field(default=None, ge=0)


class Budget(_Frozen):
    """What the search may spend.

    Attributes:
        limits: per-modality accuracy floors.
        default: the floor of modalities not in ``limits`` (None = no limit).
        min_int8_mac_share: a modality whose int8 modules would cover less than this share of its
            MACs stays fp16 as a whole (the speed-up would not pay for the risk).
        final_check: settings of the end-to-end check hook (see ``build_policy``).
        metric: bounds on the real metric: the policy is chosen by measuring candidates
            (``calibrate``'s measured search); the limits then only shape the estimate's
            own proposal.
        max_evaluations: measurements the measured search may spend (None:
            :data:`DEFAULT_MAX_EVALUATIONS`).
    """

    limits: dict[Modality, ModalityLimit] = Field(default_factory=dict)
    default: ModalityLimit | None = None
    min_int8_mac_share: float = Field(default=0.5, ge=0.0, le=1.0)
    final_check: FinalCheckSettings | None = None
    metric: MetricBudget | None = None
    max_evaluations: int | None = Field(default=None, ge=1, le=100)

    @field_validator("limits", mode="before")
    @classmethod
    def _plain_keys(cls, v: object) -> object:
        # Accept Modality members and their string values alike.
        if isinstance(v, dict):
            return {str(getattr(k, "value", k)): val for k, val in v.items()}
        return v

    def limit_for(self, modality: Modality | str) -> ModalityLimit:
        """The floor that applies to ``modality`` (an empty one when there is none)."""
        return self.limits.get(Modality(modality)) or self.default or ModalityLimit()


@dataclass(frozen=True)
class FinalCheckResult:
    """What an end-to-end check (the evaluator) says about a candidate policy.

    Attributes:
        passed: the candidate is acceptable.
        metric: metric name.
        value: the candidate's metric value.
        delta: degradation vs the baseline.
        modalities: the modalities to blame (empty = every int8 modality).
        detail: one line for the log and the policy notes.
    """

    passed: bool
    metric: str = ""
    value: float | None = None
    delta: float | None = None
    modalities: tuple[Modality, ...] = ()
    detail: str = ""
