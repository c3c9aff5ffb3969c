"""``whisper`` adapter: transformers ``WhisperForConditionalGeneration`` (+ its processor).

Encoder -> ``audio_encoder`` (``model.encoder``), decoder and the tied LM head -> ``text_decoder``.
The forward loop extracts log-mel features and runs ``generate`` over calibration audio.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from opsnn_quant.core import progress
from opsnn_quant.core.determinism import rows_to_run
from opsnn_quant.core.hub import (
    check_pickle_weights,
    quiet_progress_bars,
    set_offline_env,
    transformers_dtype,
    weights_only_torch_load,
)
from opsnn_quant.core.stream import at_batch
from opsnn_quant.errors import MissingDependencyError, ModelLoadError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.checks import check_component
from opsnn_quant.models.data import audio_from, batched
from opsnn_quant.models.settings import WhisperSettings
from opsnn_quant.sources import model_path
from opsnn_quant.types import ForwardLoop, Modality


def check_whisper_weights(source: str, path: Path, *, allow_pickle: bool = False) -> bool:
    """Refuse a Whisper directory with pickle weights only, unless ``allow_pickle``
    (:func:`~opsnn_quant.core.hub.check_pickle_weights`); True when pickles will be read."""
    return check_pickle_weights(
        source,
        path,
        [path],
        allow_pickle=allow_pickle,
        convert=f'python -c "from transformers import WhisperForConditionalGeneration as M; '
        f"M.from_pretrained('{path}').save_pretrained('{path}')\"",
    )


def load_whisper(
    source: str,
    dtype: torch.dtype = torch.float32,
    *,
    allow_pickle: bool = False,
    skeletons: list[Any] | None = None,
) -> tuple[nn.Module, Any]:
    """(model, processor) from ``zoo:whisper-tiny.en`` or a local transformers directory.

    The weights load from safetensors only; a directory with pickle weights only
    (``pytorch_model.bin``, ...) is refused before anything loads unless ``allow_pickle``, and
    then read with ``torch.load(weights_only=True)``.

    ``skeletons`` (streamed loading, ``--max-memory``): the model is built on the ``meta``
    device and its :class:`~opsnn_quant.models.streamed.StreamedSource` appended here (where it
    cannot stream, e.g. pickles, it loads whole); None: it loads whole.

    Raises:
        ModelLoadError: not a Whisper directory (a config or safetensors header that
            :func:`~opsnn_quant.models.checks.check_component` refuses included), or
            pickle-only weights without ``allow_pickle``.
    """
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(
            "transformers is not installed: pip install 'opsnn-quant[models]'"
        ) from exc
    path = model_path(source)
    if (path / "model_index.json").is_file():
        raise ModelLoadError(
            f"{source} is a diffusers pipeline, not a Whisper model; check the family"
        )
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{source} is not a transformers model directory (no config.json)")
    check_component(path, "transformers")  # its config and safetensors headers
    pickled = check_whisper_weights(source, path, allow_pickle=allow_pickle)
    set_offline_env()
    quiet_progress_bars()
    try:
        # The dtype explicitly (fp32 by default): transformers 5 would keep a checkpoint's
        # stored dtype (the zoo's converted weights are fp16).
        streamed = None
        if skeletons is not None and not pickled:
            from opsnn_quant.models.streamed import whisper_skeleton

            streamed = whisper_skeleton(path, dtype)
        if streamed is not None:
            assert skeletons is not None
            skeletons.append(streamed)
            model = streamed.module
        else:
            model = _load_whole(path, pickled, dtype)
        processor = transformers.WhisperProcessor.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(
            f"cannot load Whisper from {source}: {str(exc).splitlines()[0]}"
        ) from exc
    return model.eval(), processor


def _load_whole(path: Path, pickled: bool, dtype: torch.dtype) -> nn.Module:
    import transformers

    with weights_only_torch_load() if pickled else contextlib.nullcontext():
        model: nn.Module = transformers.WhisperForConditionalGeneration.from_pretrained(
            str(path),
            local_files_only=True,
            use_safetensors=None if pickled else True,
            **transformers_dtype(dtype),
        )
    return model


def _nan_utterances(steps: list[torch.Tensor], utterances: int, kept: int | None = None) -> int:
    """How many of a batch's first ``kept`` (default: all) ``utterances`` had NaN logits at
    some decoding step (``steps``: per step, a flag per row; rows are utterance-major,
    ``beams`` of them per utterance; the rest of the batch is padding)."""
    kept = utterances if kept is None else kept
    if not steps or not any(bool(s.any()) for s in steps):
        return 0
    rows = max(s.numel() for s in steps)
    if rows % utterances:  # rows not per utterance: every utterance may be the one
        return kept
    per_row = torch.zeros(rows, dtype=torch.bool)
    for s in steps:
        per_row[: s.numel()] |= s
    return int(per_row.reshape(utterances, -1).any(dim=1)[:kept].sum())


# Bytes of log-mel features a FeatureMemo keeps (a batch of 8 30-second inputs is 7.7 MB).
FEATURE_MEMO_BYTES = 64 * 2**20


class FeatureMemo:
    """The log-mel features of the last few batches of waveforms, by the audio's digest.

    Features are a function of the waveforms and the feature extractor alone. The measured search
    transcribes the same slice batches with the float model and each candidate's copy, which
    shares this memo (:meth:`WhisperAdapter.read_only_parts`): each batch's features are computed
    once. It keeps nothing unless ``active`` (:meth:`WhisperAdapter.repeated_inputs`: a latency
    or memory measurement must not see it grow); at most :data:`FEATURE_MEMO_BYTES` (oldest out
    first); callers get copies.
    """

    def __init__(self, limit: int = FEATURE_MEMO_BYTES) -> None:
        self.limit = limit
        self.active = False
        self._extractor: Any = None  # whose features are kept (another one's clear the memo)
        self._kept: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def features(
        self, extractor: Any, arrays: Sequence[np.ndarray], compute: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """``compute()``'s features of ``arrays`` (from ``extractor``), from the memo when kept."""
        if not self.active:
            return compute()
        digest = hashlib.blake2b(digest_size=16)
        for a in arrays:
            a = np.ascontiguousarray(a)
            digest.update(f"{a.dtype.str}{a.shape};".encode())
            digest.update(a.data.cast("B"))  # the samples, no copy
        key = digest.digest()
        if extractor is not self._extractor:
            self._extractor = extractor
            self._kept.clear()
        kept = self._kept.get(key)
        if kept is None:
            kept = compute()
            size = kept.numel() * kept.element_size()
            if size <= self.limit:
                self._kept[key] = kept
                while sum(t.numel() * t.element_size() for t in self._kept.values()) > self.limit:
                    self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(key)
        return kept

    def clear(self) -> None:
        """Forget every kept batch."""
        self._kept.clear()
        self._extractor = None


