"""``msmodelslim-v1``: the policy as msModelSlim's one-click ``modelslim_v1`` YAML.

A user runs msModelSlim with our choices on an NPU::

    msmodelslim quant --model_path FLOAT_MODEL --save_path OUT --model_type TYPE \\
        --config_path msmodelslim_v1.yaml

Every field follows msModelSlim (commit 3de0a3c4, 2026-07-02), its pydantic models being the
schema (where the Chinese docs disagree we follow the code, which validates the file):

* ``apiversion``: ``modelslim_v1`` (``BaseQuantConfig``, ``core/quant_service/interface.py``;
  ``docs/zh/user_guide/feature_guide/quick_quantization_v1/usage.md`` §6.1.2); for a diffusion
  pipeline ``multimodal_sd_modelslim_v1`` (§6.3), which quantizes the denoiser only
  (``core/quant_service/multimodal_sd_v1/quant_config.py``), names relative to it.
* ``spec.process``: one ``linear_quant`` per scheme (``processor/quant/linear.py``
  ``LinearProcessorConfig``: ``qconfig``, ``include``, ``exclude``; globs matched with
  ``wcmatch.fnmatch`` in ``utils/config_map.py``; docs ``quantization_algorithms/linear_quant.md``).
  The four ``QConfig`` fields are all written: the code requires them (``core/quantizer/base.py``),
  the doc lists defaults that the code does not have.
* act/weight ``(scope, dtype, symmetric, method)`` are those of msModelSlim's Linear IR registry
  (``msmodelslim/ir/*.py``): W8A8 = int8 per_tensor act + int8 per_channel symmetric weight
  (``w8a8_static.py``), W8A8_DYNAMIC = int8 per_token symmetric act, W8A16 = float per_tensor
  act with method ``none`` (``w8a16_static.py``).
* SmoothQuant: ``smooth_quant`` (``processor/anti_outlier/smooth_quant/processor.py``: ``alpha``,
  ``symmetric``, ``include``; norm-linear subgraphs only) per fixed alpha, ``flex_smooth_quant``
  with ``alpha: null`` (searched) for ``auto``, placed before ``linear_quant`` (usage.md §6.2.4:
  outlier suppression first).
* Attention in int8 (``a8``): one ``fa3_quant`` (``processor/quant/fa3/processor.py``
  ``FA3QuantProcessorConfig``: ``qconfig``, ``include``, ``exclude``; its default qconfig int8
  per_head symmetric minmax, l.68-71) over the attention modules, which msModelSlim's model
  adapter instruments (``inject_fa3_placeholders``: ``fa3_q``/``fa3_k``/``fa3_v`` placeholders in
  each attention whose full name ``include`` matches, ``model/flux1/model_adapter.py``
  l.277-287); the saver writes ``<attention>.fa3_q.scale`` (H, 1) float32 and a zero int8
  offset tagged ``FAQuant`` (``save/ascendv1.py`` ``_save_activation_per_head`` l.550-558).
  msModelSlim calibrates its own per-head scales (ratio 0.9999 on the query and key of FLUX);
  ours (per tensor, or per key/value head) are not carried over, and K-mean smoothing and
  per-step scales it has not: said in the notes.
* ``spec.save``: ``ascendv1_saver`` (``format/registry.py``) with ``part_file_size: 0``, one
  weights file (MindIE-SD opens exactly one).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from opsnn_quant.formats.result import ExportResult
from opsnn_quant.policy.schema import PrecisionPolicy, ResolvedPolicy
from opsnn_quant.quant.spec import ATTENTION_TYPE, QuantSpec
from opsnn_quant.types import Modality, Precision

if TYPE_CHECKING:
    from opsnn_quant.formats.result import PolicyExportOptions

# msModelSlim's activation methods are minmax and histogram (linear_quant.md): our clip
# searches (percentile, mse, kl) map to its histogram search, the closest it has.
_ACT_METHOD = {"minmax": "minmax", "percentile": "histogram", "mse": "histogram", "kl": "histogram"}
_WEIGHT = {"scope": "per_channel", "dtype": "int8", "symmetric": True, "method": "minmax"}


def _act(spec: QuantSpec) -> dict[str, Any]:
    if spec.precision == Precision.W8A8:
        return {"scope": "per_tensor", "dtype": "int8",
                "symmetric": spec.activation_symmetric, "method": _ACT_METHOD[spec.observer]}  # fmt: skip
    if spec.precision == Precision.W8A8_DYNAMIC:  # the per-token Linear IR is symmetric only
        return {"scope": "per_token", "dtype": "int8", "symmetric": True, "method": "minmax"}
    return {"scope": "per_tensor", "dtype": "float", "symmetric": True, "method": "none"}


def _cover(chosen: set[str], linears: list[str]) -> list[str]:
    """The fewest globs (``<prefix>.*``, or exact names) that match exactly ``chosen`` among
    ``linears``: a subtree glob only where every Linear below is chosen."""
    from opsnn_quant.policy._compress import exact, subtree_glob

    out: list[str] = []

    def walk(prefix: str, names: list[str]) -> None:
        if all(n in chosen for n in names):
            out.append(subtree_glob(prefix) if prefix or len(names) > 1 else exact(names[0]))
            return
        children: dict[str, list[str]] = {}
        for n in names:
            rest = n[len(prefix) + 1 :] if prefix else n
            head = rest.split(".", 1)[0]
            children.setdefault(f"{prefix}.{head}" if prefix else head, []).append(n)
        for child, below in children.items():
            if not any(n in chosen for n in below):
                continue
            if below == [child]:
                out.append(exact(child))
            else:
                walk(child, below)

    if chosen:
        walk("", linears)
    return out


def _denoiser_prefix(policy: PrecisionPolicy) -> str | None:
    prefixes = [p for p, m in policy.modalities.items() if m == Modality.DENOISER and p]
    return prefixes[0] if len(prefixes) == 1 and len(policy.modalities) > 1 else None


def export_msmodelslim(resolved: ResolvedPolicy) -> ExportResult:
    """The policy's int8 Linear modules as a ``modelslim_v1`` one-click YAML (see module doc)."""
    policy, modules = resolved.policy, resolved.modules
    notes: list[str] = []
    prefix = _denoiser_prefix(policy)
    scope = (lambda n: n == prefix or n.startswith(f"{prefix}.")) if prefix else (lambda n: True)
    rel = (lambda n: n[len(prefix) + 1 :]) if prefix else (lambda n: n)
    linears = [n for n in modules if modules[n] == "Linear" and scope(n)]
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    smooth: dict[str, list[str]] = {}
    floats: dict[str, list[str]] = {}  # reason -> modules
    attention: list[str] = []
    for name, spec in resolved.specs.items():
        if not isinstance(spec, QuantSpec):
            continue
        reason = None
        if modules[name] == ATTENTION_TYPE and scope(name):
            attention.append(rel(name))
            for differs in _fa3_differences(spec):
                floats.setdefault(differs, []).append(name)
            continue
        if modules[name] != "Linear":
            reason = "msModelSlim's linear_quant quantizes nn.Linear only; they stay float"
        elif not scope(name):
            reason = f"multimodal_sd_modelslim_v1 quantizes the denoiser ({prefix}) only; they stay float"
        elif spec.precision == Precision.W8A8 and spec.observer != "minmax":
            floats.setdefault(f"observer {spec.observer} -> msModelSlim's histogram method", [])
            floats[f"observer {spec.observer} -> msModelSlim's histogram method"].append(name)
        if reason is not None:
            floats.setdefault(reason, []).append(name)
            continue
        qconfig = {"act": _act(spec), "weight": _WEIGHT}
        groups.setdefault(json.dumps(qconfig, sort_keys=True), (qconfig, []))[1].append(rel(name))
        if spec.smoothquant_alpha is not None:
            smooth.setdefault(str(spec.smoothquant_alpha), []).append(rel(name))
    if attention:
        notes.append(
            f"{len(attention)} attention module(s) in int8: msModelSlim's fa3_quant calibrates its "
            "own per-head scales where its model adapter installs FA3 placeholders (FLUX, "
            "Wan2.2, HunyuanVideo, ...); ours (per tensor, or per key/value head) are not "
            "carried over; its FLUX adapter says it supports dynamic FA quantization only "
            "(model/flux1/model_adapter.py l.278), where this static per-head step may not run"
        )
    for reason, members in floats.items():
        shown = ", ".join(members[:3]) + (f", +{len(members) - 3}" if len(members) > 3 else "")
        notes.append(f"{len(members)} int8 module(s) ({shown}): {reason}")
    names = [rel(n) for n in linears]
    lines = _header(policy, prefix, notes)
    lines += ["spec:", "  process:"]
    for alpha, members in smooth.items():
        lines += _smooth_block(alpha, _cover(set(members), names))
    for i, (qconfig, members) in enumerate(sorted(groups.values(), key=lambda g: -len(g[1]))):
        include, exclude = _cover(set(members), names), []
        if i == 0:  # the largest group: "*" minus the others, when that is shorter
            rest = _cover(set(names) - set(members), names)
            if len(rest) + 1 < len(include):
                include, exclude = ["*"], rest
        lines += _linear_block(qconfig, include, exclude)
    if attention:
        # exact names: a glob would also reach an attention class of the model we keep float
        # (the adapter injects into every module whose class name holds "Attention")
        lines += _fa3_block(attention)
    if not groups and not attention:
        lines.append("    []  # no int8 Linear in the policy")
        notes.append("the policy has no int8 Linear: msModelSlim would have nothing to quantize")
    lines += ["  save:", '    - type: "ascendv1_saver"  # format/registry.py',
              "      part_file_size: 0  # GB per shard; 0 = one file (MindIE-SD opens one)"]  # fmt: skip
    if prefix:
        lines += _sd_block()
    return ExportResult("msmodelslim-v1", "\n".join(lines) + "\n", tuple(notes), comments=True)


