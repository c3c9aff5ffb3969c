"""What the diffusers adapters share: loading a pipeline, naming its components, sampling.

A diffusers pipeline is not an ``nn.Module``; :class:`PipelineModule` makes its components the
children of one, so module names are the pipeline's own (``unet.down_blocks...``,
``transformer.transformer_blocks...``, ``text_encoder_3.encoder...``). :class:`DiffusersAdapter`
runs the pipeline's own ``__call__`` (its scheduler, guidance and VAE decoding) for calibration
and generation; a family says which components it has and which denoises
(:mod:`~opsnn_quant.models.diffusers_sd`: the UNet; :mod:`~opsnn_quant.models.diffusers_dit`: the
transformer).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from opsnn_quant.core import progress, timesteps
from opsnn_quant.core.hub import (
    check_pickle_weights,
    quiet_progress_bars,
    set_offline_env,
    weights_only_torch_load,
)
from opsnn_quant.core.stream import at_batch
from opsnn_quant.errors import ConfigError, MissingDependencyError, ModelLoadError
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.checks import check_pipeline_files
from opsnn_quant.models.data import batched, prompts_from
from opsnn_quant.models.settings import DiTSettings, SDSettings
from opsnn_quant.sources import model_path
from opsnn_quant.types import ForwardLoop, Modality

log = logging.getLogger(__name__)

# Seeds of the calibration batches: apart from generate()'s (seed + i), so that calibration
# never sees the exact latents an evaluation then measures.
CALIBRATION_SEED = 10_000


class PipelineModule(nn.Module):
    """The pipeline's modules as children, so ``named_modules`` gives ``unet.down_blocks...``.

    The pipeline itself (not an ``nn.Module``) stays reachable as ``.pipe``; both share the same
    component objects, so quantizing this module quantizes the pipeline.

    Args:
        pipe: the diffusers pipeline.
        components: the component names to adopt, in this order (absent ones are skipped).
    """

    def __init__(self, pipe: Any, components: Sequence[str]) -> None:
        super().__init__()
        for name in components:
            component = getattr(pipe, name, None)
            if isinstance(component, nn.Module):
                self.add_module(name, component)
        object.__setattr__(self, "pipe", pipe)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the whole pipeline (``pipe(*args, **kwargs)``)."""
        return self.__dict__["pipe"](*args, **kwargs)


