"""Quantized checkpoints: ``model.safetensors`` + ``description.json`` (like msModelSlim's).

``model.safetensors`` holds, for every quantized module, its int8 weight, int32 ``quant_bias``,
fp32 scales, packed int64 ``deq_scale_packed``, activation scale/offset and SmoothQuant vectors,
under the module's dotted name; for every int8 attention module (precision ``a8``), its
``attn_scales`` ((groups, 3) float32: query, key, value; (groups, 3, N_kv) per head), described under ``attention`` (the key
is left out of a checkpoint without one). Float modules are not stored: :func:`load_quantized` rebuilds the
quantized model from the float model it came from, and checks every shape.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import nn

from opsnn_quant.core.safetensors_header import read_safetensors_header
from opsnn_quant.errors import CheckpointError, ConfigError
from opsnn_quant.models.offload import offload_of
from opsnn_quant.output.files import empty_dir
from opsnn_quant.quant.attention import (
    frozen_attention,
    is_attention_module,
    quantized_attention,
)
from opsnn_quant.quant.engine import TORCH_DTYPES
from opsnn_quant.quant.modules import QuantModule, quant_module_named, set_submodule
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision
from opsnn_quant.version import __version__

if TYPE_CHECKING:
    from opsnn_quant.models.offload import BlockOffload

FORMAT = "opsnn-quant/quantized-model"
SCHEMA_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
DESCRIPTION_FILE = "description.json"


def quantized_modules(model: nn.Module) -> dict[str, QuantModule[Any]]:
    """Frozen quantized modules of ``model`` by dotted name, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantModule)}


OUTPUT_KIND = "quant"
# Keys every module entry of description.json must carry (load_quantized reads them).
MODULE_KEYS = ("type", "precision", "spec", "weight_shape")
ATTENTION_KEYS = ("type", "precision", "spec")


def save_quantized(
    model: nn.Module,
    directory: str | Path,
    *,
    source_model: str | None = None,
    extra: dict[str, Any] | None = None,
    allow_empty: bool = False,
) -> Path:
    """Write the quantized modules of ``model`` into ``directory``.

    Args:
        model: a model returned by :func:`opsnn_quant.quant.api.quantize`.
        directory: a new or empty directory (made when missing; see
            :func:`~opsnn_quant.output.files.empty_dir`).
        source_model: id of the float model (recorded in the description).
        extra: more JSON-able fields for the description (e.g. the policy's hash).
        allow_empty: write a checkpoint with no int8 module (a policy that keeps all float).

    Returns:
        The directory. Same model and inputs give byte-identical files.
    """
    modules = quantized_modules(model)
    attention = quantized_attention(model)
    if not modules and not attention and not allow_empty:
        raise CheckpointError("the model holds no quantized modules; run quantize() first")
    extra = {**(extra or {}), **_attention_section(attention)}
    off = offload_of(model)
    if off is not None:  # --max-memory: block by block, each tensor read again when written
        return _save_offloaded(model, off, modules, directory, source_model, extra, attention)
    tensors: dict[str, torch.Tensor] = {}
    described: dict[str, Any] = {}
    for name, module in modules.items():
        if not module.frozen:
            raise CheckpointError(f"module '{name}' is not frozen; finish calibration first")
        for key, value in module.state_dict().items():
            tensors[f"{name}.{key}"] = value.detach().cpu().contiguous()
        described[name] = module.describe()
    tensors |= _attention_tensors(attention)
    description = _description(described, source_model, extra)
    tmp = empty_dir(directory)
    (tmp / WEIGHTS_FILE).write_bytes(save(tensors, metadata={"format": "pt"}))
    (tmp / DESCRIPTION_FILE).write_text(json.dumps(description, indent=2, sort_keys=True) + "\n")
    return Path(directory)


def _attention_section(attention: dict[str, Any]) -> dict[str, Any]:
    """``{"attention": {name: entry}}`` for the int8 attention modules (none: nothing, so a
    checkpoint without them keeps its bytes)."""
    if not attention:
        return {}
    described = {}
    for name, module in attention.items():
        if not module.attn_frozen:
            raise CheckpointError(f"attention '{name}' is not frozen; finish calibration first")
        described[name] = {
            "type": module.attn_float_type.__name__,
            "precision": module.attn_spec.precision.value,
            "spec": module.attn_spec.to_dict(),
        }
    return {"attention": described}


def _attention_tensors(attention: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        f"{n}.attn_scales": m.attn_scales.detach().cpu().contiguous() for n, m in attention.items()
    }


def _description(
    described: dict[str, Any], source_model: str | None, extra: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "versions": {"opsnn_quant": __version__, "torch": torch.__version__},
        "source_model": source_model,
        "modules": described,
        **(extra or {}),
    }


