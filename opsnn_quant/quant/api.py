"""``quantize(model, config, forward_loop)``: swap modules, calibrate, freeze."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from opsnn_quant.errors import CalibrationError, ConfigError
from opsnn_quant.models.offload import offload_of, touch, window
from opsnn_quant.quant.attention import (
    QuantizedAttention,
    attention_modules,
    convert_attention,
    revert_attention,
)
from opsnn_quant.quant.modules import (
    QuantModule,
    is_quant_module,
    quant_module_class,
    set_submodule,
)
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import ForwardLoop, Precision

log = logging.getLogger(__name__)

SpecLike = QuantSpec | Precision | str


@runtime_checkable
class SeedsCalibration(Protocol):
    """Calibration statistics of one module collected elsewhere (the probe's pass 1 over the
    same data): they can stand in for :func:`quantize`'s own calibration passes."""

    def can_seed(self, spec: QuantSpec) -> bool:
        """Whether :meth:`seed` gives ``spec`` exactly what calibrating would."""
        ...

    def seed(self, module: QuantModule[Any]) -> None:
        """Put the statistics into an unfrozen quantized module (then ``freeze()`` it)."""
        ...


@runtime_checkable
class SeedsAttention(Protocol):
    """Calibration statistics of one attention module collected elsewhere (the probe's pass 1
    over the same data)."""

    def can_seed_attention(self, spec: QuantSpec) -> bool:
        """Whether :meth:`seed_attention` gives ``spec`` exactly what calibrating would."""
        ...

    def seed_attention(self, module: QuantizedAttention) -> None:
        """Put the statistics into an unfrozen int8 attention module."""
        ...


@runtime_checkable
class ResolvesModules(Protocol):
    """Anything that maps a model's module names to precisions/specs (e.g. a PrecisionPolicy)."""

    def module_specs(self, model: nn.Module) -> Mapping[str, SpecLike]:
        """Module name -> spec for every module it assigns (float precisions allowed)."""
        ...


@runtime_checkable
class SharesSmoothing(Protocol):
    """A config whose Linears may share SmoothQuant factors (e.g. a resolved policy)."""

    @property
    def smoothing_groups(self) -> Mapping[str, list[str]]:
        """Producer -> the Linears it feeds that share one factor (see
        :attr:`opsnn_quant.policy.schema.PrecisionPolicy.smoothing_groups`)."""
        ...


def quantizable_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Named modules that can be swapped, in model order: those of a float type a quantized
    class is registered for (Linear, Conv2d and any :func:`register_quant_module` adds)."""
    return {n: m for n, m in model.named_modules() if n and quant_module_class(type(m))}


def tied_to_embeddings(model: nn.Module) -> dict[str, str]:
    """Module name -> the ``nn.Embedding`` whose weight it shares, for every module holding an
    embedding's weight Parameter itself (a head tied to its token embedding, as transformers'
    ``tie_word_embeddings`` makes Whisper's ``proj_out``)."""
    owners: dict[int, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            owners.setdefault(id(module.weight), name)
    return {
        name: owners[id(weight)]
        for name, module in model.named_modules()
        if name
        and not isinstance(module, nn.Embedding)
        and isinstance(weight := getattr(module, "weight", None), nn.Parameter)
        and id(weight) in owners
    }


def resolve_globs(
    model: nn.Module, mapping: Mapping[str, SpecLike]
) -> dict[str, tuple[str, SpecLike]]:
    """Apply ordered ``{glob: spec}`` rules to the model's module names; first match wins.

    Returns ``{module name: (winning pattern, spec)}``. Every glob must match at least one
    module (any module, so that a rule can pin a LayerNorm to fp32), else :class:`ConfigError`
    names it.
    """
    names = [n for n, _ in model.named_modules() if n]
    for pattern in mapping:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise ConfigError(f"pattern {pattern!r} matches no module of the model")
    out: dict[str, tuple[str, SpecLike]] = {}
    for name in names:
        for pattern, spec in mapping.items():
            if fnmatch.fnmatchcase(name, pattern):
                out[name] = (pattern, spec)
                break
    return out


def _precision(value: SpecLike) -> Precision:
    if isinstance(value, QuantSpec):
        return value.precision
    try:
        return Precision(value)
    except ValueError as exc:
        names = ", ".join(p.value for p in Precision)
        raise ConfigError(f"unknown precision {value!r}; choose one of {names}") from exc


def int8_specs(
    model: nn.Module, config: Mapping[str, SpecLike] | ResolvesModules
) -> dict[str, QuantSpec]:
    """Module name -> QuantSpec for the modules ``config`` makes int8: those :func:`quantize`
    swaps, in model order (validated as it does): Linear/Conv2d modules and, for precision
    ``a8``, attention modules (:mod:`opsnn_quant.quant.attention`)."""
    swappable = quantizable_modules(model)
    attentions = attention_modules(model)
    if isinstance(config, ResolvesModules):
        assigned = dict(config.module_specs(model))
        specs = {}
        for name, value in assigned.items():
            precision = _precision(value)
            if precision.is_float:
                continue
            if precision.is_attention and name not in attentions:
                raise ConfigError(f"module '{name}' is not an attention module; it cannot be a8")
            if not precision.is_attention and name not in swappable:
                raise ConfigError(f"module '{name}' is not a Linear or Conv2d; it cannot be int8")
            specs[name] = QuantSpec.coerce(value)
        return specs
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"quantize() takes a {{glob: precision}} mapping or a policy, got {type(config).__name__}"
        )
    specs = {}
    used: set[str] = set()
    for name, (pattern, value) in resolve_globs(model, config).items():
        # An int8 rule applies to the modules of its kind among its matches (a8: attention
        # modules; the others: Linear/Conv2d); containers and other layers it also matches keep
        # their float precision.
        precision = _precision(value)
        of_its_kind = attentions if precision.is_attention else swappable
        if precision.is_float or name not in of_its_kind:
            continue
        specs[name] = QuantSpec.coerce(value)
        used.add(pattern)
    for pattern, value in config.items():
        precision = _precision(value)
        if not precision.is_float and pattern not in used:
            kind = "attention" if precision.is_attention else "Linear/Conv2d"
            raise ConfigError(
                f"pattern {pattern!r} ({precision.value}) matches no {kind} module that an "
                "earlier pattern has not already taken"
            )
    return specs


