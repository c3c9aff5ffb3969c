"""``PrecisionPolicy``: which precision every module runs in, and why (``policy.yaml``).

Resolution of one module name, in this order:

1. the rules, first match wins (``fnmatch`` globs on module names). A rule with an int8
   precision only applies to the modules of its kind (``a8``: attention modules, their SDPA in
   int8; the others: Linear/Conv2d); other modules it matches fall through to the next rule, so
   ``unet.*: w8a8`` never puts a LayerNorm (or an attention's SDPA) in int8.
2. the default of the module's modality, found by the longest matching module-name prefix in
   ``modalities`` (``""`` matches every name).
3. otherwise the module stays float as loaded (reported as fp32).

Sizes are bounded before any work: a policy file is at most :data:`MAX_POLICY_BYTES` (refused
before it is read), holds at most :data:`MAX_RULES` rules (refused before they are validated) and
a glob at most :data:`~opsnn_quant.policy.rule.MAX_GLOB_CHARS` characters (refused before it is
matched). A policy holds at most one rule per decided module (the search's exact form; its
compact form far fewer): the largest pipelines this toolkit targets (FLUX, Wan, Whisper large)
have about a thousand Linear/Conv2d, so 20 000 rules is twenty times that. A generated rule line
is 100-300 bytes, so 20 000 of them fit in 8 MiB.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opsnn_quant.core.numerics import fmt_share
from opsnn_quant.core.readers import read_text
from opsnn_quant.errors import ConfigError
from opsnn_quant.output.files import atomic_write_text
from opsnn_quant.policy import _yaml, form
from opsnn_quant.policy.budget import Budget
from opsnn_quant.policy.rule import Rule, glob_matcher
from opsnn_quant.policy.targets import Target, get_target, module_types_of
from opsnn_quant.quant.spec import ATTENTION_TYPE, QuantSpec
from opsnn_quant.types import Modality, Precision, match_prefix

if TYPE_CHECKING:
    from torch import nn

SCHEMA_VERSION = form.FILE_VERSION
# Caps on what a policy may hold (see the module docstring for why these numbers).
MAX_RULES = 20_000
MAX_POLICY_BYTES = 8 << 20
# Schema 1: every int8 rule with its own quant: block (read as before; written as schema 2).
READABLE_VERSIONS = (1, SCHEMA_VERSION)
_HEADER = (
    "opsnn-quant precision policy. Rules: first match wins (globs on module names);\n"
    "int8 rules apply to Linear/Conv2d only (a8: attention modules); then the modality\n"
    "default (longest prefix).\n"
    "An int8 rule names a preset: its precision and the quant settings that differ from the\n"
    "defaults (activation_symmetric true, observer minmax, output_dtype float16, no SmoothQuant)."
)
_GROUPS_HEADER = (
    "\nsmoothing_groups: the Linears each norm feeds share one SmoothQuant factor (one alpha, the\n"
    "max |W| of all of them), divided into that norm at export; a float member's weight absorbs it."
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModalityFigures(_Frozen):
    """The probe figures a modality's decision was made from.

    Attributes:
        chosen: ``int8`` (some modules int8) or ``fp16`` (the whole modality float).
        predicted_sqnr_db: predicted SQNR of the modality output (None = no int8 noise).
        predicted_cosine: the same as a cosine, ``1 / sqrt(1 + noise)``.
        noise: summed relative noise energy of the int8 modules (first order).
        int8_mac_share: share of the modality's MACs that run in int8.
        limit: the budget that applied, in words.
        note: why the modality ended up as it did.
    """

    chosen: Literal["int8", "fp16"]
    predicted_sqnr_db: float | None = None
    predicted_cosine: float | None = None
    noise: float = 0.0
    int8_mac_share: float = 0.0
    limit: str = ""
    note: str = ""


class Resolved(NamedTuple):
    """The precision of one module and where it came from."""

    precision: Precision
    rule: int | Literal["default", "unassigned"]
    reason: str


class PrecisionPolicy(_Frozen):
    """A typed, versioned precision policy with a YAML round trip.

    Attributes:
        schema_version: version of this layout.
        model: id of the model the policy was decided for.
        target: deployment target name (see :mod:`opsnn_quant.policy.targets`).
        modalities: module-name prefix -> modality (``""`` matches every module).
        defaults: modality -> float precision for modules no rule names.
        rules: ordered rules, first match wins.
        budget: the budget the search used (None for hand-written policies).
        figures: per-modality probe figures the decision was made from.
        notes: search notes (e.g. the outcome of the final check).
        smoothing_groups: producer (a norm) -> the Linears it feeds, which share one
            SmoothQuant factor (every smoothed int8 member one alpha; it is computed over all
            members' weights): the factor an engine without run-time smoothing divides into
            the producer (``Target.smoothing == "fold"``).
    """

    schema_version: int = SCHEMA_VERSION
    model: str
    target: str
    modalities: dict[str, Modality] = Field(default_factory=dict)
    defaults: dict[Modality, Precision] = Field(default_factory=dict)
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_RULES)
    smoothing_groups: dict[str, list[str]] = Field(default_factory=dict)
    budget: Budget | None = None
    figures: dict[Modality, ModalityFigures] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in READABLE_VERSIONS:
            raise ValueError(
                f"policy schema_version {v} is not supported (expected {SCHEMA_VERSION}, "
                "or 1 from earlier releases)"
            )
        return SCHEMA_VERSION  # a schema 1 policy is the same policy: it is written as 2

    @field_validator("target")
    @classmethod
    def _known_target(cls, v: str) -> str:
        try:
            get_target(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("defaults")
    @classmethod
    def _float_defaults(cls, v: dict[Modality, Precision]) -> dict[Modality, Precision]:
        for modality, precision in v.items():
            if not precision.is_float:
                raise ValueError(
                    f"default of {modality.value} is {precision.value}; defaults must be float "
                    "(int8 needs rules, which apply to Linear/Conv2d or attention only)"
                )
        return v

    @property
    def target_def(self) -> Target:
        """The target this policy names (the file is where the name enters: checked when it
        was read)."""
        return get_target(self.target)

    def __str__(self) -> str:
        """A person's summary: target, rules, and each modality's decision (``print(policy)``;
        ``repr`` keeps every field)."""
        lines = [f"precision policy for {self.model} on {self.target}: {len(self.rules)} rules"]
        for modality, f in self.figures.items():
            pred = "-" if f.predicted_sqnr_db is None else f"{f.predicted_sqnr_db:.1f} dB"
            lines.append(
                f"  {modality.value:<14} {f.chosen:<5} int8 {fmt_share(f.int8_mac_share, 4)} of its "
                f"MACs, predicted {pred} ({f.limit or 'no limit'})"
            )
        if not self.figures:  # hand-written: the defaults say what each modality runs
            lines += [f"  {m.value:<14} default {p.value}" for m, p in self.defaults.items()]
        return "\n".join(lines)

    # ---- YAML ----------------------------------------------------------------------------

    def to_yaml(self) -> str:
        """Deterministic YAML text in the file form (:mod:`opsnn_quant.policy.form`: presets,
        one line per rule): the same policy gives the same bytes."""
        doc = form.to_document(self.model_dump(mode="json", exclude_none=True))
        return _yaml.dump(doc, header=_HEADER + (_GROUPS_HEADER if self.smoothing_groups else ""))

    @classmethod
    def from_yaml(cls, text: str, source: str = "<string>") -> PrecisionPolicy:
        """Parse and validate YAML text (schema 2 with presets, or schema 1).

        Raises:
            ConfigError: bad YAML or a schema violation (field path and line in the message).
        """
        if len(text) > MAX_POLICY_BYTES:
            raise ConfigError(_too_big(source, len(text), "characters"))
        return _yaml.load_model(
            cls, text, source, prepare=form.from_document, limits={"rules": MAX_RULES}
        )

    def save(self, path: str | Path) -> Path:
        """Write ``policy.yaml`` atomically."""
        return atomic_write_text(path, self.to_yaml())

    @classmethod
    def load(cls, path: str | Path) -> PrecisionPolicy:
        """Read and validate a policy file.

        Raises:
            ConfigError: missing file, bad YAML or a schema violation.
        """
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p} not found")
        try:
            size = p.stat().st_size
        except OSError as exc:
            raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc
        if size > MAX_POLICY_BYTES:  # refused before it is read or parsed
            raise ConfigError(_too_big(str(p), size, "bytes"))
        return cls.from_yaml(read_text(p), source=str(p))

    # ---- resolution ------------------------------------------------------------------------

    def modality_of(
        self, name: str, modalities: Mapping[str, Modality] | None = None
    ) -> Modality | None:
        """The modality of module ``name`` by the longest matching prefix (None if none)."""
        prefixes = self.modalities if modalities is None else modalities
        prefix = match_prefix(name, prefixes)
        return None if prefix is None else Modality(prefixes[prefix])

    def resolve(
        self,
        module_names: Iterable[str],
        module_types: Mapping[str, str],
        modalities: Mapping[str, Modality] | None = None,
    ) -> dict[str, Resolved]:
        """Precision, source and reason of every module.

        Args:
            module_names: module names in model order.
            module_types: name -> class name; modules of unknown type are not int8-capable.
            modalities: prefix -> modality to use instead of the policy's own.

        Returns:
            ``{name: Resolved(precision, rule index | "default" | "unassigned", reason)}``.
        """
        literal, globs = self._split_rules()
        matchers = [(i, glob_matcher(self.rules[i].match)) for i in globs]  # compiled once
        out: dict[str, Resolved] = {}
        for name in module_names:
            kind = module_types.get(name)

            def applies(i: int, kind: str | None = kind) -> bool:
                # an int8 rule applies to the modules of its kind (a8: attention; the others:
                # Linear/Conv2d); the next rule decides the rest
                precision = self.rules[i].precision
                return precision.is_float or kind in module_types_of(precision)

            # First match wins: the first applicable exact-name rule, unless a glob comes earlier.
            best = next((i for i in literal.get(name, ()) if applies(i)), None)
            for i, match in matchers:
                if best is not None and i > best:
                    break
                if match(name) is not None and applies(i):
                    best = i
                    break
            if best is not None:
                rule = self.rules[best]
                out[name] = Resolved(rule.precision, best, rule.reason)
                continue
            modality = self.modality_of(name, modalities)
            if modality is not None and modality in self.defaults:
                out[name] = Resolved(
                    self.defaults[modality], "default", f"{modality.value} default"
                )
            else:
                out[name] = Resolved(
                    Precision.FP32,
                    "unassigned",
                    "no rule or modality default: kept float as loaded",
                )
        return out

    def _split_rules(self) -> tuple[dict[str, list[int]], list[int]]:
        """Rule indices: exact names (a dict lookup) and globs (to be matched), in order."""
        literal: dict[str, list[int]] = {}
        globs = []
        for i, rule in enumerate(self.rules):
            if any(c in rule.match for c in "*?["):
                globs.append(i)
            else:
                literal.setdefault(rule.match, []).append(i)
        return literal, globs

    def spec_of(self, resolved: Resolved) -> QuantSpec | Precision:
        """The QuantSpec of an int8 resolution, the Precision of a float one."""
        if isinstance(resolved.rule, int) and resolved.precision.is_int8:
            spec = self.rules[resolved.rule].quant_spec()
            assert spec is not None
            return spec
        return resolved.precision

    def check_rules(self, module_names: list[str], module_types: Mapping[str, str]) -> None:
        """Every rule must match a module, and an int8 rule at least one Linear/Conv2d.

        Raises:
            ConfigError: naming the first rule that matches nothing (with a close name if any).
        """
        names = set(module_names)
        literal, _ = self._split_rules()
        for i, rule in enumerate(self.rules):
            if rule.match in literal:
                matched = [rule.match] if rule.match in names else []
            else:
                matched = rule.matching(module_names)
            label = f"rule {i} ({rule.precision.value} on {rule.match!r})"
            if not matched:
                close = difflib.get_close_matches(rule.match, module_names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{label} matches no module of the model{hint}")
            kinds = module_types_of(rule.precision)
            if rule.precision.is_int8 and not any(module_types.get(n) in kinds for n in matched):
                shown = ", ".join(f"{n} ({module_types.get(n)})" for n in matched[:3])
                raise ConfigError(
                    f"{label} matches only modules that cannot be {rule.precision.value}: "
                    f"{shown}; {rule.precision.value} runs on {'/'.join(sorted(kinds))} only"
                )

    def resolved(
        self,
        modules: Mapping[str, str],
        weight_shapes: Mapping[str, tuple[int, ...]] | None = None,
        modalities: Mapping[str, Modality] | None = None,
        tied: Mapping[str, str] | None = None,
    ) -> ResolvedPolicy:
        """The policy checked against a module inventory and its target, resolved once: what
        quantize, the exports, summaries and evaluation take (no phase resolves it again).

        Args:
            modules: module name -> class name, in model order (a probe report's inventory
                or :meth:`resolved_for`'s model's).
            weight_shapes: module name -> weight shape, for the target's shape limits (unknown
                shapes are not checked).
            modalities: module-name prefix -> modality to use instead of the policy's own.
            tied: module name -> the embedding its weight is tied to (the target's engine may
                run such a module float whatever the policy says: then int8 is refused).

        Raises:
            ConfigError: an empty inventory, a rule that matches nothing, an int8 rule that
                matches no Linear/Conv2d, or a module the target cannot run in its precision.
        """
        if not modules:
            raise ConfigError("the module inventory is empty; pass the probe report or the model")
        names = list(modules)
        self.check_rules(names, modules)
        resolution = self.resolve(names, modules, modalities)
        target = self.target_def
        specs = {name: self.spec_of(res) for name, res in resolution.items()}
        problems = []
        for name, res in resolution.items():
            shape = (weight_shapes or {}).get(name)
            ok, why = target.can_run(modules[name], res.precision, weight_shape=shape)
            tie = target.tie_reason((tied or {}).get(name)) if res.precision.is_int8 else None
            if ok and tie is not None:
                ok, why = False, tie
            spec = specs[name]
            if ok and isinstance(spec, QuantSpec):
                ok, why = _engine_fits(spec, target)
            if not ok:
                problems.append(f"{name} ({modules[name]}, {res.precision.value}): {why}")
        problems += _fused_problems(specs, modules, target)
        problems += _smoothing_problems(specs, modules, self.smoothing_groups, target)
        if problems:
            more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
            raise ConfigError(
                f"target {self.target} cannot run {len(problems)} module(s): "
                + "; ".join(problems[:3])
                + more
            )
        return ResolvedPolicy(self, target, dict(modules), resolution, specs)

    def resolved_for(
        self, model: nn.Module, modalities: Mapping[str, Modality] | None = None
    ) -> ResolvedPolicy:
        """:meth:`resolved` against ``model``'s own modules (containers included) and weight
        shapes.

        Raises:
            ConfigError: as :meth:`resolved`.
        """
        from opsnn_quant.quant.attention import is_attention_module

        modules = {n: m for n, m in model.named_modules() if n}
        types = {
            n: ATTENTION_TYPE if is_attention_module(m) else type(m).__name__
            for n, m in modules.items()
        }
        shapes = {}
        for name, module in modules.items():
            weight = getattr(module, "weight", None)
            if weight is not None and hasattr(weight, "shape"):
                shapes[name] = tuple(weight.shape)
        from opsnn_quant.quant.api import tied_to_embeddings

        return self.resolved(types, shapes, modalities, tied_to_embeddings(model))

    def module_specs(self, model: nn.Module) -> dict[str, QuantSpec | Precision]:
        """Module name -> QuantSpec (int8) or Precision (float): the ``ResolvesModules`` protocol.

        ``quantize(model, policy, forward_loop)`` calls this; the policy is checked against the
        model first (:meth:`resolved_for`).
        """
        return dict(self.resolved_for(model).specs)

    def with_notes(self, *notes: str) -> PrecisionPolicy:
        """A copy with ``notes`` appended."""
        return self.model_copy(update={"notes": [*self.notes, *notes]})


def _too_big(source: str, size: int, unit: str) -> str:
    return (
        f"{source} is {size} {unit}, more than the {MAX_POLICY_BYTES} a policy file may hold "
        f"(at most {MAX_RULES} rules)"
    )


def _engine_fits(spec: QuantSpec, target: Target) -> tuple[bool, str]:
    """Whether the target's engine runs an int8 ``spec`` as written (its arithmetic, per-step
    scales)."""
    if spec.timestep_bounds and not target.timestep_scales:
        return False, f"{target.name} keeps one static scale (no per-step scales)"
    if spec.engine_def is not target.engine_def:  # one table entry per engine
        return False, (
            f"{target.name} runs {target.engine}'s arithmetic; the rule's quant settings are "
            f"{spec.engine}'s (engine: {target.engine})"
        )
    return True, ""


def _fused_problems(
    specs: Mapping[str, QuantSpec | Precision], modules: Mapping[str, str], target: Target
) -> list[str]:
    """A fused layer of the target's engine whose members resolve differently (one type, one
    input scale per fused layer: every member the same QuantSpec, or all float)."""
    problems = []
    for members in target.fused_layers(n for n, t in modules.items() if t == "Linear"):
        kinds = {n: specs[n] if isinstance(specs[n], QuantSpec) else "float" for n in members}
        if len(set(kinds.values())) > 1:
            shown = ", ".join(
                f"{n} ({'float' if k == 'float' else k.precision.value})"  # type: ignore[union-attr]
                for n, k in kinds.items()
            )
            problems.append(
                f"{shown}: {target.name} loads them as one fused layer of one quant type and "
                "one input scale; give them the same rule"
            )
    return problems


def _smoothing_problems(
    specs: Mapping[str, QuantSpec | Precision],
    modules: Mapping[str, str],
    groups: Mapping[str, list[str]],
    target: Target,
) -> list[str]:
    """A smoothing group that names unknown modules or whose int8 members do not share one
    SmoothQuant factor (all smoothed, one fixed alpha); on a target that folds the factor, a
    smoothed module outside every group (its engine has nowhere to apply its factor)."""
    problems, grouped = [], set()
    for producer, members in groups.items():
        missing = [n for n in (producer, *members) if n not in modules]
        if missing:
            problems.append(
                f"smoothing group {producer}: {missing[0]} is not a module of the model"
            )
            continue
        grouped.update(members)
        int8 = {n: s for n in members if isinstance(s := specs[n], QuantSpec)}
        alphas = {s.smoothquant_alpha for s in int8.values()}
        if len(alphas) > 1 or any(isinstance(a, str) or a is None for a in alphas):
            shown = ", ".join(f"{n} (alpha {s.smoothquant_alpha})" for n, s in int8.items())
            problems.append(
                f"smoothing group {producer}: {shown}: one shared factor needs every int8 "
                "member smoothed with one fixed alpha"
            )
    if target.smoothing == "fold":
        for name, spec in specs.items():
            if isinstance(spec, QuantSpec) and spec.smoothquant and name not in grouped:
                problems.append(
                    f"{name}: {target.name} applies no SmoothQuant factor at run time; a smoothed "
                    "Linear must be in a smoothing group (its factor folded into the norm)"
                )
    return problems


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy resolved once against one model's module inventory and its :class:`Target`.

    Made by :meth:`PrecisionPolicy.resolved` (the only place a policy's target name is looked
    up); quantize (it is a ``ResolvesModules``), the exports, summaries and evaluation take it
    instead of resolving the policy again.

    Attributes:
        policy: the policy.
        target: its target (chip and engine capabilities).
        modules: the inventory it was resolved against: module name -> class name, model order.
        resolution: every module's precision, deciding rule and reason.
        specs: every module's QuantSpec (int8) or Precision (float).
    """

    policy: PrecisionPolicy
    target: Target
    modules: Mapping[str, str]
    resolution: Mapping[str, Resolved]
    specs: Mapping[str, QuantSpec | Precision]

    def module_specs(self, model: nn.Module) -> Mapping[str, QuantSpec | Precision]:
        """The ``ResolvesModules`` protocol of :func:`opsnn_quant.quant.api.quantize`: the
        resolved specs (quantize checks that every int8 name is a Linear/Conv2d of ``model``)."""
        return self.specs

    def int8(self) -> dict[str, QuantSpec]:
        """Module name -> QuantSpec of the int8 modules, in model order."""
        return {n: s for n, s in self.specs.items() if isinstance(s, QuantSpec)}

    @property
    def smoothing_groups(self) -> Mapping[str, list[str]]:
        """The policy's :attr:`PrecisionPolicy.smoothing_groups` (checked): the
        ``SharesSmoothing`` protocol of :func:`opsnn_quant.quant.api.quantize`."""
        return self.policy.smoothing_groups