def _save_offloaded(
    model: nn.Module,
    off: BlockOffload,
    modules: dict[str, QuantModule[Any]],
    directory: str | Path,
    source_model: str | None,
    extra: dict[str, Any] | None,
    attention: dict[str, Any],
) -> Path:
    """:func:`save_quantized` of a model whose blocks are offloaded: each block opened in
    turn for its modules' descriptions, every tensor of an offloaded block written from the
    block's file when its turn comes (one tensor in memory, not the quantized model), the
    rest from memory; the same bytes as ``safetensors.torch.save`` (the writer lays the file
    out as safetensors does)."""
    from opsnn_quant.formats.safetensors_io import LazyTensor, Tensorish, write_safetensors

    tensors: dict[str, Tensorish] = {}
    described: dict[str, Any] = {}
    with off.window():
        for name, module in modules.items():
            off.touch(name)
            if not module.frozen:
                raise CheckpointError(f"module '{name}' is not frozen; finish calibration first")
            for key, value in module.state_dict().items():
                full = f"{name}.{key}"
                if off.owner(full) is not None:
                    tensors[full] = LazyTensor(
                        value.dtype, tuple(value.shape), partial(_stored, off, full)
                    )
                else:
                    tensors[full] = value.detach().cpu().contiguous()
            described[name] = module.describe()
    tensors |= _attention_tensors(attention)
    description = _description(described, source_model, extra)
    tmp = empty_dir(directory)
    write_safetensors(tensors, tmp / WEIGHTS_FILE, {"format": "pt"})
    (tmp / DESCRIPTION_FILE).write_text(json.dumps(description, indent=2, sort_keys=True) + "\n")
    return Path(directory)


def _stored(off: BlockOffload, name: str) -> torch.Tensor:
    return off.stored(name).cpu().contiguous()


def read_description(directory: str | Path) -> dict[str, Any]:
    """Parse and check ``description.json`` of a quantized checkpoint."""
    path = Path(directory) / DESCRIPTION_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found; is {directory} a quantized checkpoint?")
    try:
        desc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(desc, dict):
        raise CheckpointError(f"{path}: a description is a JSON object")
    if desc.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format is {desc.get('format')!r}, expected {FORMAT!r}")
    if desc.get("schema_version") != SCHEMA_VERSION:
        raise CheckpointError(
            f"{path}: schema_version {desc.get('schema_version')} is not supported (expected {SCHEMA_VERSION})"
        )
    modules = desc.get("modules")
    if not isinstance(modules, dict):
        raise CheckpointError(f"{path}: 'modules' is missing or not an object")
    _check_entries(path, "module", modules, MODULE_KEYS)
    attention = desc.get("attention", {})
    if not isinstance(attention, dict):
        raise CheckpointError(f"{path}: 'attention' is not an object")
    _check_entries(path, "attention", attention, ATTENTION_KEYS)
    return dict(desc)