@torch.no_grad()
def quantize(
    model: nn.Module,
    config: Mapping[str, SpecLike] | ResolvesModules,
    forward_loop: ForwardLoop | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    statistics: Mapping[str, SeedsCalibration | SeedsAttention] | None = None,
) -> nn.Module:
    """Quantize ``model`` in place: swap modules, calibrate with ``forward_loop``, freeze.

    Args:
        model: float model (fp32 for calibration).
        config: ordered ``{glob on module names: precision or QuantSpec}`` (first match wins;
            float precisions leave modules alone), or an object with ``module_specs(model)``
            such as a ``PrecisionPolicy``.
        forward_loop: runs the model over calibration data. Needed unless every module is
            weight-only or dynamic without SmoothQuant. Runs twice when a static module uses
            SmoothQuant (statistics pass, then range pass on the smoothed activations).
        progress: optional callback told about each phase.
        statistics: module name -> statistics of the same float model on the same data (the
            probe's, see :func:`opsnn_quant.probe.probe`'s ``keep``). When every module that
            needs data has statistics that can seed its spec exactly, no calibration pass runs
            (the result is the same bits); otherwise ``forward_loop`` calibrates them all.

    Returns:
        The same model object, with quantized modules frozen.

    A wildcard pattern's scheme applies where it can: a module it matches that cannot take it
    (e.g. SmoothQuant on a conv) or that the forward loop never reaches stays float, and one
    warning lists them; an exact module name (or a policy) keeps both an error.

    Raises:
        ConfigError: a pattern matches nothing, or names a module that cannot be int8.
        CalibrationError: NaN/Inf activations, or a module named exactly (or by a policy) that
            the forward_loop never reached.
    """
    specs = int8_specs(model, config)
    if any(is_quant_module(m) or isinstance(m, QuantizedAttention) for m in model.modules()):
        raise ConfigError("the model already holds quantized modules; quantize the float model")
    lenient = _glob_assigned(model, config)
    attention = {n: s for n, s in specs.items() if s.precision.is_attention}
    specs = {n: s for n, s in specs.items() if n not in attention}
    # an offloaded model (--max-memory): the block of each module read here is opened in turn
    with window(model):
        swapped, floats, skipped = _swap(model, specs, lenient)
    attentions = _convert_attention(model, attention, lenient, skipped)
    groups = config.smoothing_groups if isinstance(config, SharesSmoothing) else {}
    with window(model):
        _share_weight_absmax(model, swapped, groups)
    needs_data = {
        n: q
        for n, q in swapped.items()
        if q.spec.static_activations or q.spec.smoothquant or q.spec.needs_moments
    }
    if (needs_data or attentions) and not _seeded(
        needs_data, attentions, statistics, model, progress
    ):
        skipped.update(
            _calibration_passes(model, forward_loop, swapped, needs_data, floats, progress)
        )
    skipped.update(_freeze_attention(attentions, lenient))
    floats.clear()  # before the weights become int8: the float copies are not kept
    _warn_skipped(skipped)
    with window(model) as off:
        for name, q in swapped.items():
            touch(off, name)
            q.freeze()
    _check_shared(swapped, groups)
    log.info("quantized %d modules, %d attention modules", len(swapped), len(attentions))
    return model


