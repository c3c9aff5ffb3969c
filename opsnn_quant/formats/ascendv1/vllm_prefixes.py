"""Description keys under the layer prefixes vLLM's model classes ask the quantization config for,
where they differ from the checkpoint's tensor names.

vLLM-Ascend's ModelSlim config gives a Linear its type by looking up
``quant_description[<prefix> + ".weight"]`` (vllm_ascend 0.23.0.post1
``quantization/modelslim_config.py:368`` for a fused layer's shards, 381 otherwise; 691 and
702-705 ``is_layer_skipped_ascend``), ``<prefix>`` being the prefix vLLM's model class passes to
the layer, after the description's keys went through the model's ``hf_to_vllm_mapper``
(``apply_vllm_mapper``, 511-543). A missing key is a ``KeyError`` while the model is built:
``vllm serve`` fails.

vLLM 0.23.0's Whisper builds its layer prefixes unlike its weight names (``vllm/model_executor/
models/whisper.py``): ``WhisperForConditionalGeneration`` passes its own prefix (``""``) to
``WhisperModel`` (962), not ``"model"``, and both ``WhisperEncoder`` and ``WhisperDecoder`` call
``make_layers(prefix=f"{prefix}.layers")`` with a layer function that appends ``".layers"``
again (478-483, 556-561) after ``make_layers`` appended the index (``models/utils.py:659``). The
Linear that loads ``model.encoder.layers.0.self_attn.q_proj.weight`` therefore asks for
``.encoder.layers.0.layers.self_attn.q_proj.weight`` (and, fused, for its k/v shards), so a
description holding only the checkpoint's names (ours, or msModelSlim's) makes vLLM-Ascend
raise ``KeyError: '.encoder.layers.0.layers.self_attn.q_proj.weight'`` (run: tests/conformance/
test_vllm_ascend_engine.py). Weight loading is unaffected (it follows module paths).

We write, besides every checkpoint key, an alias key per Linear weight under the prefix vLLM
asks for, with the same type. An alias starts with ``"."``, which no tensor name does: readers
(ours: :mod:`opsnn_quant.formats.ascendv1.reader`) tell it from a tensor's key and check it against the key
it stands for; an engine that builds correct prefixes never looks it up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path

# The model classes whose layer prefixes differ from their checkpoint names, by the
# ``architectures`` entry of config.json vLLM resolves the class from (vllm/config/model.py).
WHISPER = "WhisperForConditionalGeneration"
_WHISPER_KEY = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.weight")
_WHISPER_ALIAS = re.compile(r"\.(encoder|decoder)\.layers\.(\d+)\.layers\.(.+)\.weight")
WHY = (
    "vLLM 0.23.0's Whisper asks the quantization config for its layers under "
    "'.{encoder|decoder}.layers.<i>.layers.<name>' (whisper.py 478-483, 556-561, 962); "
    "vLLM-Ascend looks up '<prefix>.weight' (modelslim_config.py 368, 381): each Linear's "
    "weight key is written under that prefix too, with its type"
)


def architectures(config_json: Path) -> list[str]:
    """The ``architectures`` of a model's ``config.json`` ([] when it has none or is unreadable)."""
    try:
        doc = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    arch = doc.get("architectures") if isinstance(doc, dict) else None
    return [a for a in arch if isinstance(a, str)] if isinstance(arch, list) else []


def vllm_prefix_aliases(
    description: Mapping[str, object], archs: Collection[str], linears: Collection[str]
) -> dict[str, str]:
    """The alias keys (alias -> type) to add to ``description`` for the model classes in
    ``archs``: one per ``<linear>.weight`` key of a Linear in ``linears`` (its name relative to
    the component) whose vLLM prefix differs from its name. Empty for other models."""
    if WHISPER not in archs:
        return {}
    out: dict[str, str] = {}
    for key, qtype in description.items():
        m = _WHISPER_KEY.fullmatch(key)
        if m and isinstance(qtype, str) and key.removesuffix(".weight") in linears:
            out[f".{m[1]}.layers.{m[2]}.layers.{m[3]}.weight"] = qtype
    return out


def is_alias(key: str) -> bool:
    """Whether a description key is a prefix alias (no tensor name starts with ``"."``)."""
    return key.startswith(".")


def aliased_key(alias: str) -> str | None:
    """The checkpoint key an alias stands for (None: not an alias we write)."""
    m = _WHISPER_ALIAS.fullmatch(alias)
    return f"model.{m[1]}.layers.{m[2]}.{m[3]}.weight" if m else None