def _fa3_differences(spec: QuantSpec) -> list[str]:
    """What msModelSlim's FA3 does not reproduce of an ``a8`` spec (notes)."""
    out = []
    if spec.k_mean:
        out.append("K-mean smoothing: msModelSlim's fa3_quant has none (the key as it is)")
    if spec.timestep_bounds:
        out.append("per-step attention scales: msModelSlim's fa3_quant keeps one per head")
    return out


def _fa3_block(include: list[str]) -> list[str]:
    return ['    - type: "fa3_quant"  # processor/quant/fa3/processor.py FA3QuantProcessorConfig',
            "      qconfig:  # its default: int8 per-head symmetric min-max (l.68-71)",
            '        scope: "per_head"', '        dtype: "int8"', "        symmetric: true",
            '        method: "minmax"',
            "      include:  # attention modules by full name (inject_fa3_placeholders)",
            *[f"        - {_q(p)}" for p in include], "      exclude: []"]  # fmt: skip


def _q(s: str) -> str:
    return json.dumps(s)


def _header(policy: PrecisionPolicy, prefix: str | None, notes: list[str]) -> list[str]:
    api = "multimodal_sd_modelslim_v1" if prefix else "modelslim_v1"
    lines = [
        f"# msModelSlim one-click config for {policy.model} (target {policy.target}), from opsnn-quant.",
        "# Run on the NPU: msmodelslim quant --model_path FLOAT_MODEL --save_path OUT \\",
        "#     --model_type TYPE --config_path msmodelslim_v1.yaml   (usage.md §4)",
    ]
    if prefix:
        lines.append(
            f"# Module names are relative to the denoiser '{prefix}' (the part msModelSlim quantizes)."
        )
    lines += [f"# {n}" for n in notes[:50]]
    lines += [
        f"apiversion: {api}  # BaseQuantConfig.apiversion (core/quant_service/interface.py)",
        "metadata:  # practice metadata (core/practice/interface.py Metadata)",
        f"  config_id: {_q('opsnn-quant-' + policy.model.replace(':', '-').replace('/', '-'))}",
        "  label: {w_bit: 8, a_bit: 8, is_sparse: false, kv_cache: false}",
    ]
    return lines