def _seeded(
    needs_data: Mapping[str, QuantModule[Any]],
    attentions: Mapping[str, QuantizedAttention],
    statistics: Mapping[str, SeedsCalibration | SeedsAttention] | None,
    model: nn.Module,
    progress: Callable[[str], None] | None,
) -> bool:
    """Seed every module from the probe's statistics of the same data, when each can be (a
    pass for some would observe the others twice); whether it was done."""
    seeds = _attention_seeds(attentions, statistics)
    if seeds is None or (needs_data and not _seed_all(needs_data, statistics or {}, model)):
        return False
    for name, module in attentions.items():
        seeds[name].seed_attention(module)
    if progress:
        progress("calibration: the probe's statistics of the same data (no pass)")
    return True


def _calibration_passes(
    model: nn.Module,
    forward_loop: ForwardLoop | None,
    swapped: dict[str, QuantModule[Any]],
    needs_data: dict[str, QuantModule[Any]],
    floats: Mapping[str, nn.Module],
    progress: Callable[[str], None] | None,
) -> dict[str, str]:
    """The forward loop over the swapped modules (twice where a static module is smoothed:
    statistics, then ranges on the smoothed inputs); returns the lenient modules it never
    reached, put back float -> why."""
    if forward_loop is None:
        raise ConfigError("static activation quantization and SmoothQuant need a forward_loop")
    two_pass = any(q.spec.static_activations and q.spec.smoothquant for q in swapped.values())
    if progress:
        progress("calibration (statistics)" if two_pass else "calibration")
    forward_loop(model)
    skipped = _restore_uncalled(model, needs_data, swapped, floats)
    with window(model) as off:
        for name, q in swapped.items():
            q.input_quantizer.end_first_pass()
            if q.spec.smoothquant:
                touch(off, name)
                q.decide_smoothing()
    if two_pass:
        if progress:
            progress("calibration (activation ranges after SmoothQuant)")
        forward_loop(model)
    return skipped


def _convert_attention(
    model: nn.Module, specs: Mapping[str, QuantSpec], lenient: set[str], skipped: dict[str, str]
) -> dict[str, QuantizedAttention]:
    """Convert each attention module of ``specs`` in place (a lenient one that cannot take its
    spec stays float, named in ``skipped``)."""
    converted: dict[str, QuantizedAttention] = {}
    for name, spec in specs.items():
        try:
            converted[name] = convert_attention(model.get_submodule(name), spec, name)
        except ConfigError as exc:
            if name not in lenient:
                raise
            skipped[name] = str(exc)
    return converted


def _freeze_attention(modules: dict[str, QuantizedAttention], lenient: set[str]) -> dict[str, str]:
    """Freeze each calibrated attention module; a lenient one calibration showed cannot run in
    int8 (never reached SDPA, or a call the op refuses) goes back to float -> why."""
    out: dict[str, str] = {}
    for name, module in list(modules.items()):
        try:
            module.freeze_attention()
        except CalibrationError as exc:
            if name not in lenient:
                raise
            revert_attention(module)
            del modules[name]
            out[name] = str(exc).removeprefix(f"attention '{name}'").removeprefix(":").strip()
    return out


def _smoothed_members(
    swapped: Mapping[str, QuantModule[Any]], members: list[str]
) -> list[QuantModule[Any]]:
    return [swapped[n] for n in members if n in swapped and swapped[n].spec.smoothquant]


@torch.no_grad()
def _share_weight_absmax(
    model: nn.Module, swapped: Mapping[str, QuantModule[Any]], groups: Mapping[str, list[str]]
) -> None:
    """Before calibration: each smoothed member of a smoothing group takes the per-input-channel
    weight maxima of all the group's Linears (int8 or float), the ``max |W_j|`` of its shared
    factor (its input maxima are the group's already: one input)."""
    for producer, members in groups.items():
        smoothed = _smoothed_members(swapped, members)
        if not smoothed:
            continue
        absmax = None
        off = offload_of(model)
        for name in members:
            touch(off, name)
            module = model.get_submodule(name)
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                raise ConfigError(f"smoothing group {producer}: {name} is not a Linear")
            w = weight.detach().abs().amax(dim=0).float()
            absmax = w if absmax is None else torch.maximum(absmax, w.to(absmax.device))
        for q in smoothed:
            q.input_quantizer.shared_weight_absmax = absmax


