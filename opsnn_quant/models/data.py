"""Calibration/evaluation data sources: zoo datasets, ``datasets`` directories, plain folders.

A source string is one of:

* ``zoo:<name>/<split>`` (e.g. ``zoo:shapes/calibration``), the offline demo datasets;
* a ``datasets`` source (:mod:`opsnn_quant.models.hf_data`): a ``.jsonl``/``.json``/``.csv``/
  ``.parquet`` file, a ``save_to_disk`` directory, a ``metadata.jsonl``/``.csv`` folder, a
  directory of data files (e.g. a hub cache snapshot);
* a ``.txt`` file of prompts, one per line (read line by line up to the prompts asked for; a
  line longer than :data:`~opsnn_quant.models.hf_data.MAX_RECORD_BYTES` is refused);
* a folder of ``.wav`` (16-bit PCM mono) and/or ``.flac``, ``.mp3``, ``.ogg``, ``.opus`` (mono)
  files, with an optional
  ``transcripts.tsv`` or ``transcripts.txt`` (``<file name or its stem><TAB><text>`` per line);
  each must be a regular file inside the folder (no link out of it, no FIFO); only the first
  ``limit`` files (by name) are checked and decoded.

Records come back as dicts (``caption``/``prompt``/``text``, ``audio`` + ``sampling_rate``).
"""

from __future__ import annotations

import math
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from opsnn_quant.errors import CalibrationError, ConfigError
from opsnn_quant.models.confine import escape
from opsnn_quant.models.family import find_family
from opsnn_quant.models.hf_data import hf_records, is_hf_source, read_mono, text_lines
from opsnn_quant.sources import named_records

PROMPT_KEYS = ("prompt", "caption", "text")


def load_records(
    source: str,
    limit: int | None = None,
    *,
    column: str | None = None,
    split: str | None = None,
) -> list[dict[str, Any]]:
    """Load a data source as a list of records (see module docstring).

    Args:
        source: the source.
        limit: the first ``limit`` records.
        column: the column of a ``datasets`` source to read (default: its audio column, else
            the first of prompt/text/caption/sentence).
        split: the split of a ``datasets`` source with several (default: train).

    Raises:
        ConfigError: the source does not exist or is not a known kind; ``column``/``split``
            given for a source without columns or splits.
        CalibrationError: the source is empty.
    """
    named = named_records(source, limit)
    path = Path(source)
    if named is not None:
        records = named
    elif not path.exists():
        raise ConfigError(f"data source {source} does not exist")
    elif is_hf_source(path):
        records = hf_records(path, column=column, split=split, limit=limit)
    elif path.is_file() and path.suffix == ".txt":
        records = _prompt_lines(path, limit)
    elif path.is_dir() and any(f.suffix in AUDIO_SUFFIXES for f in path.iterdir()):
        records = _audio_folder(path, limit)
    else:
        raise ConfigError(
            f"data source {source} is not a zoo name, a .txt of prompts, a datasets source "
            "(.jsonl/.json/.csv/.parquet, a save_to_disk or metadata.jsonl folder, a folder of "
            "data files) or a folder of .wav/.flac/.mp3/.ogg/.opus files"
        )
    if (column or split) and (named is not None or not is_hf_source(path)):
        raise ConfigError(f"data source {source} has no columns or splits to choose from")
    if limit is not None:
        records = records[:limit]
    if not records:
        raise CalibrationError(f"data source {source} is empty")
    return records


# .wav read here (16-bit PCM); the others decoded by libsndfile (soundfile: FLAC, MP3 since
# libsndfile 1.1, Ogg Vorbis and Opus)
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus")
TRANSCRIPT_FILES = ("transcripts.tsv", "transcripts.txt")


