"""The files of a model directory its loaders read, and the rest.

diffusers, transformers and the engines that load their layouts (vLLM 0.23.0 and vllm-ascend
0.23.0.post1 for an AscendV1 export, diffusers + MindIE-SD for a pipeline) read a fixed set of
files from a model directory, never the whole of it:

- a transformers model (``config.json`` at the top, Whisper's): the files at its top level, its
  configs (``config.json``, ``generation_config.json``), tokenizer and processor files
  (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``, ``vocab.json``,
  ``merges.txt``, ``added_tokens.json``, ``normalizer.json``, ``preprocessor_config.json``,
  ``processor_config.json``, ``chat_template.jinja``/``.json``, SentencePiece ``spiece.model``/
  ``tokenizer.model``, ``*.tiktoken``), remote code (``*.py``) and its weights;
- a diffusers pipeline (``model_index.json``): ``model_index.json``, then each component the
  index names with a library (``[null, null]`` is absent), the same files at the top of that
  component's folder (``config.json``, ``scheduler/scheduler_config.json``, ``tokenizer/``'s
  files, ``feature_extractor/preprocessor_config.json``, the weights).

Helper files are matched by :data:`HELPER_GLOBS`, whose floor is msModelSlim's ``copy_files``
(``*.json``, ``*.py``, ``*.txt``, ``*.jinja`` of the model's top folder, msModelSlim
``save/ascendv1.py``), which an AscendV1 directory is expected to carry; weight files by their
suffix. Nothing else is read: a dotfile or anything under a dot-directory (``.env``, ``.git/``,
``.cache/``), a ``README.md``, a key such as ``id_rsa``, a folder the index does not name, a
checkpoint at a pipeline's top level. :func:`model_files` sorts a directory into the two;
:func:`check_model_sources` refuses, before any work, a file of the first kind that is no regular
file inside the directory (:func:`~opsnn_quant.models.confine.escape`: a link out of it, a FIFO,
a device; a hub cache snapshot's links into its ``blobs/`` count as inside). Folders are listed,
never walked: a ``.git`` of any size costs one directory entry.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from opsnn_quant.errors import ModelLoadError
from opsnn_quant.models.confine import DIRECTORY, OURS, escape
from opsnn_quant.sources import Source

HELPER_GLOBS = ("*.json", "*.py", "*.txt", "*.jinja", "*.model", "*.tiktoken")
"""Files a loader reads beside the weights: msModelSlim's ``copy_files`` globs (``*.json``:
configs, tokenizer and processor files, ``model_index.json``, scheduler configs; ``*.txt``:
``merges.txt``, ``vocab.txt``; ``*.jinja``: chat templates; ``*.py``: the code a
``trust_remote_code`` load imports), and the tokenizer model files msModelSlim leaves behind
(SentencePiece's ``spiece.model``/``tokenizer.model``, tiktoken's ``*.tiktoken``), which
transformers' tokenizers and vLLM's read from the model directory."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
"""Weight files a torch load reads (diffusers, transformers, vLLM's default loader: safetensors,
else pickles). Flax ``*.msgpack``, TensorFlow ``*.h5``, ONNX graphs and single-file ``*.ckpt``
checkpoints beside them are read by none of them."""

CACHE_STAMP = "opsnn_quant_stamp.json"
"""The stamp of a model converted into our cache (``opsnn_quant.zoo.whisper.STAMP_NAME``): our
bookkeeping, never the model's."""

SKIPPED = (*OURS, CACHE_STAMP)
"""Our own files in a model directory: neither read nor reported."""

VCS = (".git", ".hg", ".svn")

NOT_READ = "not read by the engine"
NOT_A_COMPONENT = "not a component named in model_index.json"


def is_helper(name: str) -> bool:
    """Whether a file named ``name`` is one a loader reads beside the weights."""
    return not name.startswith(".") and any(fnmatch.fnmatchcase(name, g) for g in HELPER_GLOBS)


def is_weight(name: str) -> bool:
    """Whether a file named ``name`` is a weight file (its loader reads it)."""
    return not name.startswith(".") and name.endswith(WEIGHT_SUFFIXES)


@dataclass(frozen=True)
class ModelFiles:
    """A model directory sorted by what its loaders read.

    Attributes:
        root: the model directory.
        pipeline: a diffusers pipeline (``model_index.json``).
        read: folder (``""`` the directory itself, else a pipeline component's name) -> the
            helper and weight files the loaders read there, sorted (a pipeline's top level:
            its helper files only).
        left_out: each entry read by no loader (relative, a folder ending in ``/``) -> why.
    """

    root: Path
    pipeline: bool
    read: dict[str, list[Path]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)

    def files(self) -> list[Path]:
        """Every file the loaders read."""
        return [p for ps in self.read.values() for p in ps]


