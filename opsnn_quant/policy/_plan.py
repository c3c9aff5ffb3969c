"""``ModalityPlan``: what the search decided for one modality, the rule emitter's input."""

from __future__ import annotations

from dataclasses import dataclass, field

from opsnn_quant.policy._schemes import Choice
from opsnn_quant.types import Modality


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