def pipeline_index(source: str, path: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The directory of ``source`` (``path`` when the caller has it resolved) and its
    ``model_index.json`` (read before any weight loads).

    Raises:
        ModelLoadError: not a diffusers pipeline directory, or an unreadable index.
    """
    path = path if path is not None else model_path(source)
    index_file = path / "model_index.json"
    if not index_file.is_file() and (path / "config.json").is_file():
        raise ModelLoadError(
            f"{source} is a transformers model, not a diffusers pipeline; check the family"
        )
    if not index_file.is_file():
        raise ModelLoadError(
            f"{source} is not a diffusers pipeline directory (no model_index.json)"
        )
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{index_file} is not valid JSON: {exc}") from exc
    if not isinstance(index, dict):
        raise ModelLoadError(f"{index_file} is not a JSON object")
    return path, index


def index_components(index: dict[str, Any]) -> set[str]:
    """The components a ``model_index.json`` names with a class (``[library, class]``, not
    ``[null, null]``)."""
    return {
        k
        for k, v in index.items()
        if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[1] is not None
    }


def check_pipeline_weights(
    source: str, path: Path, index: dict[str, Any], *, allow_pickle: bool = False
) -> bool:
    """Refuse a pipeline a component of which has pickle weights only, unless ``allow_pickle``
    (:func:`~opsnn_quant.core.hub.check_pickle_weights`); True when pickles will be read."""
    return check_pickle_weights(
        source,
        path,
        [path / c for c in sorted(index_components(index))],
        allow_pickle=allow_pickle,
        convert=f'python -c "from diffusers import DiffusionPipeline as P; '
        f"P.from_pretrained('{path}').save_pretrained('{path}')\"",
    )


def load_pipeline(
    source: str,
    torch_dtype: torch.dtype = torch.float32,
    *,
    safety_checker_off: bool = True,
    allow_pickle: bool = False,
    skeletons: list[Any] | None = None,
) -> Any:
    """A diffusers pipeline from ``zoo:<name>`` or a local diffusers directory (offline).

    Weights load from safetensors only; a component with pickle weights only (``*.bin``,
    ``*.pt``, ...) is refused before anything loads unless ``allow_pickle``, and then read with
    ``torch.load(weights_only=True)`` (the other components still from their safetensors).

    Args:
        source: the pipeline.
        torch_dtype: the dtype its weights load in.
        safety_checker_off: pass ``safety_checker=None`` (the SD pipelines' NSFW filter would
            blank calibration images; pipelines without one would warn about the argument).
        allow_pickle: read the components that have pickle weights only.
        skeletons: streamed loading (``--max-memory``): the models (denoisers, VAE, text
            encoders) are built on the ``meta`` device and their
            :class:`~opsnn_quant.models.streamed.StreamedSource` appended here (a model that
            cannot stream loads whole); None: every component loads whole.

    Raises:
        ModelLoadError: not a loadable pipeline (a class, config or safetensors header that
            :func:`~opsnn_quant.models.checks.check_pipeline_files` refuses included), or
            pickle-only weights without ``allow_pickle``.
    """
    try:
        import diffusers
    except ImportError as exc:
        raise MissingDependencyError(
            "diffusers is not installed: pip install 'opsnn-quant[models]'"
        ) from exc
    diffusers.utils.logging.disable_progress_bar()
    path, index = pipeline_index(source)
    check_pipeline_files(path)  # classes, configs and safetensors headers, before they load
    pickled = check_pipeline_weights(source, path, index, allow_pickle=allow_pickle)
    set_offline_env()
    quiet_progress_bars()
    try:
        extra: dict[str, Any] = {"safety_checker": None} if safety_checker_off else {}
        # A component saved as [null, null] (SD3 without its T5, as the zoo's shapes-dit) is
        # absent on purpose: diffusers wants it passed as None.
        extra.update(
            {k: None for k, v in index.items() if not k.startswith("_") and v == [None, None]}
        )
        if skeletons is not None and not pickled:
            extra.update(_skeletons(path, index, torch_dtype, skeletons))
        # use_safetensors=None: each component's safetensors where it has them, else (allowed
        # above) its pickle, read with weights_only=True.
        with weights_only_torch_load() if pickled else contextlib.nullcontext():
            pipe = diffusers.DiffusionPipeline.from_pretrained(
                str(path),
                dtype=torch_dtype,
                local_files_only=True,
                use_safetensors=None if pickled else True,
                **extra,
            )
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(
            f"cannot load the pipeline in {source}: {str(exc).splitlines()[0]}"
        ) from exc
    return pipe


def _skeletons(
    path: Path, index: dict[str, Any], dtype: torch.dtype, skeletons: list[Any]
) -> dict[str, Any]:
    """The pipeline's models (diffusers denoisers and VAE, transformers text encoders) built
    on ``meta`` (streamed loading), by component name; one that cannot stream is left out."""
    import diffusers
    import transformers

    from opsnn_quant.models.streamed import diffusers_skeleton, transformers_skeleton

    out: dict[str, Any] = {}
    for name, entry in index.items():
        if name.startswith("_") or not (isinstance(entry, list) and len(entry) == 2):
            continue
        if not (path / name).is_dir():
            continue
        library, cls_name = entry
        if library == "diffusers":
            cls = getattr(diffusers, str(cls_name), None)
            if not (isinstance(cls, type) and issubclass(cls, diffusers.ModelMixin)):
                continue
            source = diffusers_skeleton(cls, path / name, dtype, str(path / name))
        elif library == "transformers":
            cls = getattr(transformers, str(cls_name), None)
            if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
                continue
            source = transformers_skeleton(cls, path / name, dtype, str(path / name))
        else:
            continue
        if source is not None:
            skeletons.append(source)
            out[name] = source.module
    return out


class StepClock:
    """Sets :mod:`opsnn_quant.core.timesteps` while the denoiser runs in a pipeline call.

    The pipeline's end-of-step callback advances the step index; a pre-hook on each denoiser
    (prepended, so the recorders' own pre-hooks already read it) sets the clock to it and a
    forward hook clears it, so the text encoders and the VAE run with the clock at None and every
    denoiser call of step ``i`` (both halves of classifier-free guidance included) reads ``i``.

    Args:
        denoisers: the denoiser modules of the pipeline.
    """

    def __init__(self, denoisers: Sequence[nn.Module]) -> None:
        self.denoisers = list(denoisers)
        self.step = 0
        self.handles: list[Any] = []

    def pipeline_kwargs(self, pipe: Any) -> dict[str, Any]:
        """The callback arguments this pipeline's ``__call__`` takes: diffusers'
        ``callback_on_step_end`` (most pipelines), or the older ``callback``/``callback_steps``
        (PixArt)."""
        params = inspect.signature(pipe.__call__).parameters
        if "callback_on_step_end" in params:
            return {"callback_on_step_end": self.on_step_end}
        if "callback" in params:
            return {"callback": self.on_legacy_step, "callback_steps": 1}
        raise ModelLoadError(
            f"{type(pipe).__name__} takes no step callback: its denoising steps cannot be counted"
        )

    def on_step_end(self, pipe: Any, i: int, t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        """``callback_on_step_end``: step ``i`` is done."""
        self.step = i + 1
        return tensors

    def on_legacy_step(self, i: int, t: Any, latents: Any) -> None:
        """``callback(step, timestep, latents)`` with ``callback_steps=1``: step ``i`` is done."""
        self.step = i + 1

    def _enter(self, module: nn.Module, args: tuple) -> None:
        timesteps.set_step(self.step)

    def _leave(self, module: nn.Module, args: tuple, output: Any) -> None:
        timesteps.set_step(None)

    def __enter__(self) -> StepClock:
        self.step = 0
        for m in self.denoisers:
            self.handles.append(m.register_forward_pre_hook(self._enter, prepend=True))
            self.handles.append(m.register_forward_hook(self._leave))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        timesteps.set_step(None)


class DiffusersAdapter(ModelAdapter):
    """A loaded diffusers pipeline: modalities by component, the real sampling loop.

    A family sets ``components`` (adopted in this order), ``text_encoders`` and ``denoisers``
    (the components of those modalities, each one a root) and may add pipeline arguments
    (:meth:`extra_call_kwargs`) or read another output field (:attr:`output_field`).
    """

    components: ClassVar[tuple[str, ...]] = ()
    text_encoders: ClassVar[tuple[str, ...]] = ()
    denoisers: ClassVar[tuple[str, ...]] = ()
    # The pipeline output's field with the decoded result: images (t2i) or frames (t2v).
    output_field: ClassVar[str] = "images"
    settings: SDSettings | DiTSettings

    def __init__(self, pipe: Any, model_id: str, settings: SDSettings | DiTSettings) -> None:
        self.pipe = pipe
        self.model = PipelineModule(pipe, self.components)
        self.model_id = model_id
        self.settings = settings
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)

    def read_only_parts(self) -> list[Any]:
        """The pipeline's tokenizers, feature extractors and image processors (a UMT5
        tokenizer's vocabulary is 250k entries); not its modules, nor its scheduler (which
        keeps the timesteps of the call in progress)."""
        from transformers import (
            FeatureExtractionMixin,
            ImageProcessingMixin,
            PreTrainedTokenizerBase,
            ProcessorMixin,
        )

        kinds = (
            PreTrainedTokenizerBase,
            FeatureExtractionMixin,
            ImageProcessingMixin,
            ProcessorMixin,
        )
        return [c for c in getattr(self.pipe, "components", {}).values() if isinstance(c, kinds)]

    def children(self) -> dict[str, nn.Module]:
        """The adopted components by name."""
        return dict(self.model.named_children())

    def place(self, device: torch.device) -> None:
        """Move the whole pipeline (its components and execution device)."""
        self.pipe.to(device)

    def modalities(self) -> dict[str, Modality]:
        """text encoders, the denoiser(s), VAE decoder (+ post_quant_conv), VAE encoder as other
        (text-to-image never runs it)."""
        children = self.children()
        out: dict[str, Modality] = {}
        for name in self.text_encoders:
            if name in children:
                out[name] = Modality.TEXT_ENCODER
        for name in self.denoisers:
            if name in children:
                out[name] = Modality.DENOISER
        if "vae" in children:
            out["vae"] = Modality.OTHER
            vae_children = dict(children["vae"].named_children())
            for sub in ("decoder", "post_quant_conv"):
                if sub in vae_children:
                    out[f"vae.{sub}"] = Modality.IMAGE_DECODER
        return out

    def roots(self) -> dict[str, Modality]:
        """The denoiser prediction(s), the VAE decoder's output, each text encoder's states."""
        children = self.children()
        out = {name: Modality.DENOISER for name in self.denoisers if name in children}
        if "vae" in children:
            out["vae.decoder"] = Modality.IMAGE_DECODER
        for name in self.text_encoders:
            if name in children:
                out[name] = Modality.TEXT_ENCODER
        return out

    def evaluation_inputs(self, records: Sequence[Any]) -> list[Any]:
        """The prompts of the records."""
        return list(prompts_from(records))

    def primary_modality(self) -> Modality:
        """The denoiser (it runs every step)."""
        return Modality.DENOISER

    def extra_call_kwargs(self) -> dict[str, Any]:
        """Pipeline arguments of the family beyond the shared ones (none by default)."""
        return {}

    def _call(
        self, prompts: Sequence[str], seed: int, module: PipelineModule | None = None
    ) -> np.ndarray:
        """Run the pipeline of ``module`` (default this adapter's) on ``prompts``."""
        runs: nn.Module = self.model if module is None else module
        pipe = runs.__dict__["pipe"]
        children = dict(runs.named_children())
        s = self.settings
        generators = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
        kwargs: dict[str, Any] = {
            "prompt": list(prompts),
            "num_inference_steps": s.steps,
            "generator": generators,
            "output_type": "np",
        }
        if s.guidance_scale is not None:  # None: the pipeline's own default
            kwargs["guidance_scale"] = s.guidance_scale
        if s.height:
            kwargs["height"] = s.height
        if s.width:
            kwargs["width"] = s.width
        kwargs.update(self.extra_call_kwargs())
        clock = StepClock([children[n] for n in self.denoisers if n in children])
        kwargs.update(clock.pipeline_kwargs(pipe))
        with torch.no_grad(), clock:
            out = pipe(**kwargs)
        return np.asarray(getattr(out, self.output_field))

    def pipe_component(self, name: str) -> nn.Module:
        """The pipeline's component ``name`` (one of :attr:`components`)."""
        return self.children()[name]

    def calibration_batch(self) -> int:
        """See :meth:`ModelAdapter.calibration_batch`."""
        return int(self.settings.batch_size)

    def forward_loop(
        self, data: Sequence[Any], limit: int | None = None, first_batch: int = 0
    ) -> ForwardLoop:
        """Sample for the calibration prompts (batches of ``settings.batch_size``, batch ``i``
        of ``b`` prompts seeded ``CALIBRATION_SEED + i * b``): every denoising step of the
        pipeline's own scheduler runs, so every timestep is seen."""
        prompts = prompts_from(data)[:limit] if limit else prompts_from(data)

        def loop(model: nn.Module) -> None:
            # the pipeline of the module given (another adapter's copy runs its own pipeline)
            if not isinstance(model, PipelineModule):
                raise ConfigError(
                    f"the forward loop of {self.model_id} runs a diffusers pipeline; it was given "
                    f"a {type(model).__name__}: pass an adapter's .model"
                )
            batches = batched(prompts, self.settings.batch_size)
            for i, batch in enumerate(progress.iterate(batches, "batch"), start=first_batch):
                with at_batch(i):
                    self._call(batch, seed=CALIBRATION_SEED + i * len(batch), module=model)

        return loop

    def generate(self, inputs: Sequence[Any], seed: int = 0) -> list[np.ndarray]:
        """uint8 results, one per prompt (HxWx3 images; FxHxWx3 frames for video); prompt i
        uses seed ``seed + i``."""
        prompts = prompts_from(inputs)
        outputs: list[np.ndarray] = []
        starts = range(0, len(prompts), self.settings.batch_size)
        for start in progress.iterate(starts, "batch"):
            batch = prompts[start : start + self.settings.batch_size]
            arr = self._call(batch, seed + start)
            nan = np.isnan(arr).reshape(len(arr), -1).any(axis=1)
            self.nan_outputs += int(nan.sum())
            # NaN pixels black, explicitly (a cast of NaN to uint8 is undefined)
            arr = np.nan_to_num(arr, nan=0.0)
            outputs.extend((np.clip(arr, 0, 1) * 255).round().astype(np.uint8))
        return outputs