def _smooth_block(alpha: str, include: list[str]) -> list[str]:
    if alpha == "auto":  # alpha/beta null: searched (flex_smooth/processor.py)
        head = ['    - type: "flex_smooth_quant"  # processor/anti_outlier/flex_smooth/processor.py',
                "      alpha: null", "      beta: null"]  # fmt: skip
    else:
        head = ['    - type: "smooth_quant"  # processor/anti_outlier/smooth_quant/processor.py',
                f"      alpha: {float(alpha)}  # our SmoothQuant migration strength",
                "      symmetric: true"]  # fmt: skip
    return [*head, "      include:", *[f"        - {_q(p)}" for p in include]]


def _linear_block(qconfig: dict[str, Any], include: list[str], exclude: list[str]) -> list[str]:
    lines = ['    - type: "linear_quant"  # processor/quant/linear.py LinearProcessorConfig',
             "      qconfig:  # core/quantizer/linear.py LinearQConfig"]  # fmt: skip
    for side in ("act", "weight"):
        c = qconfig[side]
        lines += [f"        {side}:  # QConfig (core/quantizer/base.py): all four fields required",
                  f"          scope: {_q(c['scope'])}", f"          dtype: {_q(c['dtype'])}",
                  f"          symmetric: {'true' if c['symmetric'] else 'false'}",
                  f"          method: {_q(c['method'])}"]  # fmt: skip
    lines += ["      include:  # fnmatch globs (utils/config_map.py ConfigSet)"]
    lines += [f"        - {_q(p)}" for p in include]
    lines += ["      exclude:" + (" []" if not exclude else "")]
    lines += [f"        - {_q(p)}" for p in exclude]
    return lines


def _sd_block() -> list[str]:
    return [
        "  multimodal_sd_config:  # multimodal_sd_v1/quant_config.py; usage.md §6.3",
        "    dump_config:  # DumpConfig: calibration inputs captured from the pipeline",
        "      enable_dump: true",
        '      capture_mode: "args"',
        '      dump_data_dir: ""  # "" = save_path',
    ]


def msmodelslim_v1(
    fmt: str, resolved: ResolvedPolicy, options: PolicyExportOptions
) -> ExportResult:
    """The exporter table's handler of ``msmodelslim-v1`` (:func:`export_msmodelslim`)."""
    return export_msmodelslim(resolved)
