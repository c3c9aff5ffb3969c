"""A model directory checked before it loads: its classes, its configs, its weight files.

:func:`check_model_files` runs with the other checks a command makes before it reads data or
prepares an output (:func:`opsnn_quant.models.check_weights`), and again before a model loads
(:func:`opsnn_quant.models.load_adapter`, the loaders). It reads JSON and the headers of the
safetensors files only (:mod:`opsnn_quant.core.safetensors_header`), so that a corrupt or absurd
model is one line naming the file and the value, never a traceback from a library nor an
allocation of the size a file claims:

- ``model_index.json``: the pipeline's ``_class_name`` and each component's
  ``[library, class]`` name a class of diffusers or transformers (or of a diffusers pipeline
  module, as SD 1.5's ``["stable_diffusion", "StableDiffusionSafetyChecker"]``); nothing else is
  ever imported;
- each component's ``config.json`` (``scheduler_config.json``): the sizes it states are
  integers in sane bounds (:data:`SIZE_BOUNDS`), its ``_class_name`` a diffusers class;
- each ``*.safetensors`` file the load reads (:func:`weight_files`): a valid header whose
  tensors cover the file;
- the config against those headers: the shapes and layer counts it implies are the ones the
  weights have (:data:`SHAPE_RULES`, :data:`LAYER_RULES`).

Checks that need no file are pure functions (:func:`check_config_values`,
:func:`check_config_against_weights`, :func:`index_entries`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsnn_quant.core.safetensors_header import read_safetensors_header
from opsnn_quant.errors import ModelLoadError
from opsnn_quant.sources import Source

LIBRARIES = ("diffusers", "transformers")
"""The libraries a ``model_index.json`` may name (besides diffusers' pipeline modules)."""

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Bounds of the sizes a config states: far above every supported model (SD, SDXL, SD3, FLUX,
# PixArt, Wan, Whisper and their CLIP/T5 encoders), far below what a typo or a hostile file
# would have a library allocate.
MAX_WIDTH = 1 << 17  # channels, hidden and FFN widths, heads (FLUX 3072, T5-XXL FFN 10240)
MAX_LAYERS = 1024
MAX_VOCAB = 1 << 22  # umT5: 256384
MAX_POSITIONS = 1 << 20  # CLIP 77, Whisper 1500, Wan's RoPE 1024
MAX_SIDE = 8192  # a sample's side (VAE pixels, latents, patches)
MAX_GRID = 1024  # SD3's position-embedding grid side (96; 192 for SD 3.5)
MAX_TIMESTEPS = 1_000_000  # the scheduler allocates this many betas (every pipeline: 1000)

_WIDTHS = (
    "hidden_size", "d_model", "intermediate_size", "d_ff", "d_kv", "encoder_ffn_dim",
    "decoder_ffn_dim", "ffn_dim", "freq_dim", "text_dim", "cross_attention_dim",
    "joint_attention_dim", "pooled_projection_dim", "caption_projection_dim", "caption_channels",
    "attention_head_dim", "in_channels", "out_channels", "latent_channels", "block_out_channels",
    "norm_num_groups", "projection_dim", "base_dim", "z_dim", "num_mel_bins",
    "num_attention_heads", "num_heads", "num_key_value_heads", "encoder_attention_heads",
    "decoder_attention_heads",
)  # fmt: skip
_LAYERS = (
    "num_hidden_layers", "num_layers", "encoder_layers", "decoder_layers", "layers_per_block",
    "transformer_layers_per_block", "num_res_blocks",
)  # fmt: skip

SIZE_BOUNDS: dict[str, tuple[int, int]] = {
    **{k: (1, MAX_WIDTH) for k in _WIDTHS},
    **{k: (1, MAX_LAYERS) for k in _LAYERS},
    "num_decoder_layers": (0, MAX_LAYERS),  # T5: present in an encoder-only model's config
    "num_single_layers": (0, MAX_LAYERS),
    "vocab_size": (1, MAX_VOCAB),
    "max_position_embeddings": (1, MAX_POSITIONS),
    "max_source_positions": (1, MAX_POSITIONS),
    "max_target_positions": (1, MAX_POSITIONS),
    "rope_max_seq_len": (1, MAX_POSITIONS),
    "sample_size": (1, MAX_SIDE),
    "patch_size": (1, MAX_SIDE),
    "pos_embed_max_size": (1, MAX_GRID),
    "num_train_timesteps": (1, MAX_TIMESTEPS),
}
"""Config key -> (least, most) of the integer (or of each integer of a list) it states; a key
absent or null is left alone."""


@dataclass(frozen=True)
class ShapeRule:
    """A tensor whose size along one axis a config key states.

    Attributes:
        pattern: the tensor names it applies to (``re.search``); a group, when there is one, is
            an index into the key's list (``down_blocks.(i)`` -> ``block_out_channels[i]``).
        axis: the axis of the tensor's shape.
        keys: the config keys stating it, the first one present counts.
        item: an index into the key's list (its first channel count), when the pattern has no
            group.
        power: the size is the key's value to this power (SD3's square grid of positions).
    """

    pattern: str
    axis: int
    keys: tuple[str, ...]
    item: int | None = None
    power: int = 1


_EMBEDDING = r"(?:^|\.)(?:embed_tokens|token_embedding|shared|word_embeddings)\.weight$"
SHAPE_RULES = (
    ShapeRule(_EMBEDDING, 0, ("vocab_size",)),
    ShapeRule(_EMBEDDING, 1, ("hidden_size", "d_model")),
    ShapeRule(r"(?:^|\.)position_embedding\.weight$", 0, ("max_position_embeddings",)),
    ShapeRule(r"(?:^|\.)position_embedding\.weight$", 1, ("hidden_size",)),
    ShapeRule(r"(?:^|\.)encoder\.embed_positions\.weight$", 0, ("max_source_positions",)),
    ShapeRule(r"(?:^|\.)decoder\.embed_positions\.weight$", 0, ("max_target_positions",)),
    ShapeRule(r"(?:^|\.)embed_positions\.weight$", 1, ("d_model",)),
    ShapeRule(r"^(?:encoder\.)?conv_in\.weight$", 0, ("block_out_channels",), item=0),
    ShapeRule(r"^(?:encoder\.)?conv_in\.weight$", 1, ("in_channels",)),
    ShapeRule(r"^(?:encoder\.)?down_blocks\.(\d+)\.resnets\.0\.conv1\.weight$", 0,
              ("block_out_channels",)),
    ShapeRule(r"^pos_embed\.pos_embed$", 1, ("pos_embed_max_size",), power=2),
)  # fmt: skip
"""The shapes a config implies, compared with the safetensors headers (a rule whose key or
tensor is absent does not apply)."""

LAYER_RULES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("encoder.layers.N", "layers.N"),
    "encoder_layers": ("encoder.layers.N",),
    "decoder_layers": ("decoder.layers.N",),
    "num_layers": ("encoder.block.N", "transformer_blocks.N", "^blocks.N"),  # T5; SD3, FLUX,
    "num_single_layers": ("single_transformer_blocks.N",),  # PixArt; Wan
}
"""Config key -> the tensor names of its layers (``N`` the layer's index; ``^``: at the start
of the name, else after a dot or at the start); the first that names a tensor counts. The
key's count must be the layers the weights have: transformers would start missing layers from
random values and drop extra ones, each with a warning only."""


def _layer_pattern(label: str) -> re.Pattern[str]:
    start = "^" if label.startswith("^") else r"(?:^|\.)"
    return re.compile(start + re.escape(label.lstrip("^")).replace("N", r"(\d+)") + r"\.")


def check_model_files(source: Source) -> None:
    """Check the model directory ``source`` before it loads (see the module's description).

    A zoo model, or a path that is no directory or neither a diffusers pipeline
    (``model_index.json``) nor a transformers model (``config.json``), passes: loading says what
    is wrong with it.

    Args:
        source: the model as the user named it.

    Raises:
        ModelLoadError: the first problem found, one line naming the file.
    """
    if source.named or not source.path.is_dir():
        return
    path = source.path
    if (path / "model_index.json").is_file():
        check_pipeline_files(path)
    elif (path / "config.json").is_file():
        check_component(path, "transformers")


def check_pipeline_files(path: Path) -> None:
    """A diffusers pipeline directory: its index's classes, then each named component's files.

    Raises:
        ModelLoadError: the first problem found.
    """
    index_file = path / "model_index.json"
    index = read_json_object(index_file)
    entries = index_entries(index, str(index_file))
    check_classes(entries, str(index_file))
    for name, (library, _) in sorted(entries.items()):
        if name != "_class_name" and (path / name).is_dir():
            check_component(path / name, library)


def check_component(directory: Path, library: str) -> None:
    """One component (or a transformers model's directory): its config's values, its
    ``_class_name``, its weight files' headers and the config against them.

    Args:
        directory: the component's directory.
        library: the library that loads it (``diffusers``, ``transformers`` or a diffusers
            pipeline module).

    Raises:
        ModelLoadError: the first problem found.
    """
    config_file = next(
        (directory / n for n in ("config.json", "scheduler_config.json")
         if (directory / n).is_file()),
        None,
    )  # fmt: skip
    config = read_json_object(config_file) if config_file is not None else {}
    where = str(config_file)
    check_config_values(config, where)
    name = config.get("_class_name")
    if name is not None and library != "transformers":
        check_classes({"_class_name": ("diffusers", name)}, where)
    shapes: dict[str, tuple[int, ...]] = {}
    files: dict[str, Path] = {}
    for file in weight_files(directory):
        for tensor, entry in read_safetensors_header(file).tensors.items():
            if tensor in files:
                twice = f"{files[tensor].name} and {file.name}"
                raise ModelLoadError(f"{directory}: tensor {tensor} is in both {twice}")
            shapes[tensor], files[tensor] = entry.shape, file
    if config_file is not None and shapes:
        weights = ", ".join(sorted({f.name for f in files.values()}))
        check_config_against_weights(config, shapes, where, weights)


WEIGHT_STEMS = ("diffusion_pytorch_model", "model")
"""The weight file names diffusers and transformers load (``STEM.safetensors``, or the shards
``STEM.safetensors.index.json`` names)."""


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files a load of ``directory`` reads: the shards of its index, else its
    ``diffusion_pytorch_model.safetensors`` or ``model.safetensors``, else (another layout)
    every ``*.safetensors`` file in it.

    Raises:
        ModelLoadError: an index that is not JSON, or names a shard that is missing or outside
            the directory.
    """
    for stem in WEIGHT_STEMS:
        index = directory / f"{stem}.safetensors.index.json"
        if index.is_file():
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()
            ):
                raise ModelLoadError(f"{index}: 'weight_map' must map tensor names to file names")
            shards = sorted(set(weight_map.values()))
            for shard in shards:
                if (
                    Path(shard).name != shard
                    or shard.startswith(".")
                    or not (directory / shard).is_file()
                ):
                    raise ModelLoadError(f"{index}: shard {shard!r} not found in {directory}")
            return [directory / s for s in shards]
        single = directory / f"{stem}.safetensors"
        if single.is_file():
            return [single]
    return sorted(p for p in directory.glob("*.safetensors") if p.is_file())


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
        ModelLoadError: unreadable, not JSON, or not an object.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def index_entries(index: Mapping[str, Any], where: str) -> dict[str, tuple[str, str]]:
    """The classes a ``model_index.json`` names: ``_class_name`` (the pipeline, a diffusers
    class) and each component's ``[library, class]`` (``[null, null]``: absent, skipped, as
    diffusers skips a component without a library).

    Args:
        index: the parsed ``model_index.json``.
        where: what the message names (its path).

    Returns:
        Component name (``_class_name`` for the pipeline) -> (library, class name).

    Raises:
        ModelLoadError: a pair that is not two strings (nor two nulls).
    """
    out: dict[str, tuple[str, str]] = {}
    if "_class_name" in index:
        out["_class_name"] = ("diffusers", index["_class_name"])
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list):
            continue
        if len(value) == 2 and value[0] is None:
            continue  # no library: absent (diffusers passes None)
        if not _IDENTIFIER.match(name):
            raise ModelLoadError(f"{where}: {name!r} is not a component name (an identifier)")
        if len(value) != 2 or not all(isinstance(v, str) for v in value):
            raise ModelLoadError(
                f"{where}: {name} is {value!r}; a component is [library, class] (two strings) "
                "or [null, null]"
            )
        out[name] = (value[0], value[1])
    return out


def check_classes(entries: Mapping[str, tuple[str, str]], where: str) -> None:
    """Each (library, class) names a class the library exports: the library is diffusers,
    transformers or one of diffusers' pipeline modules, the class a plain identifier that is a
    class attribute of it. Nothing but those libraries is imported; an arbitrary dotted path is
    refused from its text.

    Args:
        entries: name -> (library, class name) (:func:`index_entries`).
        where: what the message names (the file's path).

    Raises:
        ModelLoadError: another library, a name that is no identifier, or no class of the
            library. (A library that is not installed is left to the loader to name.)
    """
    import importlib

    for name, (library, cls) in entries.items():
        label = "_class_name" if name == "_class_name" else f"{name}'s class"
        if not isinstance(cls, str) or not _IDENTIFIER.match(cls):
            raise ModelLoadError(
                f"{where}: {label} {cls!r} is not a class name (a plain identifier, e.g. "
                "StableDiffusionPipeline or AutoencoderKL)"
            )
        if not _IDENTIFIER.match(library):
            raise ModelLoadError(_library_message(where, name, library))
        module: Any
        try:
            if library in LIBRARIES:
                module = importlib.import_module(library)
            else:  # diffusers' own pipeline modules only (SD 1.5's safety checker's)
                pipelines = importlib.import_module("diffusers.pipelines")
                module = getattr(pipelines, library, None)
                if getattr(module, "__name__", None) != f"diffusers.pipelines.{library}":
                    raise ModelLoadError(_library_message(where, name, library))
        except ImportError:
            continue  # the loader says which extra to install
        # diffusers' and transformers' lazy modules list every name they export in __all__
        # without importing the submodule behind it (getattr would import a whole pipeline
        # module here, seconds before the loader needs it).
        if not _exports_class(module, cls):
            raise ModelLoadError(
                f"{where}: {label} {cls!r} is not a class of {library}: check the file, or "
                f"the {library} version it needs"
            )


def _exports_class(module: Any, name: str) -> bool:
    """Whether ``module`` exports a class ``name``: one already imported is looked at; one its
    lazy module has not loaded yet is taken on the library's word unless it is a submodule.

    What ``dir(module)`` would say (its attributes and, for a lazy module, its ``__all__``),
    without calling it: transformers' lazy ``__dir__`` rebuilds a list of its ~5000 names with a
    membership test per name (0.3 s a call, six calls per pipeline: 2 s of every load)."""
    import inspect

    if name not in vars(module) and name not in set(getattr(module, "__all__", ())):
        return False
    found = vars(module).get(name)
    if found is not None:
        return inspect.isclass(found)
    return name not in getattr(module, "_modules", set())  # a lazy submodule is no class


def _library_message(where: str, name: str, library: str) -> str:
    return (
        f"{where}: {name} names the library {library!r}; a component is loaded from "
        f"{' or '.join(LIBRARIES)} (or a diffusers pipeline module) only"
    )


def check_config_values(config: Mapping[str, Any], where: str) -> None:
    """The sizes a config states are integers (or lists of integers) within
    :data:`SIZE_BOUNDS`; absent or null keys pass.

    Args:
        config: a parsed ``config.json`` / ``scheduler_config.json``.
        where: what the message names (its path).

    Raises:
        ModelLoadError: the first key out of bounds or of another type, with its value.
    """
    for key, (low, high) in SIZE_BOUNDS.items():
        value = config.get(key)
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        if not items or not all(_is_int(v) and low <= v <= high for v in items):
            what = "a list of integers" if isinstance(value, list) else "an integer"
            raise ModelLoadError(
                f"{where}: {key} is {_short(value)}; it must be {what} from {low} to {high}: "
                "the config is corrupt or not this model's"
            )


def check_config_against_weights(
    config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], where: str, weights: str
) -> None:
    """The shapes and layer counts ``config`` implies are those of the weights
    (:data:`SHAPE_RULES`, :data:`LAYER_RULES`); call after :func:`check_config_values`.

    Args:
        config: the component's parsed config.
        shapes: tensor name -> shape, from the safetensors headers.
        where: what the message names (the config's path).
        weights: the weight files' names (for the message).

    Raises:
        ModelLoadError: the first size or count that differs, with both values.
    """
    for rule in SHAPE_RULES:
        key = next((k for k in rule.keys if config.get(k) is not None), None)
        if key is None:
            continue
        for tensor, shape in shapes.items():
            match = re.search(rule.pattern, tensor)
            if match is None or len(shape) <= rule.axis:
                continue
            value = config[key]
            item = int(match.group(1)) if match.groups() else rule.item
            if item is not None:
                if not isinstance(value, list) or item >= len(value):
                    continue  # a list shorter than the blocks: the layer counts say so
                value = value[item]
            if not _is_int(value) or value**rule.power != shape[rule.axis]:
                stated = f"{key}[{item}]" if item is not None else key
                raise ModelLoadError(
                    f"{where}: {stated} is {value}, but {tensor} in {weights} has shape "
                    f"{list(shape)}: the config does not describe these weights"
                )
    for key, patterns in LAYER_RULES.items():
        count = config.get(key)
        if not isinstance(count, int) or isinstance(count, bool):
            continue
        for label in patterns:
            pattern = _layer_pattern(label)
            found = {int(m.group(1)) for t in shapes if (m := pattern.search(t))}
            if found:
                if found != set(range(count)):
                    raise ModelLoadError(
                        f"{where}: {key} is {count}, but {weights} has the layers "
                        f"{label.lstrip('^')} for N = {_ranges(found)}: the config does not "
                        "describe these weights"
                    )
                break


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _ranges(indices: set[int]) -> str:
    ordered = sorted(indices)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}..{ordered[-1]}" if len(ordered) > 1 else str(ordered[0])
    return _short(ordered)
