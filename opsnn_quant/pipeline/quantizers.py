"""The quantizer table: who quantizes the model in a ``calibrate`` (``--engine``), one
:class:`Quantizer` each. Not the serving engine a target names (the engine table,
:mod:`opsnn_quant.quant.engines`): ``opsnn`` is this package (the Ascend operators' exact
arithmetic, writing ``quant/``), ``amct`` CANN's AMCT, handed the policy (writing ``amct/``).

The run resolves the name once (:func:`opsnn_quant.pipeline.run.resolve_run`); the phases read
the fields. AMCT's code is named ``"module:function"`` and imported only when it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opsnn_quant.errors import ConfigError


@dataclass(frozen=True)
class Quantizer:
    """Who quantizes the model.

    Attributes:
        name: the ``--engine`` value.
        who: who writes the quantized model, for messages.
        ours: it writes this package's ``quant/``: held-out SQNR, ``--evaluate``, the model
            exports and ``budget.metric``'s measured candidates are of that model.
        offloaded: why it cannot run an offloaded model (``--max-memory``); None: it can.
        available: ``"module:function"`` that raises ``MissingDependencyError`` when it is
            not installed (empty: always available).
        hand_off: ``"module:function"``, ``(adapter, policy, forward loop, directory)``: it
            quantizes the model itself into ``OUT/<name>/`` (empty: this package's
            ``quantize``).
    """

    name: str
    who: str
    ours: bool
    offloaded: str | None = None
    available: str = ""
    hand_off: str = ""

    def check_available(self) -> None:
        """Raise ``MissingDependencyError`` when it is not installed."""
        if self.available:
            _resolve(self.available)()

    def run_hand_off(self, *args: Any) -> Any:
        """Quantize with it (see :attr:`hand_off`)."""
        return _resolve(self.hand_off)(*args)


def _resolve(name: str) -> Callable[..., Any]:
    module, _, func = name.partition(":")
    handler: Callable[..., Any] = getattr(importlib.import_module(module), func)
    return handler


QUANTIZERS: dict[str, Quantizer] = {
    q.name: q
    for q in (
        Quantizer("opsnn", "opsnn-quant", ours=True),
        Quantizer(
            "amct",
            "AMCT",
            ours=False,
            offloaded="runs the model in AMCT, which does not run an offloaded model",
            # AMCT ships with CANN and may simply not be here
            available="opsnn_quant.amct.run:import_amct",
            hand_off="opsnn_quant.amct.handoff:run_amct_roots",
        ),
    )
}


def get_quantizer(name: str) -> Quantizer:
    """The quantizer ``--engine NAME`` names.

    Raises:
        ConfigError: an unknown name.
    """
    try:
        return QUANTIZERS[name]
    except KeyError:
        raise ConfigError(f"--engine must be {' or '.join(QUANTIZERS)}, got {name!r}") from None
