"""Quantized checkpoints: ``model.safetensors`` + ``description.json`` (like msModelSlim's).

``model.safetensors`` holds, for every quantized module, its int8 weight, int32 ``quant_bias``,
fp32 scales, packed int64 ``deq_scale_packed``, activation scale/offset and SmoothQuant vectors,
under the module's dotted name. Float modules are not stored: :func:`load_quantized` rebuilds the
quantized model from the float model it came from, and checks every shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import nn

import opsnn_quant
from opsnn_quant.errors import CheckpointError
from opsnn_quant.io import atomic_dir
from opsnn_quant.quant.modules import QuantConv2d, QuantLinear, _QuantMatmul
from opsnn_quant.quant.spec import QuantSpec

FORMAT = "opsnn-quant/quantized-model"
SCHEMA_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
DESCRIPTION_FILE = "description.json"
_TYPES: dict[str, tuple[type[_QuantMatmul], type[nn.Module]]] = {
    "QuantLinear": (QuantLinear, nn.Linear),
    "QuantConv2d": (QuantConv2d, nn.Conv2d),
}


def quantized_modules(model: nn.Module) -> dict[str, _QuantMatmul]:
    """Frozen quantized modules of ``model`` by dotted name, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, _QuantMatmul)}


OUTPUT_KIND = "quant"
# Keys every module entry of description.json must carry (load_quantized reads them).
MODULE_KEYS = ("type", "precision", "spec", "weight_shape")


def save_quantized(
    model: nn.Module,
    directory: str | Path,
    *,
    source_model: str | None = None,
    extra: dict[str, Any] | None = None,
    allow_empty: bool = False,
    force: bool = False,
) -> Path:
    """Write the quantized modules of ``model`` to ``directory`` (atomically).

    Args:
        model: a model returned by :func:`opsnn_quant.quant.api.quantize`.
        directory: output directory (replaced as a whole).
        source_model: id of the float model (recorded in the description).
        extra: more JSON-able fields for the description (e.g. the policy's hash).
        allow_empty: write a checkpoint with no int8 module (a policy that keeps all float).
        force: replace ``directory`` even when it is not a quantized checkpoint (by default only
            an empty directory or an earlier checkpoint is replaced).

    Returns:
        The directory. Same model and inputs give byte-identical files.
    """
    modules = quantized_modules(model)
    if not modules and not allow_empty:
        raise CheckpointError("the model holds no quantized modules; run quantize() first")
    tensors: dict[str, torch.Tensor] = {}
    described: dict[str, Any] = {}
    for name, module in modules.items():
        if not module.frozen:
            raise CheckpointError(f"module '{name}' is not frozen; finish calibration first")
        for key, value in module.state_dict().items():
            tensors[f"{name}.{key}"] = value.detach().cpu().contiguous()
        described[name] = module.describe()
    description = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "versions": {"opsnn_quant": opsnn_quant.__version__, "torch": torch.__version__},
        "source_model": source_model,
        "modules": described,
        **(extra or {}),
    }
    with atomic_dir(directory, OUTPUT_KIND, force=force) as tmp:
        (tmp / WEIGHTS_FILE).write_bytes(save(tensors, metadata={"format": "pt"}))
        (tmp / DESCRIPTION_FILE).write_text(
            json.dumps(description, indent=2, sort_keys=True) + "\n"
        )
    return Path(directory)


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
    for name, entry in modules.items():
        missing = [k for k in MODULE_KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise CheckpointError(f"{path}: module '{name}' lacks {', '.join(missing)}")
    return dict(desc)


def load_quantized(float_model: nn.Module, directory: str | Path) -> nn.Module:
    """Rebuild the quantized model from its float model and a checkpoint (in place).

    Raises:
        CheckpointError: missing/corrupt files, or a module whose name, type or shape differs.
    """
    desc = read_description(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights} cannot be read: {exc}") from exc
    modules = dict(float_model.named_modules())
    for name, entry in desc["modules"].items():
        if name not in modules:
            raise CheckpointError(f"checkpoint module '{name}' does not exist in the model")
        qtype, ftype = _TYPES.get(entry.get("type", ""), (None, None))
        if qtype is None or ftype is None:
            raise CheckpointError(
                f"checkpoint module '{name}' has unknown type {entry.get('type')!r}"
            )
        float_module = modules[name]
        if type(float_module) is not ftype:
            raise CheckpointError(
                f"module '{name}' is a {type(float_module).__name__} in the model but a "
                f"{ftype.__name__} in the checkpoint"
            )
        fshape = list(getattr(float_module, "weight").shape)  # noqa: B009
        if fshape != entry["weight_shape"]:
            raise CheckpointError(
                f"module '{name}': weight shape {fshape} in the model, "
                f"{entry['weight_shape']} in the checkpoint"
            )
        spec = QuantSpec.from_dict(entry["spec"])
        q = qtype.from_float(float_module, spec, name)  # type: ignore[attr-defined]
        prefix = f"{name}."
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        q.load_frozen(state, alpha=entry.get("smoothquant_alpha"))
        q.to(float_module.weight.device)
        parent_name, _, child = name.rpartition(".")
        parent = float_model.get_submodule(parent_name) if parent_name else float_model
        setattr(parent, child, q)
    return float_model