class WhisperAdapter(ModelAdapter):
    """Adapter for a loaded Whisper model and processor."""

    family = "whisper"
    task = "asr"

    def __init__(
        self,
        model: nn.Module,
        processor: Any,
        model_id: str,
        settings: WhisperSettings | None = None,
    ) -> None:
        names = {n for n, _ in model.named_modules()} if isinstance(model, nn.Module) else set()
        if "model.encoder" not in names or "model.decoder" not in names:
            raise ModelLoadError(
                f"{model_id} is not a WhisperForConditionalGeneration "
                f"(it is a {type(model).__name__}); check the recipe's family"
            )
        self.model = model.eval()
        self.processor = processor
        self.model_id = model_id
        self.settings = settings or WhisperSettings()
        # the decoder prompt's length (start token and forced ids), seen by the forward loop
        self.prompt_length: int | None = None
        self.feature_memo = FeatureMemo()

    @classmethod
    def load(
        cls,
        source: str,
        settings: WhisperSettings | None = None,
        dtype: torch.dtype = torch.float32,
        *,
        allow_pickle: bool = False,
        skeletons: list[Any] | None = None,
    ) -> WhisperAdapter:
        """Load from ``zoo:whisper-tiny.en`` or a transformers directory, in ``dtype`` (safetensors
        only unless ``allow_pickle``; ``skeletons``: streamed loading; see :func:`load_whisper`)."""
        model, processor = load_whisper(
            source, dtype, allow_pickle=allow_pickle, skeletons=skeletons
        )
        return cls(model, processor, source, settings)

    def modalities(self) -> dict[str, Modality]:
        """Encoder / decoder (+ LM head)."""
        out = {"model.encoder": Modality.AUDIO_ENCODER, "model.decoder": Modality.TEXT_DECODER}
        if "proj_out" in dict(self.model.named_children()):
            out["proj_out"] = Modality.TEXT_DECODER
        return out

    def roots(self) -> dict[str, Modality]:
        """Encoder hidden states; decoder logits (the whole model's output)."""
        return {"model.encoder": Modality.AUDIO_ENCODER, "": Modality.TEXT_DECODER}

    def recordable(self, root: str, args: tuple, kwargs: dict) -> bool:
        """Whole-model calls: only the forward loop's teacher-forced call (``use_cache=False``).

        A ``generate`` step carries the KV cache (the cross-attention keys/values alone are
        ~18 MB per utterance, copied with every recorded call) and covers one token; the
        teacher-forced call covers every decoded position of the batch and needs no cache.
        """
        return root != "" or kwargs.get("use_cache") is False

    def describe_output(self, modality: Modality) -> str:
        """Words for the root outputs."""
        return {
            Modality.AUDIO_ENCODER: "encoder hidden states",
            Modality.TEXT_DECODER: "decoder logits",
        }.get(modality, "")

    def output_positions(self, root: str) -> dict[str, slice] | None:
        """The teacher-forced decoder call's logits in the deployment's two kinds of steps: the
        prompt's last position picks the first token (the prefill step, no cache yet); each
        later position is one KV-cached step. The prompt's other positions feed the cache only:
        their logits are never used, so neither group holds them."""
        p = self.prompt_length
        if root != "" or p is None:
            return None
        return {"first token": slice(p - 1, p), "later tokens": slice(p, None)}

    def read_only_parts(self) -> list[Any]:
        """The processor (its tokenizer's 50k-entry tables were most of a copy's cost) and the
        feature memo (a cache of a function of the audio: a copy computing the float model's
        batches again would only repeat its work)."""
        return [self.processor, self.feature_memo]

    @contextlib.contextmanager
    def repeated_inputs(self) -> Iterator[None]:
        """Within: each batch's log-mel features are extracted once for this model and its
        copies (:class:`FeatureMemo`), and forgotten at exit."""
        memo = self.feature_memo
        was, memo.active = memo.active, True
        try:
            yield
        finally:
            memo.active = was
            if not was:
                memo.clear()

    def features(self, audio: Sequence[Any]) -> torch.Tensor:
        """Log-mel input features for a batch of waveforms (within :meth:`repeated_inputs`,
        each batch computed once while :class:`FeatureMemo` keeps it)."""
        arrays = audio_from(audio)
        extractor = self.processor.feature_extractor

        def compute() -> torch.Tensor:
            out = extractor(arrays, sampling_rate=16000, return_tensors="pt")
            return out.input_features

        feats = self.feature_memo.features(extractor, arrays, compute)
        p = next(self.model.parameters())
        return feats.to(device=p.device, dtype=p.dtype, copy=True)

    def decoding(self) -> dict[str, Any]:
        """The keyword arguments of every ``generate`` call: the decoding settings, and the
        language and task where given (an English-only model takes neither: ``en`` is all it
        decodes, and transformers refuses both for it)."""
        s = self.settings
        kwargs: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "num_beams": s.num_beams}
        if getattr(self.model.generation_config, "is_multilingual", True) is False:
            return kwargs
        if s.language is not None:
            kwargs["language"] = s.language
        if s.task is not None:
            kwargs["task"] = s.task
        return kwargs

    def _decode(self, audio: Sequence[Any]) -> list[str]:
        nan: list[torch.Tensor] = []  # per decoding step: which rows' logits hold NaN

        def watch(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            logits = getattr(out, "logits", None)
            if isinstance(logits, torch.Tensor) and logits.dim() >= 2:
                nan.append(torch.isnan(logits).flatten(1).any(dim=1).cpu())

        n = len(audio)
        # a batch of fewer rows than the CPU's GEMM rounds alike is padded with copies of its
        # last utterance (their transcripts dropped): each utterance decodes to the same bits
        # in any batch (a slice, a rank's shard, the set's last batch)
        padded = list(audio) + [audio[-1]] * (rows_to_run(n) - n)
        handle = self.model.register_forward_hook(watch, with_kwargs=True)
        try:
            with torch.no_grad():
                ids = self.model.generate(self.features(padded), **self.decoding())  # type: ignore[operator]
        finally:
            handle.remove()
        self.nan_outputs += _nan_utterances(nan, len(padded), n)
        texts = self.processor.batch_decode(ids[:n], skip_special_tokens=True)
        return [t.strip() for t in texts]

    def evaluation_inputs(self, records: Sequence[Any]) -> list[Any]:
        """The 16 kHz waveforms of the records (checked: NaN/Inf, rate)."""
        return list(audio_from(records))

    def references(self, records: Sequence[Any]) -> list[str] | None:
        """The records' transcripts (empty where a record has none)."""
        return [str(r.get("text", "")) if isinstance(r, dict) else "" for r in records]

    def stages(self) -> dict[str, str]:
        """The audio encoder (once per utterance) and the decoder (once per token)."""
        return {"audio_encoder": "model.encoder", "decoder_step": "model.decoder"}

    def primary_modality(self) -> Modality:
        """The audio encoder (1500 frames per utterance)."""
        return Modality.AUDIO_ENCODER

    def calibration_batch(self) -> int:
        """See :meth:`ModelAdapter.calibration_batch`."""
        return int(self.settings.batch_size)

    def forward_loop(
        self, data: Sequence[Any], limit: int | None = None, first_batch: int = 0
    ) -> ForwardLoop:
        """Transcribe the calibration audio (encoder once, decoder per token), batch by batch
        (numbered from ``first_batch``)."""
        items = list(data)[:limit] if limit else list(data)
        audio_from(items)  # validate up front (NaN/Inf, rate) so errors name the sample early

        def loop(model: nn.Module) -> None:
            batches = batched(items, self.settings.batch_size)
            for i, batch in enumerate(progress.iterate(batches, "batch"), start=first_batch):
                with at_batch(i):
                    self._calibration_batch(model, batch)

        return loop

    @torch.no_grad()
    def _calibration_batch(self, model: nn.Module, audio: Sequence[Any]) -> None:
        """``generate`` (encoder once, decoder step by step with its KV cache), then one
        teacher-forced decoder call on the decoded tokens with the same encoder output.

        The extra call costs one decoder pass over the batch's positions and reproduces the
        steps' activations (causal attention), so calibration statistics are unchanged; it is
        the whole-model call attribution and measurement record (see :meth:`recordable`).
        """
        first: dict[str, Any] = {}
        steps = [0]

        def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if kwargs.get("encoder_outputs") is not None:
                steps[0] += 1
                if not first:
                    first.update(kwargs)

        handle = model.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            s = self.settings
            ids = model.generate(self.features(audio), **self.decoding())  # type: ignore[operator]
        finally:
            handle.remove()
        prompt = first.get("decoder_input_ids")
        encoded = first.get("encoder_outputs")
        if prompt is None or encoded is None or s.num_beams != 1:
            return  # beam search reorders the batch: no single teacher-forced call matches it
        p = prompt.shape[1]
        self.prompt_length = p
        if ids.shape[1] >= p and torch.equal(ids[:, :p], prompt):
            ids = ids[:, p:]  # some transformers versions return the prompt too
        # Exactly the positions the steps fed: the prompt, then one token per later step (the
        # last generated token is never fed back). Whisper strips the final end-of-text token
        # from what it returns, so pad with it where the returned ids fall short.
        width = p + steps[0] - 1
        tokens = torch.cat([prompt, ids.to(prompt.dtype)], dim=1)[:, :width]
        if tokens.shape[1] < width:
            eos = getattr(model.generation_config, "eos_token_id", None)
            eos = eos[0] if isinstance(eos, list) else eos
            if eos is None:
                return
            pad = tokens.new_full((tokens.shape[0], width - tokens.shape[1]), int(eos))
            tokens = torch.cat([tokens, pad], dim=1)
        model(encoder_outputs=(encoded[0],), decoder_input_ids=tokens, use_cache=False)

    def generate(self, inputs: Sequence[Any], seed: int = 0) -> list[str]:
        """Transcripts, one per waveform (greedy decoding is deterministic; seed unused)."""
        out: list[str] = []
        for batch in progress.iterate(batched(list(inputs), self.settings.batch_size), "batch"):
            out.extend(self._decode(batch))
        return out