def _check_shared(swapped: Mapping[str, QuantModule[Any]], groups: Mapping[str, list[str]]) -> None:
    """After freezing: a group's smoothed members hold one factor, or the producer could not
    take it (members fed different inputs: not the group the probe traced)."""
    for producer, members in groups.items():
        smoothed = _smoothed_members(swapped, members)
        factors = [getattr(q.input_quantizer, "smooth", None) for q in smoothed]
        first = factors[0] if factors else None
        if any(f is None or first is None or not torch.equal(f, first) for f in factors):
            raise CalibrationError(
                f"the Linears of smoothing group {producer} saw different inputs; they cannot "
                "share one SmoothQuant factor folded into it"
            )


def _glob_assigned(model: nn.Module, config: Mapping[str, SpecLike] | ResolvesModules) -> set[str]:
    """The modules a wildcard pattern of a mapping config made int8: the pattern's scheme
    applies where it can (a module that cannot take it, or never runs, stays float with a
    warning, as in ModelOpt and quanto); an exact name or a policy keeps it an error."""
    if not isinstance(config, Mapping):
        return set()
    return {
        name
        for name, (pattern, _) in resolve_globs(model, config).items()
        if any(c in pattern for c in "*?[")
    }


def _swap(
    model: nn.Module, specs: Mapping[str, QuantSpec], lenient: set[str]
) -> tuple[dict[str, QuantModule[Any]], dict[str, nn.Module], dict[str, str]]:
    """Swap each module of ``specs`` for its quantized class: (swapped, the float modules of the
    lenient ones, kept until calibration says whether they ran, lenient modules that cannot
    take their spec -> why)."""
    modules = dict(model.named_modules())
    off = offload_of(model)
    swapped: dict[str, QuantModule[Any]] = {}
    floats: dict[str, nn.Module] = {}
    skipped: dict[str, str] = {}
    for name, spec in specs.items():
        # popped: once swapped out, the float module is freed (not held here beside its copy,
        # which for a whole UNet was a second float copy of every quantized weight)
        module = modules.pop(name)
        touch(off, name)  # its weights in memory (an offloaded block: opened)
        qclass = quant_module_class(type(module))
        assert qclass is not None  # int8_specs only keeps quantizable_modules
        try:
            q = qclass.from_float(module, spec, name)
        except ConfigError as exc:
            if name not in lenient:
                raise
            skipped[name] = str(exc).removeprefix(f"module '{name}': ")
            continue
        q.to(next(iter(module.parameters())).device)
        set_submodule(model, name, q)
        swapped[name] = q
        if name in lenient:
            floats[name] = module  # shares its weights with q until q is frozen
        del module
    return swapped, floats, skipped


def _restore_uncalled(
    model: nn.Module,
    needs_data: dict[str, QuantModule[Any]],
    swapped: dict[str, QuantModule[Any]],
    floats: Mapping[str, nn.Module],
) -> dict[str, str]:
    """Put the float module back for each lenient module the forward loop never reached
    (removed from ``needs_data`` and ``swapped``); returns them -> why."""
    out = {}
    for name in [n for n, q in needs_data.items() if n in floats and q.calibration_calls == 0]:
        set_submodule(model, name, floats[name])
        del needs_data[name], swapped[name]
        out[name] = "never called by the forward_loop"
    return out


def _warn_skipped(skipped: Mapping[str, str]) -> None:
    """One warning listing the modules a wildcard pattern left float, and why."""
    if not skipped:
        return
    shown = "; ".join(f"{n} ({why})" for n, why in list(skipped.items())[:5])
    more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    log.warning("%d module(s) matched by a wildcard stay float: %s%s", len(skipped), shown, more)


def _attention_seeds(
    modules: Mapping[str, QuantizedAttention],
    stats: Mapping[str, SeedsCalibration | SeedsAttention] | None,
) -> dict[str, SeedsAttention] | None:
    """The statistics of every attention module of ``modules``, when each can seed it (None
    otherwise; empty for none)."""
    seeds: dict[str, SeedsAttention] = {}
    for name, module in modules.items():
        stat = None if stats is None else stats.get(name)
        if not isinstance(stat, SeedsAttention) or not stat.can_seed_attention(module.attn_spec):
            return None
        seeds[name] = stat
    return seeds


def _seed_all(
    modules: Mapping[str, QuantModule[Any]],
    stats: Mapping[str, SeedsCalibration | SeedsAttention],
    model: nn.Module,
) -> bool:
    """Seed every module from ``stats`` if each can be (else touch none and return False);
    the SmoothQuant decision reads the weight: an offloaded module's block is opened."""
    seeds: dict[str, SeedsCalibration] = {}
    for name, q in modules.items():
        stat = stats.get(name)
        if not isinstance(stat, SeedsCalibration) or not stat.can_seed(q.spec):
            return False
        seeds[name] = stat
    with window(model) as off:
        for name, q in modules.items():
            touch(off, name)
            seeds[name].seed(q)
    return True