def model_files(root: Path) -> ModelFiles:
    """Sort the model directory ``root`` (see the module's description). Nothing is opened
    but ``model_index.json``, and that only when it is a regular file inside ``root``.

    Args:
        root: a directory (anything else: nothing is read from it).

    Returns:
        The :class:`ModelFiles`.
    """
    if not root.is_dir():  # nothing to read here (a named model: its loader's)
        return ModelFiles(root, False, {"": []})
    pipeline = (root / "model_index.json").is_file()
    components = _components(root) if pipeline else set()
    read: dict[str, list[Path]] = {"": []}
    left_out: dict[str, str] = {}
    for path in _entries(root):
        name = path.name
        if name.startswith("."):
            left_out[_shown(path, root)] = _hidden(path)
        elif path.is_dir():
            if name in components:
                read[name] = _folder(path, root, left_out)
            else:
                left_out[f"{name}/"] = NOT_A_COMPONENT if pipeline else NOT_READ
        elif is_helper(name) or (is_weight(name) and not pipeline):
            read[""].append(path)  # a pipeline's top level: model_index.json, no weights
        else:
            left_out[name] = NOT_READ
    return ModelFiles(root, pipeline, dict(sorted(read.items())), left_out)


def check_model_sources(source: Source) -> None:
    """Refuse a model directory a file of which the loaders read (or an export copies) although
    it is no regular file inside the directory: a weight file, config or tokenizer file that is
    a link leading out of it, a FIFO, a device, a broken link, a folder; a component folder
    linked out of it. Checked before any work, by every command that reads a model
    (:func:`opsnn_quant.models.check_weights`), and again by the exporter. Named sources
    (``zoo:...``) and paths that are no directory pass (their loader says what is wrong).

    Raises:
        ModelLoadError: the first such file, named with the reason.
    """
    if source.named or not source.path.is_dir():
        return
    root = source.path
    try:
        found = model_files(root)
    except OSError as exc:
        raise ModelLoadError(f"{root}: cannot be read ({exc.strerror or exc})") from exc
    for name in found.read:
        if name:  # a component folder: inside the model directory
            why = escape(root / name, root)
            if why is not None and why != DIRECTORY:
                raise ModelLoadError(refusal(root / name, why))
    for path in found.files():
        why = escape(path, root)
        if why is not None:
            raise ModelLoadError(refusal(path, why))


def refusal(path: Path, why: str) -> str:
    """The one-line refusal of a model file the loaders would read."""
    return (
        f"model file {path} {why}; opsnn-quant reads (and exports) only regular files inside "
        "the model directory: replace it with the file itself (a copy or a hard link) or "
        "remove it"
    )


def _entries(folder: Path) -> list[Path]:
    """The entries of ``folder`` but our own files, sorted by name (a folder that cannot be
    listed: ``OSError``)."""
    with os.scandir(folder) as it:
        names = sorted(e.name for e in it if e.name not in SKIPPED)
    return [folder / n for n in names]


def _shown(path: Path, root: Path) -> str:
    rel = path.relative_to(root).as_posix()
    return f"{rel}/" if path.is_dir() else rel


def _hidden(path: Path) -> str:
    if path.is_dir():
        return "VCS tree" if path.name in VCS else "hidden directory"
    return "hidden file"


def _folder(folder: Path, root: Path, left_out: dict[str, str]) -> list[Path]:
    """The helper and weight files at the top of a component's ``folder``; the other entries
    go to ``left_out``."""
    read = []
    for path in _entries(folder):
        name = path.name
        if name.startswith("."):
            left_out[_shown(path, root)] = _hidden(path)
        elif path.is_dir():
            left_out[_shown(path, root)] = NOT_READ
        elif is_helper(name) or is_weight(name):
            read.append(path)
        else:
            left_out[_shown(path, root)] = NOT_READ
    return read


def _components(root: Path) -> set[str]:
    """The components ``model_index.json`` names with a library (diffusers loads those folders;
    ``[null, null]`` is absent). An index that is no regular JSON object inside ``root``: every
    folder counts (what the index says is checked, and refused, by the model checks)."""
    index = root / "model_index.json"
    doc: object = None
    if escape(index, root) is None:
        try:
            doc = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            doc = None
    if not isinstance(doc, dict):
        return {p.name for p in _entries(root) if p.is_dir() and not p.name.startswith(".")}
    return {
        k for k, v in doc.items()
        if isinstance(k, str) and not k.startswith("_") and isinstance(v, list) and len(v) == 2
        and v[0] is not None
    }  # fmt: skip
