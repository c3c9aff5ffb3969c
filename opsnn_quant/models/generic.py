"""``generic`` adapter: any ``nn.Module`` with a user mapping of prefixes and a user forward loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.types import ForwardLoop, Modality


class GenericAdapter(ModelAdapter):
    """Wraps a user model (Python API only).

    Args:
        model: the model.
        modalities: module-name prefix -> modality (``{"": "denoiser"}`` for a one-modality model).
        forward_loop: the calibration loop; ``forward_loop(data, limit)`` returns it as is.
        roots: per modality, the module (or modules) whose output counts as final (default:
            the shortest prefix of that modality, or the whole model for ``""``).
        generate_fn: optional ``(model, inputs, seed) -> outputs`` for evaluation.
        model_id: a name for artifacts.
    """

    family = "generic"

    def __init__(
        self,
        model: nn.Module,
        modalities: dict[str, Modality | str],
        forward_loop: ForwardLoop,
        *,
        roots: dict[Modality | str, str | Sequence[str]] | None = None,
        generate_fn: Callable[[nn.Module, Sequence[Any], int], list[Any]] | None = None,
        model_id: str = "generic",
    ) -> None:
        self.model = model
        self.model_id = model_id
        try:
            self._modalities = {p: Modality(m) for p, m in modalities.items()}
        except ValueError as exc:
            raise ConfigError(f"unknown modality in mapping: {exc}") from exc
        self._loop = forward_loop
        self._generate = generate_fn
        given = {
            Modality(k): [v] if isinstance(v, str) else list(v) for k, v in (roots or {}).items()
        }
        stray = sorted(m.value for m in given if m not in self._modalities.values())
        if stray:
            raise ConfigError(f"roots given for modalities the mapping lacks: {', '.join(stray)}")
        self._roots: dict[str, Modality] = {}
        for modality in dict.fromkeys(self._modalities.values()):  # mapping order: deterministic
            if modality in given:
                self._roots.update(dict.fromkeys(given[modality], modality))
            else:
                prefixes = [p for p, m in self._modalities.items() if m == modality]
                self._roots[min(prefixes, key=len)] = modality
        self.check_prefixes()

    def modalities(self) -> dict[str, Modality]:
        """See :meth:`ModelAdapter.modalities`."""
        return dict(self._modalities)

    def roots(self) -> dict[str, Modality]:
        """See :meth:`ModelAdapter.roots`."""
        return dict(self._roots)

    def forward_loop(
        self, data: Sequence[Any] = (), limit: int | None = None, first_batch: int = 0
    ) -> ForwardLoop:
        """The user's loop (``data``/``limit``/``first_batch`` are the user's business)."""
        return self._loop

    def generate(self, inputs: Sequence[Any], seed: int = 0) -> list[Any]:
        """The user's ``generate_fn``."""
        if self._generate is None:
            raise ConfigError("this generic model has no generate_fn; pass one to GenericAdapter")
        return self._generate(self.model, inputs, seed)
