"""AMCT's two configs of a policy: ``amct-cfg``, the simplified PTQ config (protobuf text of
``calibration_config_pytorch.proto``: ``batch_num``, ``activation_offset``, ``skip_layers``,
``common_config{arq_quantize, ifmr_quantize}``, ``override_layer_configs``;
https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/amct/atlasamct_16_0131.html),
and ``amct-eager``, the config dict of AMCT's ``quantize(model, config)`` as JSON
(https://github.com/hicann/amct/blob/master/docs/api/quantize.md; field checks in
``amct_pytorch/config/fields.py`` and ``amct_pytorch/config/parser.py`` of that repository).
What a config cannot express stays float, with a note (never the reverse)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opsnn_quant.formats.result import ExportResult
from opsnn_quant.policy.schema import ResolvedPolicy
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision

if TYPE_CHECKING:
    from opsnn_quant.formats.result import PolicyExportOptions

# Layer types AMCT's PyTorch PTQ can quantize (Linear, Conv2d, Conv3d, ConvTranspose2d per the
# AMCT manual's quantizable-layer tables); every one the policy keeps float goes to skip_layers.
AMCT_QUANT_TYPES = frozenset({"Linear", "Conv2d", "Conv3d", "ConvTranspose2d"})
# IFMR defaults as in the AMCT manual's sample quant.cfg.
IFMR_DEFAULTS: dict[str, float] = {
    "search_range_start": 0.7,
    "search_range_end": 1.3,
    "search_step": 0.01,
    "max_percentile": 0.999999,
    "min_percentile": 0.999999,
}


def _q(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _num(x: float) -> str:
    return f"{x:.10g}"


def _ifmr_block(indent: str, overrides: Mapping[str, Any]) -> list[str]:
    values: dict[str, Any] = {**IFMR_DEFAULTS, **overrides}
    lines = [f"{indent}ifmr_quantize : {{"]
    for key, v in values.items():
        text = ("true" if v else "false") if isinstance(v, bool) else _num(float(v))
        lines.append(f"{indent}    {key} : {text}")
    return [*lines, f"{indent}}}"]


def export_amct_cfg(resolved: ResolvedPolicy, *, batch_num: int = 1) -> ExportResult:
    """AMCT simplified PTQ config (protobuf text) for the policy's static W8A8 modules."""
    policy, modules = resolved.policy, resolved.modules
    notes: list[str] = []
    static: dict[str, QuantSpec] = {}
    skip: list[str] = []
    for name, spec in resolved.specs.items():
        if modules[name] not in AMCT_QUANT_TYPES:
            continue
        if (
            isinstance(spec, QuantSpec)
            and spec.precision == Precision.W8A8
            and not spec.timestep_bounds
        ):
            static[name] = spec
        else:
            skip.append(name)
            if isinstance(spec, QuantSpec):
                notes.append(
                    f"{name}: {spec.precision.value} has no AMCT PTQ (static) form; left float"
                )
    offsets = Counter(not s.activation_symmetric for s in static.values())
    offset = offsets[True] > offsets[False]
    overrides: list[tuple[str, dict[str, Any]]] = []
    for name, spec in static.items():
        dev: dict[str, Any] = {}
        if spec.observer == "percentile":
            dev["max_percentile"] = dev["min_percentile"] = spec.percentile / 100.0
        if (not spec.activation_symmetric) != offset:
            dev["asymmetric"] = not spec.activation_symmetric
        if dev:
            overrides.append((name, dev))
    if any(s.observer in ("mse", "kl", "minmax") for s in static.values()):
        notes.append(
            "activation ranges: AMCT calibrates with IFMR (a clip search around a percentile); "
            "the policy's minmax/mse/kl observers have no exact AMCT counterpart"
        )
    smooth = [n for n, s in static.items() if s.smoothquant]
    if smooth:
        notes.append(
            f"SmoothQuant on {len(smooth)} layer(s): AMCT's counterpart is the DMQ balancer "
            "(quantize_preprocess), not part of this file"
        )
    header = [
        f"AMCT simplified PTQ config for {policy.model} (target {policy.target}), from opsnn-quant.",
        "Format: calibration_config_pytorch.proto, see",
        "https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/amct/atlasamct_16_0131.html",
        f"{len(static)} layer(s) int8, {len(skip)} quantizable layer(s) kept float (skip_layers).",
        *notes,
    ]
    lines = [f"# {h}" for h in header]
    lines += [f"batch_num : {batch_num}", f"activation_offset : {'true' if offset else 'false'}"]
    lines += [f"skip_layers : {_q(n)}" for n in skip]
    lines += ["common_config : {", "    arq_quantize : {", "        channel_wise : true", "    }"]
    lines += [*_ifmr_block("    ", {}), "}"]
    for name, dev in overrides:
        lines += ["override_layer_configs : {", f"    layer_name : {_q(name)}"]
        lines += ["    calibration_config : {", "        arq_quantize : {"]
        lines += ["            channel_wise : true", "        }"]
        lines += [*_ifmr_block("        ", dev), "    }", "}"]
    return ExportResult("amct-cfg", "\n".join(lines) + "\n", tuple(notes), comments=True)


