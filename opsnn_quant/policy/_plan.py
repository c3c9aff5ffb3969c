"""``ModalityPlan``: what the search decided for one modality, the rule emitter's input."""

from __future__ import annotations

from dataclasses import dataclass, field

from opsnn_quant.policy._schemes import Choice
from opsnn_quant.types import Modality, Precision


@dataclass
class ModalityPlan:
    """What the search decided for one modality (input to the rule emitter).

    Attributes:
        modality: the modality.
        int8: module name -> the chosen scheme, in model order.
        fallback: quantizable module name -> why it stays fp16.
        noise: predicted relative noise energy of the modality output (first order).
        mac_share: share of the modality's MACs in int8.
        chosen: ``int8`` or ``fp16``.
        note: the decision in words.
    """

    modality: Modality
    int8: dict[str, Choice] = field(default_factory=dict)
    fallback: dict[str, str] = field(default_factory=dict)
    noise: float = 0.0
    mac_share: float = 0.0
    chosen: str = "fp16"
    note: str = ""


@dataclass(frozen=True)
class Fixed:
    """A modality decided without the probe's estimators: one naive full-coverage baseline
    (:data:`~opsnn_quant.policy.baselines.NAIVE_INT8`), every module the target runs in
    ``precision`` (and, with ``attention``, every attention module it runs in int8 attention),
    because a measurement showed it meets the budget (see :mod:`opsnn_quant.policy.first`).

    Attributes:
        strategy: the baseline's name (``all-w8a8-minmax``...).
        precision: the Linear/Conv2d precision.
        attention: attention modules go ``a8`` too.
        reason: the measurement that decided it, in words (each int8 rule's reason).
        measured_sqnr_db: the modality's measured output SQNR under the baseline (None: not
            measured, e.g. the modality stays float).
    """

    strategy: str
    precision: Precision
    attention: bool
    reason: str
    measured_sqnr_db: float | None = None