def derive_prefixes(entries: Iterable[tuple[str, Modality | str]]) -> dict[str, Modality]:
    """The shortest module-name prefixes that separate modalities.

    ``[("te.l0", TE), ("te.l1", TE), ("unet.a", DEN)]`` gives ``{"te": TE, "unet": DEN}``; a
    single-modality model gives ``{"": modality}``.
    """
    items = [(name.split("."), Modality(mod)) for name, mod in entries]
    if not items:
        return {}
    if len({m for _, m in items}) == 1:
        return {"": items[0][1]}
    out: dict[str, Modality] = {}

    def split(group: list[tuple[list[str], Modality]], depth: int) -> None:
        buckets: dict[str, list[tuple[list[str], Modality]]] = {}
        for parts, mod in group:
            buckets.setdefault(".".join(parts[: depth + 1]), []).append((parts, mod))
        for key, members in buckets.items():
            mods = {m for _, m in members}
            if len(mods) == 1:
                out[key] = members[0][1]
                continue
            # A module that is itself the container of others keeps its own modality; the
            # longer prefixes of its children win for them.
            for parts, mod in members:
                if len(parts) == depth + 1:
                    out[key] = mod
            split([(p, m) for p, m in members if len(p) > depth + 1], depth + 1)

    split(items, 0)
    return out
