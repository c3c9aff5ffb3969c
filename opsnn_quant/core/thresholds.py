"""``Thresholds``: bounds on a quantized model's figures against its float baseline.

One schema for two uses: an acceptance suite's thresholds
(:class:`opsnn_quant.evaluation.suite.Suite`) and the bounds a measured policy search holds its
candidates to (:class:`opsnn_quant.policy.budget.MetricBudget`). A leaf, so that both can name
it: it holds ``bound name -> value`` pairs and knows no name. Which names exist, the task each
applies to and the values each may take are the metric table's
(:mod:`opsnn_quant.evaluation.registry`), checked where the table is read: a suite's validation,
a recipe's ``budget.metric``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from opsnn_quant.core.user_config import StrictModel


class Thresholds(StrictModel):
    """Bounds on a candidate's figures: a metric's bound name (``psnr_min``) -> its value, a
    finite number (None: not set). A subclass's own fields are not bounds."""

    # the bounds are the extra keys: any name here, the metric table says which are known
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float | None] = Field(init=False)

    def set_names(self) -> set[str]:
        """Names of the thresholds given."""
        return {k for k, v in (self.model_extra or {}).items() if v is not None}

    def get(self, name: str) -> float | None:
        """The bound ``name`` (None: not set)."""
        return (self.model_extra or {}).get(name)

    def bounds(self) -> Thresholds:
        """Only the bounds (a subclass's other fields left out)."""
        return Thresholds(**{k: v for k, v in (self.model_extra or {}).items() if v is not None})

    @model_serializer(mode="wrap")
    def _bounds_first(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # the bounds before a subclass's own fields, as a recipe has always been written
        data: dict[str, Any] = handler(self)
        first = [k for k in (self.model_extra or {}) if k in data]
        return {**{k: data[k] for k in first}, **{k: v for k, v in data.items() if k not in first}}
