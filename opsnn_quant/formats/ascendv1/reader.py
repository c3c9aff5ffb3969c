"""Read and check an AscendV1 directory (ours or msModelSlim's) without loading its tensors.

:func:`read_ascendv1` finds the description and the weights, reads every safetensors header
(:mod:`opsnn_quant.formats.safetensors_io`), and checks the whole directory against the tensor
contract (:mod:`opsnn_quant.formats.ascendv1.contract`) before any tensor is read: every tensor the
description names is in the weights and the reverse, every type is known and supported, and every
quantized Linear has the tensors, dtypes and shapes its type needs. The first problem is one
:class:`~opsnn_quant.formats.ascendv1.contract.AscendV1Error` line naming the tensor.

File names accepted (the sources spell them three ways, ``ascendv1.md`` §1): the description
``quant_model_description.json``, else one ``quant_model_description_<type>.json`` (MindIE-SD and
v0 naming); weights: an index ``quant_model_weight*.safetensors.index.json``, else every
``quant_model_weight*.safetensors`` file.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from opsnn_quant.formats.ascendv1.contract import (
    CONTRACT,
    DESCRIPTION_FILE,
    GLOBAL_KEYS,
    KNOWN_TYPES,
    SUPPORTED_TYPES,
    AscendV1Error,
    check_linear,
    linear_prefixes,
)
from opsnn_quant.formats.ascendv1.vllm_prefixes import aliased_key, is_alias
from opsnn_quant.formats.safetensors_io import TensorFiles, open_tensor_files

PARAMS_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class QuantLinearEntry:
    """One quantized Linear of the checkpoint.

    Attributes:
        qtype: its AscendV1 type.
        n, k: outputs and inputs.
        suffixes: the tensors it has (``weight``, ``deq_scale``...).
        per_group: weight scales per group of ``group_size`` inputs.
    """

    qtype: str
    n: int
    k: int
    suffixes: tuple[str, ...]
    per_group: bool


@dataclass
class AscendV1Checkpoint:
    """A checked AscendV1 directory.

    Attributes:
        directory: where it is.
        description: the parsed description (tensor names -> types, plus the global keys).
        tensors: the weights (header info and lazy reads).
        linears: quantized Linear prefix -> entry.
        group_size: the description's ``group_size``.
        floats: names of the tensors that belong to no quantized Linear.
    """

    directory: Path
    description: dict[str, Any]
    tensors: TensorFiles
    linears: dict[str, QuantLinearEntry] = field(default_factory=dict)
    group_size: int = 0
    floats: list[str] = field(default_factory=list)

    def load(self, name: str) -> torch.Tensor:
        """One tensor of the checkpoint."""
        return self.tensors.load(name)

    def params_dtype(self, float_config: Path | None = None) -> torch.dtype:
        """The model dtype the engine runs the quantized Linears in (their output dtype).

        In order: our own ``metadata.opsnn_quant.params_dtype``; a W8A8 ``deq_scale``'s dtype
        (int64 only for fp16 models, float32 for bf16: msModelSlim's ``deqscale2int64_by_dtype``,
        and vLLM-Ascend's ``deq_scale`` parameter, ``methods/w8a8_static.py:66-69``); else what
        ``vllm serve --dtype auto`` runs it in (:func:`~opsnn_quant.formats.ascendv1.vllm_dtype.
        auto_dtype`) from the directory's ``config.json``, or where it has none from
        ``float_config`` (the float model's, which a user copies beside msModelSlim's files to
        serve them: its savers write none): bfloat16 for a float32 model or one whose config
        names no dtype.
        """
        from opsnn_quant.formats.ascendv1.vllm_dtype import auto_dtype

        meta = self.description.get("metadata")
        ours = meta.get("opsnn_quant") if isinstance(meta, dict) else None
        if isinstance(ours, dict) and ours.get("params_dtype") in PARAMS_DTYPES:
            return PARAMS_DTYPES[ours["params_dtype"]]
        for prefix, entry in self.linears.items():
            if "deq_scale" in entry.suffixes:
                dtype = self.tensors.info[f"{prefix}.deq_scale"][0]
                return torch.float16 if dtype == torch.int64 else torch.bfloat16
        own = self.directory / "config.json"
        path = own if own.is_file() else float_config
        doc: Any = None
        if path is not None and path.is_file():
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                doc = None
        tensor_dtypes = {info[0] for info in self.tensors.info.values()}
        return auto_dtype(doc if isinstance(doc, dict) else None, tensor_dtypes)


def find_description(directory: Path) -> Path | None:
    """The description file of ``directory`` (None: there is none)."""
    main = directory / DESCRIPTION_FILE
    if main.is_file():
        return main
    found = sorted(directory.glob("quant_model_description_*.json"))
    return found[0] if len(found) == 1 else None


def is_ascendv1_dir(directory: Path) -> bool:
    """Whether ``directory`` holds an AscendV1 description."""
    return directory.is_dir() and find_description(directory) is not None


def _read_description(directory: Path) -> dict[str, Any]:
    path = find_description(directory)
    if path is None:
        raise AscendV1Error(f"{directory}: no {DESCRIPTION_FILE}; not an AscendV1 directory")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AscendV1Error(f"{path}: not valid JSON") from exc
    if not isinstance(doc, dict):
        raise AscendV1Error(f"{path}: the description must be a JSON object")
    return doc


def _tensor_files(directory: Path) -> TensorFiles:
    indexes = sorted(directory.glob("quant_model_weight*.safetensors.index.json"))
    if len(indexes) > 1:
        raise AscendV1Error(f"{directory}: more than one weights index ({indexes[0].name}, ...)")
    files = sorted(directory.glob("quant_model_weight*.safetensors"))
    if not indexes and not files:
        raise AscendV1Error(f"{directory}: no quant_model_weights*.safetensors")
    return open_tensor_files(directory, indexes[0] if indexes else None, files, error=AscendV1Error)


def _tensor_types(description: dict[str, Any]) -> dict[str, str]:
    """Tensor name -> type: every key but the global ones, per-attention ``.quant_type`` and the
    vLLM prefix aliases (:mod:`opsnn_quant.formats.ascendv1.vllm_prefixes`; checked against their keys)."""
    out: dict[str, str] = {}
    for key, value in description.items():
        if key in GLOBAL_KEYS or key.endswith(".quant_type"):
            continue
        if is_alias(key):
            target = aliased_key(key)
            if target is None or description.get(target) != value:
                why = (
                    "no checkpoint key"
                    if target is None
                    else f"{target} ({description.get(target)!r})"
                )
                raise AscendV1Error(f"{key}: a vLLM prefix alias of {why}, typed {value!r}")
            continue
        if not isinstance(value, str):
            raise AscendV1Error(f"{key}: its quant type must be a string, got {value!r}")
        if value not in KNOWN_TYPES:
            raise AscendV1Error(f"{key}: unknown quant type {value!r}")
        if value not in SUPPORTED_TYPES:
            raise AscendV1Error(
                f"{key}: quant type {value} is not supported here (supported: "
                f"{', '.join(SUPPORTED_TYPES)})"
            )
        out[key] = value
    return out


def read_ascendv1(directory: str | Path) -> AscendV1Checkpoint:
    """Read and check an AscendV1 directory (no tensor data is read but small offset vectors).

    Raises:
        AscendV1Error: see the module docstring.
    """
    root = Path(directory)
    if not root.is_dir():
        raise AscendV1Error(f"{root}: not a directory")
    description = _read_description(root)
    types = _tensor_types(description)
    files = _tensor_files(root)
    for name in sorted(types):
        if name not in files.info:
            raise AscendV1Error(f"{name}: named in the description but not in the weights")
    for name in sorted(files.info):
        if name not in types:
            raise AscendV1Error(f"{name}: in the weights but not in the description")
    group = description.get("group_size", 0)
    if not isinstance(group, int) or group < 0:
        raise AscendV1Error(f"group_size must be a non-negative integer, got {group!r}")
    prefixes = linear_prefixes(types)
    members: dict[str, dict[str, Any]] = defaultdict(dict)
    floats = []
    for name, info in files.info.items():
        prefix, _, suffix = name.rpartition(".")
        if prefix in prefixes and suffix in CONTRACT[prefixes[prefix]]:
            qtype = prefixes[prefix]
            if types[name] not in (qtype, "FLOAT") or (types[name] == "FLOAT" and suffix != "bias"):
                raise AscendV1Error(f"{name}: tagged {types[name]}, but {prefix} is {qtype}")
            members[prefix][suffix] = info
        else:
            floats.append(name)
    for name in floats:
        if types[name] != "FLOAT":
            raise AscendV1Error(f"{name}: tagged {types[name]} but belongs to no quantized Linear")
    ckpt = AscendV1Checkpoint(root, description, files, group_size=group, floats=sorted(floats))
    for prefix, qtype in sorted(prefixes.items()):
        if qtype == "FLOAT":
            continue
        n, k = check_linear(prefix, qtype, members[prefix], group)
        scale = members[prefix].get("weight_scale")
        per_group = scale is not None and len(scale[1]) == 2 and scale[1][1] != 1
        ckpt.linears[prefix] = QuantLinearEntry(
            qtype, n, k, tuple(sorted(members[prefix])), per_group
        )
        _check_symmetric(ckpt, prefix, qtype)
    return ckpt


def _check_symmetric(ckpt: AscendV1Checkpoint, prefix: str, qtype: str) -> None:
    """W8A8 and W8A8_DYNAMIC weights are symmetric: the engines never read ``weight_offset``
    (vLLM-Ascend's W8A8/W8A8_DYNAMIC ``apply``), so a non-zero one would be silently wrong."""
    name = f"{prefix}.weight_offset"
    symmetric = qtype in ("W8A8", "W8A8_MIX", "W8A8_DYNAMIC")
    if symmetric and name in ckpt.tensors.info and bool(ckpt.load(name).ne(0).any()):
        raise AscendV1Error(
            f"{name}: must be zeros for {qtype} (the engines' formula has no weight offset)"
        )
