"""Data sources through Hugging Face ``datasets``, where users already keep their data.

A source is read by ``datasets`` itself, offline (nothing downloads):

* a ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file (``load_dataset(<builder>,
  data_files=...)``);
* a ``save_to_disk`` directory (a ``Dataset`` or a ``DatasetDict``, whose ``split`` is taken);
* an ``audiofolder`` / ``imagefolder``-style directory: files beside a ``metadata.jsonl`` or
  ``metadata.csv`` whose ``file_name`` column names them;
* a directory of data files, e.g. a dataset snapshot in the local hub cache
  (``load_dataset(<directory>)``, no dataset script).

Records come back in this package's form: ``{"prompt": text}`` for a text column,
``{"audio": float32 array, "sampling_rate": rate, "text": transcript}`` for an audio column. The
column is ``column`` or, by default, the audio column (by feature type) else the first of
:data:`TEXT_COLUMNS`. Audio is decoded with ``soundfile`` (``datasets``' own Audio decoding
needs torchcodec, which is not installed with this package): an Audio column is read undecoded
and its bytes or file decoded here.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from opsnn_quant.errors import ConfigError

TEXT_COLUMNS = ("prompt", "text", "caption", "sentence")
# the reference transcript of an audio record, by the names common speech datasets use
TRANSCRIPT_COLUMNS = ("text", "sentence", "transcript", "transcription", "normalized_text")
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
METADATA_FILES = ("metadata.jsonl", "metadata.csv")


def is_hf_source(path: Path) -> bool:
    """Whether ``path`` is a source this module reads (see the module docstring)."""
    if path.is_file():
        return path.suffix in FILE_BUILDERS
    if not path.is_dir():
        return False
    if any(
        (path / name).exists() for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    ):
        return True
    if any((path / name).exists() for name in METADATA_FILES):
        return True
    if any(f.suffix in (".wav", ".flac") for f in path.iterdir()):
        return False  # a plain audio folder (opsnn_quant.models.data reads it)
    return any(f.suffix in FILE_BUILDERS for f in path.rglob("*") if f.is_file())


def hf_records(
    path: Path, *, column: str | None = None, split: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The records of a ``datasets`` source (the first ``limit``).

    Raises:
        ConfigError: an unreadable source, an unknown split or column (the known ones listed).
    """
    ds = _load(path, split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return _records(ds, column, str(path))


def _load(path: Path, split: str | None) -> Any:
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # "Generating train split" bars between our phase lines
    try:
        if path.is_file():
            ds = datasets.load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path))
        elif any(
            (path / n).exists() for n in ("dataset_info.json", "state.json", "dataset_dict.json")
        ):
            ds = datasets.load_from_disk(str(path))
        elif any((path / name).exists() for name in METADATA_FILES):
            return _metadata_folder(path)
        else:
            ds = datasets.load_dataset(str(path))
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many kinds on a broken source
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"data source {path} is not readable by datasets: {first}") from exc
    finally:
        if shown:
            datasets.enable_progress_bars()
    return _split_of(ds, split, path)


def _split_of(ds: Any, split: str | None, path: Path) -> Any:
    """The split of a DatasetDict (``train`` or its only one by default); a Dataset as is."""
    import datasets

    if isinstance(ds, datasets.Dataset):
        if split not in (None, "train"):
            raise ConfigError(f"data source {path} has no splits; --split {split} does not apply")
        return ds
    names = list(ds)
    chosen = split or ("train" if "train" in names else names[0] if len(names) == 1 else None)
    if chosen not in names:
        raise ConfigError(
            f"data source {path} has splits {', '.join(names)}; "
            + (f"no split {split!r}" if split else "choose one with --split")
        )
    return ds[chosen]


def _metadata_folder(path: Path) -> Any:
    """An audiofolder/imagefolder-style directory as a Dataset of its metadata rows, each with
    ``file_name`` made a path (decoded in :func:`_records`)."""
    import datasets

    meta = next(path / name for name in METADATA_FILES if (path / name).exists())
    builder = "json" if meta.suffix == ".jsonl" else "csv"
    ds = datasets.load_dataset(builder, data_files=str(meta), split="train")
    if "file_name" not in ds.column_names:
        raise ConfigError(f"{meta} has no file_name column (columns: {', '.join(ds.column_names)})")
    return ds.map(lambda r: {"file_name": str(path / r["file_name"])})


def _records(ds: Any, column: str | None, source: str) -> list[dict[str, Any]]:
    """``ds``'s rows in this package's record form, from ``column`` (or the default one)."""
    columns = list(ds.column_names)
    audio = [c for c in columns if _is_audio(ds, c)]
    chosen = column or (
        audio[0] if audio else next((c for c in TEXT_COLUMNS if c in columns), None)
    )
    if chosen is None or chosen not in columns:
        what = (
            f"no column {column!r}" if column else "no prompt/text/caption/sentence or audio column"
        )
        raise ConfigError(
            f"data source {source} has {what}; its columns: {', '.join(columns)}; pick one with --data-column"
        )
    if chosen in audio or chosen == "file_name":
        return _audio_records(ds, chosen, columns, source)
    return [{"prompt": str(row[chosen])} for row in ds]


def _is_audio(ds: Any, column: str) -> bool:
    import datasets

    if isinstance(ds.features.get(column), datasets.Audio):
        return True
    return (
        column == "file_name"
        and len(ds) > 0
        and Path(str(ds[0][column])).suffix in (".wav", ".flac", ".ogg", ".mp3")
    )


def _audio_records(ds: Any, column: str, columns: list[str], source: str) -> list[dict[str, Any]]:
    import datasets

    if isinstance(ds.features.get(column), datasets.Audio):
        ds = ds.cast_column(column, datasets.Audio(decode=False))  # soundfile decodes below
    transcript = next((c for c in TRANSCRIPT_COLUMNS if c in columns and c != column), None)
    out = []
    for i, row in enumerate(ds):
        samples, rate = _decode(row[column], f"{source} row {i}")
        out.append({"audio": samples, "sampling_rate": rate,
                    "text": str(row[transcript]) if transcript else ""})  # fmt: skip
    return out


def _decode(value: Any, where: str) -> tuple[np.ndarray, int]:
    """A mono float32 waveform and its rate from an undecoded Audio value (bytes or a path)."""
    if isinstance(value, dict):
        data = value.get("bytes")
        return read_mono(io.BytesIO(data) if data else value.get("path"), where)
    return read_mono(str(value), where)


def read_mono(target: Any, where: str, kind: str = "audio") -> tuple[np.ndarray, int]:
    """A mono float32 waveform and its rate, decoded with ``soundfile`` from ``target`` (a path
    or a file object); ``where`` and ``kind`` name it in errors.

    Raises:
        ConfigError: not readable by soundfile, or more than one channel.
    """
    import soundfile

    try:
        samples, rate = soundfile.read(target, dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises RuntimeError/LibsndfileError/TypeError
        raise ConfigError(f"{where} is not a readable {kind} file: {exc}") from exc
    if samples.shape[1] != 1:
        raise ConfigError(f"{where}: only mono audio is supported")
    return samples[:, 0], int(rate)
