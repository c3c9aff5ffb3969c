"""One ordered rule of a policy (``policy.yaml`` ``rules:``) and its quantization settings.

A rule's ``quant:`` section is :class:`~opsnn_quant.quant.spec.QuantSpec` without ``precision``
(the rule carries that): :data:`QuantFields` is built from QuantSpec's dataclass fields, their
types and defaults, so the YAML schema cannot drift from the spec. QuantSpec's own checks
(ranges, SmoothQuant with w8a16) run when a rule is validated.

A glob is at most :data:`MAX_GLOB_CHARS` characters: a module name is a dotted path of a few
dozen to a couple of hundred characters, and a longer glob only costs time and memory to compile
and to match (a 10 MB glob took minutes and gigabytes before it was refused).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
import typing
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from opsnn_quant.errors import ConfigError
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision

# QuantSpec fields a rule holds itself rather than in its ``quant:`` section.
RULE_LEVEL_FIELDS: frozenset[str] = frozenset({"precision"})

# The longest glob a rule may hold (module names are far shorter: see the module docstring).
MAX_GLOB_CHARS = 4096


@functools.lru_cache(maxsize=32768)
def glob_matcher(glob: str) -> Callable[[str], re.Match[str] | None]:
    """The compiled ``fnmatch`` matcher of ``glob`` (case-sensitive, as
    :func:`fnmatch.fnmatchcase`): every rule matches module names through this one function."""
    return re.compile(fnmatch.translate(glob)).match


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QuantFieldsBase(_Frozen):
    """What every :data:`QuantFields` model can do: convert to and from a QuantSpec."""

    def to_spec(self, precision: Precision) -> QuantSpec:
        """The QuantSpec of these settings in ``precision``.

        Raises:
            ConfigError: QuantSpec's checks fail (e.g. SmoothQuant with w8a16).
        """
        return QuantSpec(precision=precision, **self.model_dump())

    @classmethod
    def from_spec(cls, spec: QuantSpec) -> Self:
        """The settings of ``spec`` (its precision goes to the rule)."""
        values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        return cls(**{k: v for k, v in values.items() if k not in RULE_LEVEL_FIELDS})


def _quant_fields_model() -> type[QuantFieldsBase]:
    """A frozen pydantic model with QuantSpec's fields (types, defaults, order), precision aside."""
    hints = typing.get_type_hints(QuantSpec)
    fields: dict[str, Any] = {
        f.name: (hints[f.name], f.default)
        for f in dataclasses.fields(QuantSpec)
        if f.name not in RULE_LEVEL_FIELDS
    }
    return create_model(
        "QuantFields",
        __base__=QuantFieldsBase,
        __module__=__name__,
        __doc__="The QuantSpec fields of an int8 rule (precision aside), built from QuantSpec.",
        **fields,
    )


if TYPE_CHECKING:
    # Type checkers cannot follow a model built at run time; they see the base's methods.
    QuantFields = QuantFieldsBase
else:
    QuantFields = _quant_fields_model()


class Rule(_Frozen):
    """One ordered rule: modules whose name matches ``match`` run in ``precision``.

    Attributes:
        match: ``fnmatch`` glob on module names (an exact name is a glob too).
        precision: the precision.
        quant: quantization settings of an int8 rule (defaults when omitted).
        reason: why, in words, with the evidence.
    """

    match: str = Field(min_length=1, max_length=MAX_GLOB_CHARS)
    precision: Precision
    quant: QuantFields | None = None
    reason: str = ""

    @model_validator(mode="before")
    @classmethod
    def _int8_settings_explicit(cls, data: Any) -> Any:
        # An int8 rule without quant: settings takes the defaults; holding them explicitly makes
        # ``Rule(match, precision=w8a8)`` equal to the same rule read back from a file.
        if isinstance(data, dict) and data.get("quant") is None and "precision" in data:
            try:
                int8 = not Precision(data["precision"]).is_float
            except ValueError:
                return data  # the field's own check names the bad precision
            if int8:
                return {**data, "quant": {}}
        return data

    @model_validator(mode="after")
    def _check_quant(self) -> Rule:
        if self.precision.is_float:
            if self.quant is not None:
                raise ValueError(
                    f"quant settings need an int8 precision, not {self.precision.value}"
                )
        else:
            self.quant_spec()  # QuantSpec's own checks (SmoothQuant with w8a16, ranges)
        return self

    def quant_spec(self) -> QuantSpec | None:
        """The rule's QuantSpec (None for float precisions)."""
        if self.precision.is_float:
            return None
        try:
            return (self.quant or QuantFields()).to_spec(self.precision)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def matches(self, name: str) -> bool:
        """True when ``name`` matches the rule's glob."""
        return glob_matcher(self.match)(name) is not None

    def matching(self, names: Iterable[str]) -> list[str]:
        """The ``names`` that match the rule's glob, in order (one compiled glob for all)."""
        match = glob_matcher(self.match)
        return [n for n in names if match(n) is not None]
