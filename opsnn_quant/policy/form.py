"""The file form of a policy (``policy.yaml``, schema 2): named quant presets, one line per rule.

A policy in memory holds each int8 rule's full settings (:class:`~opsnn_quant.policy.rule.Rule`);
the file names every distinct setting once, under ``presets:``, and each int8 rule refers to
one by name::

    presets:
      w8a8: {precision: w8a8}
      w8a8-mse-sq0.7: {precision: w8a8, observer: mse, smoothquant_alpha: 0.7}
    rules:
    - {match: vae.quant_conv, precision: fp16, reason: 'stays float: never ran'}
    - {match: unet.*, preset: w8a8-mse-sq0.7, reason: '...'}

A preset lists its precision and the QuantSpec fields that differ from their defaults; its name
is made from them (:func:`preset_name`), so the same settings always get the same name.
Schema 1 files (every rule with its own ``quant:`` block) load unchanged; a rule may still be
written that way by hand. :func:`to_document` and :func:`from_document` convert between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.rule import QuantFields
from opsnn_quant.types import Precision

FILE_VERSION = 2
FLOAT_PRECISIONS = frozenset(p.value for p in Precision if p.is_float)
RULE_KEYS = frozenset({"match", "precision", "preset", "quant", "reason"})
# Short labels of the non-default QuantSpec fields in a preset's name (others: key=value).
_LABELS: dict[str, Callable[[Any], str]] = {
    "activation_symmetric": lambda v: "sym" if v else "asym",
    "observer": str,
    "percentile": lambda v: f"p{v!r}",
    "smoothquant_alpha": lambda v: "sq" + (v if v == "auto" else repr(float(v))),
    "output_dtype": lambda v: {"bfloat16": "bf16out", "float16": "fp16out"}.get(v, v),
    "group_size": lambda v: f"g{v}",
    "timestep_bounds": lambda v: "t" + ".".join(str(b) for b in v),
    "engine": str,
    "weight_rounding": str,
    "bias_correction": lambda v: "bc" if v else "nobc",
    "k_mean": lambda v: "kmean" if v else "nokmean",
    "per_head": lambda v: "head" if v else "tensor",
}


class DocumentError(ValueError):
    """A problem in the file form, at ``loc`` (a path of keys and indices in the document)."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class FlowMap(dict[str, Any]):
    """A mapping written on one line (``{a: 1, b: 2}``) by :func:`opsnn_quant.policy._yaml.dump`."""


def preset_name(settings: Mapping[str, Any]) -> str:
    """The name of a preset: its precision, then a label per non-default field, in QuantSpec's
    field order (``w8a8-mse-sq0.7``)."""
    order = {name: i for i, name in enumerate(QuantFields.model_fields)}
    keys = sorted((k for k in settings if k != "precision"), key=lambda k: (order.get(k, 99), k))
    parts = [str(settings["precision"])]
    for key in keys:
        label = _LABELS.get(key)
        parts.append(label(settings[key]) if label is not None else f"{key}={settings[key]}")
    return "-".join(parts)


def _non_default(quant: Mapping[str, Any]) -> dict[str, Any]:
    defaults = QuantFields().model_dump(mode="json")
    return {k: v for k, v in quant.items() if v != defaults.get(k)}


def to_document(data: Mapping[str, Any]) -> dict[str, Any]:
    """The file form of a policy's JSON dump (``model_dump(mode="json", exclude_none=True)``):
    int8 rules refer to presets, each rule one line."""
    presets: dict[str, dict[str, Any]] = {}
    rules = []
    for rule in data.get("rules", []):
        line = FlowMap(match=rule["match"])
        if "quant" in rule:
            settings = {"precision": rule["precision"], **_non_default(rule["quant"])}
            name = preset_name(settings)
            presets.setdefault(name, settings)
            line["preset"] = name
        else:
            line["precision"] = rule["precision"]
        if rule.get("reason"):
            line["reason"] = rule["reason"]
        rules.append(line)
    doc: dict[str, Any] = {}
    for key, value in data.items():
        if key == "rules":
            presets = dict(sorted(presets.items()))
            doc["presets"] = {k: FlowMap(v) for k, v in presets.items()}
            doc["rules"] = rules
        elif key == "smoothing_groups" and not value:
            continue  # written only when a policy shares factors
        else:
            doc[key] = FILE_VERSION if key == "schema_version" else value
    return doc


def from_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The policy's data from its file form: each ``preset:`` rule gets the preset's precision
    and ``quant:`` settings; a schema 1 document passes through.

    Raises:
        DocumentError: an unknown or unused preset, a preset that is not a mapping with an
            int8 precision, a rule with both ``preset`` and ``precision``/``quant``.
    """
    if "presets" not in doc:
        return doc
    presets = doc["presets"]
    if not isinstance(presets, dict):
        raise DocumentError(("presets",), "presets must be a mapping of name -> settings")
    expanded = {name: _preset(name, s) for name, s in presets.items()}
    rules = doc.get("rules", [])
    if not isinstance(rules, list):
        return {k: v for k, v in doc.items() if k != "presets"}  # the schema names the problem
    used: set[str] = set()
    out = [_expand(i, rule, expanded, used) for i, rule in enumerate(rules)]
    unused = [name for name in expanded if name not in used]
    # A misspelt rule key also leaves its preset unused: the schema names the key instead.
    if unused and all(isinstance(r, dict) and set(r) <= RULE_KEYS for r in rules):
        raise DocumentError(("presets", unused[0]), f"preset {unused[0]!r} is used by no rule")
    return {**{k: v for k, v in doc.items() if k != "presets"}, "rules": out}


def _preset(name: str, settings: Any) -> dict[str, Any]:
    """A preset as a rule's ``precision`` and ``quant``, checked here so that a problem is
    reported at the preset, not at every rule that names it."""
    if not isinstance(settings, dict) or "precision" not in settings:
        raise DocumentError(("presets", name), "a preset is a mapping with a precision")
    precision, quant = (
        settings["precision"],
        {k: v for k, v in settings.items() if k != "precision"},
    )
    if precision in FLOAT_PRECISIONS:
        raise DocumentError(
            ("presets", name, "precision"),
            f"presets hold int8 settings; a {precision} rule says its precision itself",
        )
    try:
        QuantFields(**quant).to_spec(Precision(precision))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ("presets", name, *(str(x) for x in first["loc"]))
        raise DocumentError(loc, str(first["msg"]).removeprefix("Value error, ")) from None
    except (ValueError, ConfigError) as exc:  # an unknown precision; QuantSpec's own checks
        raise DocumentError(("presets", name), str(exc)) from None
    return {"precision": precision, "quant": quant}


def _expand(i: int, rule: Any, presets: dict[str, dict[str, Any]], used: set[str]) -> Any:
    if not isinstance(rule, dict) or "preset" not in rule:
        return rule
    if "precision" in rule or "quant" in rule:
        raise DocumentError(
            ("rules", i, "preset"), "a rule names a preset or its own precision/quant, not both"
        )
    name = rule["preset"]
    if name not in presets:
        known = ", ".join(presets) or "none"
        raise DocumentError(("rules", i, "preset"), f"unknown preset {name!r} (presets: {known})")
    used.add(name)
    out = {k: v for k, v in rule.items() if k != "preset"}
    out.update(presets[name])
    return out
