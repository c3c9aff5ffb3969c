"""``whisper`` adapter: transformers ``WhisperForConditionalGeneration`` (+ its processor).

Encoder -> ``audio_encoder`` (``model.encoder``), decoder and the tied LM head -> ``text_decoder``.
The forward loop extracts log-mel features and runs ``generate`` over calibration audio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from opsnn_quant.errors import MissingDependencyError, ModelLoadError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.data import audio_from, batched
from opsnn_quant.types import ForwardLoop, Modality


@dataclass(frozen=True)
class WhisperSettings:
    """Decoding settings for calibration and generation."""

    batch_size: int = 8
    max_new_tokens: int = 64
    num_beams: int = 1


def load_whisper(source: str) -> tuple[nn.Module, Any]:
    """(model, processor) from ``zoo:whisper-tiny.en`` or a local transformers directory."""
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(
            "transformers is not installed: pip install 'opsnn-quant[models]'"
        ) from exc
    if source.startswith("zoo:"):
        from opsnn_quant import zoo
        from opsnn_quant.zoo.whisper import load_whisper_processor

        return zoo.load(source[4:]), load_whisper_processor()
    path = Path(source)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{source} is not a transformers model directory (no config.json)")
    from opsnn_quant.zoo import set_offline_env

    set_offline_env()
    try:
        model = transformers.WhisperForConditionalGeneration.from_pretrained(
            str(path), local_files_only=True
        )
        processor = transformers.WhisperProcessor.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(
            f"cannot load Whisper from {source}: {str(exc).splitlines()[0]}"
        ) from exc
    return model.eval(), processor


class WhisperAdapter(ModelAdapter):
    """Adapter for a loaded Whisper model and processor."""

    family = "whisper"

    def __init__(
        self,
        model: nn.Module,
        processor: Any,
        model_id: str,
        settings: WhisperSettings | None = None,
    ) -> None:
        self.model = model.eval()
        self.processor = processor
        self.model_id = model_id
        self.settings = settings or WhisperSettings()
        names = {n for n, _ in model.named_modules()}
        if "model.encoder" not in names or "model.decoder" not in names:
            raise ModelLoadError(f"{model_id} is not a WhisperForConditionalGeneration")

    @classmethod
    def load(cls, source: str, settings: WhisperSettings | None = None) -> WhisperAdapter:
        """Load from ``zoo:whisper-tiny.en`` or a transformers directory."""
        model, processor = load_whisper(source)
        return cls(model, processor, source, settings)

    def modalities(self) -> dict[str, Modality]:
        """Encoder / decoder (+ LM head)."""
        out = {"model.encoder": Modality.AUDIO_ENCODER, "model.decoder": Modality.TEXT_DECODER}
        if "proj_out" in dict(self.model.named_children()):
            out["proj_out"] = Modality.TEXT_DECODER
        return out

    def roots(self) -> dict[Modality, str]:
        """Encoder hidden states; decoder logits (the whole model's output)."""
        return {Modality.AUDIO_ENCODER: "model.encoder", Modality.TEXT_DECODER: ""}

    def describe_output(self, modality: Modality) -> str:
        """Words for the root outputs."""
        return {
            Modality.AUDIO_ENCODER: "encoder hidden states",
            Modality.TEXT_DECODER: "decoder logits",
        }.get(modality, "")

    def features(self, audio: Sequence[Any]) -> torch.Tensor:
        """Log-mel input features for a batch of waveforms."""
        arrays = audio_from(audio)
        feats = self.processor.feature_extractor(arrays, sampling_rate=16000, return_tensors="pt")
        return feats.input_features.to(next(self.model.parameters()).dtype)

    def _decode(self, audio: Sequence[Any]) -> list[str]:
        s = self.settings
        with torch.no_grad():
            ids = self.model.generate(  # type: ignore[operator]
                self.features(audio), max_new_tokens=s.max_new_tokens, num_beams=s.num_beams
            )
        return [t.strip() for t in self.processor.batch_decode(ids, skip_special_tokens=True)]

    def forward_loop(self, data: Sequence[Any], limit: int | None = None) -> ForwardLoop:
        """Transcribe the calibration audio (encoder once, decoder per token)."""
        items = list(data)[:limit] if limit else list(data)
        audio_from(items)  # validate up front (NaN/Inf, rate) so errors name the sample early

        def loop(model: nn.Module) -> None:
            for batch in batched(items, self.settings.batch_size):
                self._decode(batch)

        return loop

    def generate(self, inputs: Sequence[Any], seed: int = 0) -> list[str]:
        """Transcripts, one per waveform (greedy decoding is deterministic; seed unused)."""
        out: list[str] = []
        for batch in batched(list(inputs), self.settings.batch_size):
            out.extend(self._decode(batch))
        return out