def _eager_key(spec: QuantSpec) -> tuple[str, bool, float | None] | None:
    alpha = spec.smoothquant_alpha
    # fields.py accepts smooth_strength only as a float strictly inside (0, 1).
    if alpha is not None and (alpha == "auto" or not 0.0 < float(alpha) < 1.0):
        return None
    a = None if alpha is None else float(alpha)
    if spec.precision == Precision.W8A8:
        return ("tensor", spec.activation_symmetric, a)
    if spec.precision == Precision.W8A8_DYNAMIC:
        return ("token", True, a)  # DynamicQuant is symmetric per token
    return ("none", True, None)  # w8a16: weights only


def export_amct_eager(resolved: ResolvedPolicy, *, batch_num: int = 1) -> ExportResult:
    """Config dict of AMCT's eager ``quantize(model, config)`` as JSON.

    AMCT applies one ``quant_cfg`` and one algorithm to every layer, and skips a layer when any
    ``skip_layers`` entry is a substring of its name (``parser.check_skip_layer``). So the
    largest group of int8 Linear modules sharing one scheme is exported; every other module is
    skipped (kept float) and listed in the notes.
    """
    modules = resolved.modules
    notes: list[str] = []
    groups: dict[tuple[Any, ...], list[str]] = {}
    specs: dict[str, QuantSpec] = {}
    for name, spec in resolved.specs.items():
        if not isinstance(spec, QuantSpec):
            continue
        specs[name] = spec
        if modules[name] != "Linear":
            notes.append(f"{name} ({modules[name]}): exported for Linear only; left float")
            continue
        if spec.precision == Precision.W4A16 or spec.timestep_bounds:
            what = (
                "w4a16 (int4 weights)" if spec.precision == Precision.W4A16 else "per-step scales"
            )
            notes.append(f"{name}: {what} has no AMCT eager form; left float")
            continue
        key = _eager_key(spec)
        if key is None:
            notes.append(
                f"{name}: SmoothQuant alpha {spec.smoothquant_alpha!r} is not a float in (0, 1); left float"
            )
            continue
        groups.setdefault(key, []).append(name)
    key, chosen = max(groups.items(), key=lambda kv: len(kv[1]), default=(None, []))
    for other, names in groups.items():
        if other != key:
            notes.append(
                f"{len(names)} module(s) with another scheme left float: {', '.join(names[:5])}"
            )
    chosen_set = set(chosen)
    skip = [n for n, t in modules.items() if t in ("Linear", "Conv2d") and n not in chosen_set]
    while True:  # a skip entry that is a substring of a chosen name would skip that one too
        clash = [c for c in chosen if c in chosen_set and any(s in c for s in skip)]
        if not clash:
            break
        for c in clash:
            chosen_set.discard(c)
            skip.append(c)
            notes.append(f"{c}: a skip_layers entry is a substring of its name; left float")
    position = {n: i for i, n in enumerate(modules)}
    skip.sort(key=position.__getitem__)
    cfg: dict[str, Any] = {"batch_num": batch_num, "quant_cfg": {}}
    cfg["quant_cfg"]["weights"] = {"type": "int8", "symmetric": True, "strategy": "channel"}
    if key is not None and key[0] != "none":
        strategy, symmetric, _ = key
        cfg["quant_cfg"]["inputs"] = {"type": "int8", "symmetric": symmetric, "strategy": strategy}
        if strategy == "tensor":
            # AMCT's eager static ranges come from its algorithm (minmax/smoothquant), not from
            # the policy's observer: the module stays int8, with another range estimate.
            odd = [n for n in chosen if n in chosen_set and specs[n].observer != "minmax"]
            if odd:
                notes.append(
                    f"observer other than minmax on {', '.join(odd[:5])}: AMCT calibrates them with its algorithm"
                )
    alpha = None if key is None else key[2]
    cfg["algorithm"] = {"smoothquant": {"smooth_strength": alpha}} if alpha else {"minmax": {}}
    cfg["skip_layers"] = skip
    return ExportResult("amct-eager", json.dumps(cfg, indent=4) + "\n", tuple(notes))


# The exporter table's handlers: (fmt, resolved policy, options).


def amct_cfg(fmt: str, resolved: ResolvedPolicy, options: PolicyExportOptions) -> ExportResult:
    """``amct-cfg`` (:func:`export_amct_cfg`)."""
    return export_amct_cfg(resolved, batch_num=options.batch_num)


def amct_eager(fmt: str, resolved: ResolvedPolicy, options: PolicyExportOptions) -> ExportResult:
    """``amct-eager`` (:func:`export_amct_eager`)."""
    return export_amct_eager(resolved, batch_num=options.batch_num)
