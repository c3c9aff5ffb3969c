"""``ModelAdapter``: load a model family, name its modalities, run it on calibration data.

An adapter owns one loaded model. ``adapter.model`` is the ``nn.Module`` whose dotted module names
policies, probes and exports use (for a diffusers pipeline, a wrapper whose children are the
pipeline's own components: ``unet.down_blocks.0...``).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.types import ForwardLoop, Modality, match_prefix


def modality_of(name: str, prefixes: dict[str, Modality]) -> Modality:
    """Modality of a module name by the longest matching prefix (``other`` when none matches)."""
    prefix = match_prefix(name, prefixes)
    return Modality.OTHER if prefix is None else prefixes[prefix]


class ModelAdapter(ABC):
    """A loaded model plus what the toolkit needs to know about it.

    Attributes:
        family: registry name (``diffusers-sd``, ``whisper``, ``generic``).
        model: the module tree policies refer to.
        model_id: where it came from (a path or ``zoo:<name>``), recorded in artifacts.
    """

    family: ClassVar[str] = ""
    # What generate() produces: "t2i" (images from prompts) or "asr" (text from audio).
    task: ClassVar[str] = ""
    model: nn.Module
    model_id: str
    # Outputs generate() computed from NaN (an image's pixels, a transcript's logits) since the
    # caller last set it to 0: a uint8 image or a string cannot show it (NaN pixels become
    # black, NaN logits a run of token 0), so the evaluation reads it here.
    nan_outputs: int = 0

    @abstractmethod
    def modalities(self) -> dict[str, Modality]:
        """Module-name prefix -> modality (longest prefix wins; ``""`` is the whole model)."""

    @abstractmethod
    def roots(self) -> dict[str, Modality]:
        """Root module name -> modality: the modules whose outputs are their modality's final
        outputs (a modality may have several, e.g. SDXL's two text encoders).

        End-to-end attribution measures each module's effect on its root's output (e.g. the
        UNet's noise prediction, the VAE decoder's image, Whisper's logits); a modality's
        figures cover all its roots' outputs together.
        """

    def roots_of(self, modality: Modality) -> list[str]:
        """The root modules of ``modality``, in :meth:`roots` order."""
        return [r for r, m in self.roots().items() if m == modality]

    @abstractmethod
    def forward_loop(
        self, data: Sequence[Any], limit: int | None = None, first_batch: int = 0
    ) -> ForwardLoop:
        """A ForwardLoop running the model the way it is deployed over ``data``.

        Args:
            data: the records.
            limit: the first ``limit`` records only.
            first_batch: the index, in the whole data, of ``data``'s first batch (a rank's
                share of the data, see :meth:`calibration_batch`): the loop numbers its batches
                from it (:func:`opsnn_quant.core.stream.at_batch`) and seeds them as the loop over
                the whole data does.
        """

    def calibration_batch(self) -> int | None:
        """Records per batch of :meth:`forward_loop`, when its batches can be shared across
        processes (each batch seeded by its index); None when they cannot (a user's loop)."""
        return None

    @abstractmethod
    def generate(self, inputs: Sequence[Any], seed: int = 0) -> list[Any]:
        """Outputs for evaluation: uint8 HxWx3 images (t2i) or strings (asr); each one
        computed from NaN adds 1 to :attr:`nan_outputs`."""

    def evaluation_inputs(self, records: Sequence[Any]) -> list[Any]:
        """The inputs :meth:`generate` takes, from data records (prompts, waveforms)."""
        return list(records)

    def references(self, records: Sequence[Any]) -> list[str] | None:
        """Reference outputs in the records, where the task has them (transcripts)."""
        return None

    def stages(self) -> dict[str, str]:
        """Stage name -> the module whose forward runs that stage (latency is reported per
        stage); empty when the family names none."""
        return {}

    def primary_modality(self) -> Modality | None:
        """The modality whose root carries most of the work (exported for speed figures);
        default: the only one, for a model with a single root."""
        modalities = list(dict.fromkeys(self.roots().values()))
        return modalities[0] if len(modalities) == 1 else None

    def read_only_parts(self) -> list[Any]:
        """What a copy of this adapter may share instead of copying: objects inference reads
        and never writes (a tokenizer, a feature extractor). Default: none."""
        return []

    @contextlib.contextmanager
    def repeated_inputs(self) -> Iterator[None]:
        """Within: this model and its copies (:meth:`read_only_parts` shared) generate on the
        same inputs again and again (a measured search's slice), so an adapter may keep what it
        derives from them for the block, and frees it at exit. Default: nothing kept. Only
        there: elsewhere a kept input would sit in the memory an evaluation measures."""
        yield

    def place(self, device: torch.device) -> None:
        """Move the model to ``device`` (families holding more than ``model`` override)."""
        self.model.to(device)

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters (cpu for a model without any)."""
        p = next(self.model.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def modality_of(self, name: str) -> Modality:
        """Modality of one module name."""
        return modality_of(name, self.modalities())

    def check_prefixes(self) -> None:
        """Every modality prefix must name a module of the model."""
        names = {n for n, _ in self.model.named_modules()}
        for prefix in self.modalities():
            if prefix and prefix not in names:
                raise ConfigError(f"modality prefix {prefix!r} names no module of {self.model_id}")

    def recordable(self, root: str, args: tuple, kwargs: dict) -> bool:
        """Whether this call of ``root`` may be recorded and replayed on its own.

        End-to-end attribution and the held-out measurement replay recorded root calls; a family
        can refuse calls that are poor to replay (e.g. incremental decoder steps carrying a KV
        cache, when its forward loop also makes a cache-free call). Default: every call.
        """
        return True

    def record_filter(self, root: str) -> Callable[[tuple, dict], bool]:
        """:meth:`recordable` for one root, as a ``RootRecorder`` filter."""
        return lambda args, kwargs: self.recordable(root, args, kwargs)

    def describe_output(self, modality: Modality) -> str:
        """Words for the root output of a modality (for reports)."""
        return ", ".join(self.roots_of(modality))

    def output_positions(self, root: str) -> dict[str, slice] | None:
        """Named groups of positions along a root output's sequence axis (dim 1) that the
        held-out measurement reports apart (e.g. a decoder's first token and the later ones:
        one prefill step and many cached steps in deployment); None: the output as a whole."""
        return None