def _check_entries(path: Path, what: str, entries: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Every entry of a description section is an object with ``keys``."""
    for name, entry in entries.items():
        missing = [k for k in keys if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise CheckpointError(f"{path}: {what} '{name}' lacks {', '.join(missing)}")


def expected_state(
    module: QuantModule[Any], smoothed: bool
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Frozen state keys -> (shape, dtype) that ``module.freeze()`` produces (bias excluded)."""
    n, k = module.out_n, module.in_k
    exp: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "weight": (module.int8_weight_shape(), torch.int8),
        "weight_quantizer.scale": ((n,), torch.float32),
    }
    if module.spec.precision == Precision.W4A16:
        group = module.spec.group_size or 0
        exp["weight"] = (module.int8_weight_shape(), torch.int32)  # int4 packed eight per word
        exp["weight_quantizer.scale"] = ((-(-k // group), n), torch.float32)
    if module.spec.static_activations:
        bounds = module.spec.timestep_bounds
        g: tuple[int, ...] = (len(bounds),) if bounds else ()  # a row per group of steps
        exp |= {
            "quant_bias": ((*g, n), torch.int32),
            "deq_scale": ((*g, n), torch.float32),
            "deq_scale_packed": ((*g, n), torch.int64),
            "input_quantizer.scale": (g, torch.float32),
            "input_quantizer.offset": (g, torch.float32),
            "input_quantizer.inv_scale": ((*g, k if smoothed else 1), torch.float32),
        }
        if bounds:
            exp["input_quantizer.step_bounds"] = (g, torch.int64)
    if smoothed:
        exp["input_quantizer.smooth"] = ((k,), torch.float32)
        smoothing = module.spec.engine_def.smoothing
        if smoothing == "mul_scale":  # MindIE-SD's mul_scale, in the engine dtype
            exp["input_quantizer.mul_scale"] = ((k,), TORCH_DTYPES[module.spec.output_dtype])
        elif smoothing == "multiplier" and not module.spec.static_activations:
            exp["input_quantizer.smooth_scales"] = ((k,), torch.float32)
    return exp


@torch.no_grad()
def load_frozen(
    module: QuantModule[Any], state: dict[str, torch.Tensor], alpha: float | None = None
) -> None:
    """Make a freshly built ``module`` frozen with its saved state (the tensors under its name).

    Raises:
        CheckpointError: a key is missing or unexpected, or a shape/dtype differs.
    """
    smoothed = "input_quantizer.smooth" in state
    expected = expected_state(module, smoothed)
    if not module.spec.static_activations and "bias" in state:
        expected["bias"] = ((module.out_n,), torch.float32)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"module '{module.qname}': checkpoint keys missing {missing}, unexpected {unexpected}"
        )
    for key, (shape, dtype) in expected.items():
        t = state[key]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise CheckpointError(
                f"module '{module.qname}': '{key}' is {tuple(t.shape)} {t.dtype} in the "
                f"checkpoint, expected {shape} {dtype}"
            )
    del module.weight
    del module.bias
    module.bias = None
    iq = module.input_quantizer
    iq.observer, iq.stats = None, None
    if smoothed:
        del iq.smooth
    for key, t in state.items():
        owner: nn.Module = module
        attr = key
        if "." in key:
            sub, attr = key.split(".", 1)
            owner = getattr(module, sub)
        if attr in owner._buffers:
            owner._buffers[attr] = t.clone()
        else:
            if attr == "bias":
                del module.bias
            owner.register_buffer(attr, t.clone())
    if smoothed:
        iq.chosen_alpha = alpha
    module.frozen = True


def load_quantized(float_model: nn.Module, directory: str | Path) -> nn.Module:
    """Rebuild the quantized model from its float model and a checkpoint (in place).

    Raises:
        CheckpointError: missing/corrupt files, or a module whose name, type or shape differs.
    """
    desc = read_description(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found")
    read_safetensors_header(weights, error=CheckpointError)  # before a byte of data is read
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights} cannot be read: {exc}") from exc
    modules = dict(float_model.named_modules())
    for name, entry in desc["modules"].items():
        if name not in modules:
            raise CheckpointError(f"checkpoint module '{name}' does not exist in the model")
        qtype = quant_module_named(str(entry.get("type", "")))
        if qtype is None:
            raise CheckpointError(
                f"checkpoint module '{name}' has unknown type {entry.get('type')!r}"
            )
        ftype = qtype.float_type
        float_module = modules[name]
        if type(float_module) is not ftype:
            raise CheckpointError(
                f"module '{name}' is a {type(float_module).__name__} in the model but a "
                f"{ftype.__name__} in the checkpoint"
            )
        float_weight: torch.Tensor = getattr(float_module, "weight")  # noqa: B009
        fshape = list(float_weight.shape)
        if fshape != entry["weight_shape"]:
            raise CheckpointError(
                f"module '{name}': weight shape {fshape} in the model, "
                f"{entry['weight_shape']} in the checkpoint"
            )
        spec = QuantSpec.from_dict(entry["spec"])
        q = qtype.from_float(float_module, spec, name)
        prefix = f"{name}."
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        load_frozen(q, state, alpha=entry.get("smoothquant_alpha"))
        q.to(float_weight.device)
        set_submodule(float_model, name, q)
    _load_attention(float_model, desc.get("attention", {}), tensors, modules)
    return float_model


def _load_attention(
    model: nn.Module,
    described: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    modules: dict[str, nn.Module],
) -> None:
    """Convert and freeze each attention module the checkpoint describes, with its scales."""
    for name, entry in described.items():
        module = modules.get(name)
        if module is None or not is_attention_module(module):
            raise CheckpointError(
                f"checkpoint attention '{name}' is no attention module of the model"
            )
        if type(module).__name__ != entry["type"]:
            raise CheckpointError(
                f"attention '{name}' is a {type(module).__name__} in the model but a "
                f"{entry['type']} in the checkpoint"
            )
        scales = tensors.get(f"{name}.attn_scales")
        if scales is None or scales.dtype != torch.float32:
            raise CheckpointError(f"attention '{name}': no float32 attn_scales in the checkpoint")
        try:
            spec = QuantSpec.from_dict(dict(entry["spec"]))
            frozen_attention(module, spec, name, scales)
        except ConfigError as exc:
            raise CheckpointError(f"attention '{name}': {exc}") from exc