def _prompt_lines(path: Path, limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` non-blank lines of a ``.txt``, stripped; reading stops there.

    Raises:
        ConfigError: not UTF-8, or a line longer than ``MAX_RECORD_BYTES``
            (:func:`~opsnn_quant.models.hf_data.text_lines`).
    """
    records: list[dict[str, Any]] = []
    if limit is not None and limit <= 0:
        return records
    for _, line in text_lines(path):
        # str.splitlines' line ends (\r, \x85, \u2028...), as the whole file's were split
        records += [{"prompt": p.strip()} for p in line.splitlines() if p.strip()]
        if limit is not None and len(records) >= limit:
            break  # the next line is not read
    return records[:limit]


def _confined(file: Path, folder: Path) -> None:
    """Refuse a file of an audio folder that leads out of it or is no regular file."""
    why = escape(file, folder)
    if why is not None:
        raise ConfigError(f"{file} {why}; an audio folder's files must be regular files inside it")


def _transcripts(path: Path, keys: set[str]) -> dict[str, str]:
    """``<file name or stem><TAB><text>`` lines of the folder's transcript file (either name;
    both at once is ambiguous), those of ``keys`` only, read line by line."""
    found = [path / name for name in TRANSCRIPT_FILES if (path / name).exists()]
    if len(found) > 1:
        raise ConfigError(f"{path} has both {' and '.join(TRANSCRIPT_FILES)}; keep one")
    for file in found:
        _confined(file, path)
    texts: dict[str, str] = {}
    for _, raw in text_lines(found[0]) if found else []:
        for line in raw.splitlines():  # str.splitlines' line ends, as the whole file's were
            k, tab, v = line.partition("\t")
            if tab and k in keys:
                texts[k] = v
    return texts


def _read_audio(file: Path) -> tuple[np.ndarray, int]:
    """A mono file's float32 samples in [-1, 1) and its rate (.wav: 16-bit PCM; .flac, .mp3,
    .ogg, .opus: decoded by soundfile)."""
    if file.suffix != ".wav":
        return read_mono(str(file), str(file), file.suffix)
    try:
        with wave.open(str(file), "rb") as w:
            if w.getsampwidth() != 2 or w.getnchannels() != 1:
                raise ConfigError(f"{file}: only 16-bit PCM mono .wav files are supported")
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    except (wave.Error, EOFError, ValueError) as exc:
        raise ConfigError(f"{file} is not a readable .wav file: {exc}") from exc
    return pcm.astype(np.float32) / 32768.0, rate


def _audio_folder(path: Path, limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` audio files of a folder (by name), each checked, then decoded; the
    others are neither checked nor read."""
    files = sorted(f for f in path.iterdir() if f.suffix in AUDIO_SUFFIXES and not f.is_dir())
    files = files[:limit]
    for file in files:
        _confined(file, path)
    texts = _transcripts(path, {k for f in files for k in (f.name, f.stem)})
    records = []
    for file in files:
        audio, rate = _read_audio(file)
        text = texts.get(file.name, texts.get(file.stem, ""))
        records.append({"audio": audio, "sampling_rate": rate, "text": text, "id": file.name})
    return records


def prompts_from(data: Sequence[Any]) -> list[str]:
    """Prompts from records or strings; empty prompts are an error naming the sample."""
    prompts = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            text = item
        elif isinstance(item, dict):
            key = next((k for k in PROMPT_KEYS if k in item), None)
            if key is None:
                raise CalibrationError(f"sample {i} has no prompt field (one of {PROMPT_KEYS})")
            text = item[key]
        else:
            raise CalibrationError(f"sample {i} is a {type(item).__name__}, not a prompt")
        if not isinstance(text, str) or not text.strip():
            raise CalibrationError(f"sample {i} has an empty prompt")
        prompts.append(text)
    if not prompts:
        raise CalibrationError("the calibration data holds no prompts")
    return prompts


def audio_from(data: Sequence[Any], sampling_rate: int = 16000) -> list[np.ndarray]:
    """Float32 mono waveforms at ``sampling_rate``; NaN/Inf or a wrong rate names the sample."""
    out = []
    for i, item in enumerate(data):
        # a record read from a file names it (an audio folder's "id"), else its position
        where = f"{item['id']} (sample {i})" if isinstance(item, dict) and item.get("id") else (
            f"sample {i}"
        )  # fmt: skip
        if isinstance(item, np.ndarray):
            audio, rate = item, sampling_rate
        elif isinstance(item, dict) and "audio" in item:
            audio = item["audio"]
            if isinstance(audio, dict):  # datasets' Audio feature layout
                rate = int(audio.get("sampling_rate", sampling_rate))
                audio = audio["array"]
            else:
                rate = int(item.get("sampling_rate", sampling_rate))
        else:
            raise CalibrationError(f"sample {i} has no audio")
        arr = np.asarray(audio, dtype=np.float32).reshape(-1)
        if arr.size == 0:
            raise CalibrationError(f"{where} has empty audio")
        if not np.isfinite(arr).all():
            bad = int(np.argmax(~np.isfinite(arr)))
            raise CalibrationError(f"{where} audio contains NaN/Inf (first at index {bad})")
        if rate != sampling_rate:
            raise CalibrationError(
                f"{where} is sampled at {rate} Hz; the model needs {sampling_rate} Hz "
                f"(e.g. ffmpeg -i FILE -ac 1 -ar {sampling_rate} OUT.wav)"
            )
        out.append(arr)
    if not out:
        raise CalibrationError("the calibration data holds no audio")
    return out


# A waveform whose peak is at most this (-80 dBFS, below a 16-bit file's dither) holds nothing a
# model can hear: a transcript of it, or activation ranges measured on it, say nothing.
SILENCE_PEAK = 1e-4


def is_silent(audio: np.ndarray) -> bool:
    """Whether a waveform (floats in [-1, 1]) is silent: its peak at most :data:`SILENCE_PEAK`."""
    return not audio.size or float(np.max(np.abs(audio))) <= SILENCE_PEAK


def speech_from(data: Sequence[Any]) -> list[np.ndarray]:
    """:func:`audio_from`, refusing data whose every waveform is silent."""
    arrays = audio_from(data)
    if all(is_silent(a) for a in arrays):
        raise CalibrationError(
            f"all {len(arrays)} recordings are silent (peak at most {SILENCE_PEAK:g}, -80 dBFS): "
            "activation ranges measured on silence mean nothing; give recordings of speech"
        )
    return arrays


def check_records(family: str, records: Sequence[Any], what: str) -> None:
    """Refuse ``records`` that ``family``'s model cannot take (prompts for a Whisper model,
    audio for a pipeline, a bad sample), or audio that is silent throughout, before the model
    loads: else they would be found only where they are first used (held-out data after the
    whole probe). The family's own check says (:attr:`~opsnn_quant.models.family.Family
    .check_records`); a family without one, or no registered family, passes.

    Args:
        family: the model family.
        records: the loaded records.
        what: where they come from, for the message (``--holdout zoo:shapes/eval``).

    Raises:
        CalibrationError: what is wrong, after ``what``.
    """
    entry = find_family(family)
    if entry is None or entry.check_records is None:
        return
    try:
        entry.check_records(records)
    except CalibrationError as exc:
        raise CalibrationError(f"{what}: {exc} (a {family} model takes {entry.takes})") from None


def batched(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """Consecutive batches of ``size`` (the last may be shorter)."""
    size = max(1, size)
    return [items[i : i + size] for i in range(0, len(items), size)] if items else []


def is_finite_number(x: float) -> bool:
    """True for a finite float."""
    return isinstance(x, int | float) and math.isfinite(x)
