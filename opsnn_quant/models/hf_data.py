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

A ``.jsonl`` file (and a folder's ``metadata.jsonl``) is read here, line by line, up to the
records asked for; no line, and no prompt of any source, may be longer than
:data:`MAX_RECORD_BYTES`. A prompt or transcript must be a string (a ``.csv`` cell is text
whatever ``datasets`` makes of it; an empty one is refused). A metadata file's ``file_name``
must name a regular file inside its folder (:mod:`opsnn_quant.models.confine`).
"""

from __future__ import annotations

import io
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.confine import escape, not_regular

TEXT_COLUMNS = ("prompt", "text", "caption", "sentence")
# the reference transcript of an audio record, by the names common speech datasets use
TRANSCRIPT_COLUMNS = ("text", "sentence", "transcript", "transcription", "normalized_text")
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
MAX_RECORD_BYTES = 2**20
"""The longest line of a ``.txt``/``.jsonl`` file and the longest prompt read (1 MiB): a longer
one is refused after reading that much, never loaded whole."""


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
    if path.is_file() and path.suffix == ".jsonl":
        if split not in (None, "train"):
            raise ConfigError(f"data source {path} has splits train; no split {split!r}")
        return _records(Rows.of_jsonl(path, limit), column, str(path))
    ds = _load(path, split, limit)
    if limit is not None and not isinstance(ds, Rows):
        ds = ds.select(range(min(limit, len(ds))))
    return _records(ds, column, str(path))


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of a UTF-8 file, read one line at a time (a reader that stops
    early reads no further).

    Raises:
        ConfigError: not readable, not UTF-8 (the byte named), or a line longer than
            :data:`MAX_RECORD_BYTES` (refused once that much is read).
    """
    try:
        f = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with f:
        offset = 0
        for number in itertools.count(1):
            raw = f.readline(MAX_RECORD_BYTES + 1)
            if not raw:
                return
            if len(raw) > MAX_RECORD_BYTES and not raw.endswith(b"\n"):
                raise ConfigError(
                    f"{path} line {number} is longer than {MAX_RECORD_BYTES} bytes (1 MiB), the "
                    "most one record may hold; split it or shorten it"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{path} is not UTF-8 text (byte {offset + exc.start}: {exc.reason})"
                ) from exc
            offset += len(raw)
            yield number, text.removeprefix("\ufeff") if number == 1 else text


class Rows:
    """Rows read here (a ``.jsonl``), shaped as the little of a ``datasets.Dataset`` that
    :func:`_records` uses, each with where it was read (``p.jsonl line 3``)."""

    features: ClassVar[dict[str, Any]] = {}  # no feature types: no Audio column by type

    def __init__(self, rows: list[dict[str, Any]], where: list[str]) -> None:
        self.rows = rows
        self.where = where
        self.column_names = list(dict.fromkeys(k for r in rows for k in r))

    @classmethod
    def of_jsonl(cls, path: Path, limit: int | None) -> Rows:
        """The first ``limit`` records of a JSON Lines file (blank lines skipped); reading stops
        there.

        Raises:
            ConfigError: a line that is not a JSON object, or too long (:func:`text_lines`).
        """
        rows: list[dict[str, Any]] = []
        where: list[str] = []
        if limit is not None and limit <= 0:
            return cls(rows, where)
        for number, line in text_lines(path):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"{path} line {number} is not valid JSON: {exc.msg} (column {exc.colno})"
                ) from exc
            if not isinstance(row, dict):
                raise ConfigError(f"{path} line {number} is {_what(row)}, not a JSON object")
            rows.append(row)
            where.append(f"{path} line {number}")
            if limit is not None and len(rows) >= limit:
                break  # the next line is not read
        return cls(rows, where)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)


def _where(ds: Any, i: int, source: str) -> str:
    return ds.where[i] if isinstance(ds, Rows) else f"{source} record {i + 1}"


def _what(value: Any) -> str:
    """``value`` in a refusal: ``null``, ``a number (5)``, ``a list``..."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _text(value: Any, what: str, where: str, textual: bool) -> str:
    """``value`` if it is text (a number of a ``textual`` source, a .csv, as it reads);
    refused otherwise, naming ``where``.

    Raises:
        ConfigError: not a string, or longer than :data:`MAX_RECORD_BYTES`.
    """
    if textual and isinstance(value, int | float) and _what(value) != "null":
        value = str(value)  # a .csv cell datasets read as a number (True/False included)
    if not isinstance(value, str):
        said = "missing" if value is _MISSING else "empty" if textual else _what(value)
        raise ConfigError(f"{where}: {what} is {said}" + ("" if textual else ", not a string"))
    if len(value) > MAX_RECORD_BYTES // 4 and len(value.encode("utf-8")) > MAX_RECORD_BYTES:
        raise ConfigError(
            f"{where}: {what} is longer than {MAX_RECORD_BYTES} bytes (1 MiB), the most one "
            "record may hold"
        )
    return value


_MISSING = object()


def _load(path: Path, split: str | None, limit: int | None = None) -> Any:
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # "Generating train split" bars between our phase lines
    try:
        if path.is_file():
            ds = datasets.load_dataset(
                FILE_BUILDERS[path.suffix], data_files=str(path), **_csv_text(path)
            )
        elif any(
            (path / n).exists() for n in ("dataset_info.json", "state.json", "dataset_dict.json")
        ):
            ds = datasets.load_from_disk(str(path))
        elif any((path / name).exists() for name in METADATA_FILES):
            return _metadata_folder(path, limit)
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


def _csv_text(path: Path) -> dict[str, Any]:
    """``load_dataset`` keywords reading every column of a ``.csv`` as text (``features``; its
    cells are text: ``007`` stays ``007``, not the number 7.0 pandas makes of it), from its
    header line; none for another file or a header of empty or repeated names."""
    import csv

    import datasets

    if path.suffix != ".csv":
        return {}
    header = next((line for _, line in text_lines(path)), "")
    names = next(csv.reader([header.removeprefix("\ufeff")]), [])
    if not names or "" in names or len(set(names)) != len(names):
        return {}
    return {"features": datasets.Features({n: datasets.Value("string") for n in names})}


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


def _metadata_folder(path: Path, limit: int | None) -> Any:
    """An audiofolder/imagefolder-style directory as a Dataset (or :class:`Rows`) of its
    metadata rows, each with ``file_name`` made a path (decoded in :func:`_records`).

    Raises:
        ConfigError: no ``file_name`` column; a ``file_name`` that is not a string, leads out of
            the folder (``..``, an absolute path, a link) or is no regular file (a FIFO): the
            row named.
    """
    import datasets

    meta = next(path / name for name in METADATA_FILES if (path / name).exists())
    why = escape(meta, path)
    if why is not None:
        raise ConfigError(f"{meta} {why}")
    ds: Any
    if meta.suffix == ".jsonl":
        ds = Rows.of_jsonl(meta, limit)
    else:
        ds = datasets.load_dataset("csv", data_files=str(meta), split="train", **_csv_text(meta))
    if len(ds) == 0:
        return ds
    if "file_name" not in ds.column_names:
        raise ConfigError(f"{meta} has no file_name column (columns: {', '.join(ds.column_names)})")
    if limit is not None and not isinstance(ds, Rows):
        ds = ds.select(range(min(limit, len(ds))))
    names = [r.get("file_name", _MISSING) for r in ds] if isinstance(ds, Rows) else ds["file_name"]
    paths = []
    for i, name in enumerate(names):
        where = _where(ds, i, str(meta))
        name = _text(name, "file_name", where, textual=False)
        why = escape(path / name, path)
        if why is not None:
            raise ConfigError(
                f"{where}: file_name {name!r} {why}; a metadata file names files inside its folder"
            )
        paths.append(str(path / name))
    if isinstance(ds, Rows):
        for row, file in zip(ds.rows, paths, strict=True):
            row["file_name"] = file
        return ds
    return ds.map(lambda r, i: {"file_name": paths[i]}, with_indices=True)


def _records(ds: Any, column: str | None, source: str) -> list[dict[str, Any]]:
    """``ds``'s rows in this package's record form, from ``column`` (or the default one).

    Raises:
        ConfigError: no such column; a prompt or transcript that is not a string (the record
            named).
    """
    if len(ds) == 0:
        return []  # the caller says the source is empty
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
    textual = _is_csv(ds)
    return [
        {"prompt": _text(row.get(chosen, _MISSING), chosen, _where(ds, i, source), textual)}
        for i, row in enumerate(ds)
    ]


def _is_csv(ds: Any) -> bool:
    """Whether ``ds`` was read from CSV (its cells are text; ``datasets`` makes numbers of
    some)."""
    info = getattr(ds, "info", None)
    return getattr(info, "builder_name", None) == "csv"


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
    textual = _is_csv(ds)
    out = []
    for i, row in enumerate(ds):
        where = _where(ds, i, source)
        text = ""
        if transcript:
            value = row.get(transcript, _MISSING)
            empty = textual and (value is None or (isinstance(value, float) and math.isnan(value)))
            text = "" if empty else _text(value, f"transcript {transcript}", where, textual)
        samples, rate = _decode(row[column], where)
        out.append({"audio": samples, "sampling_rate": rate, "text": text})
    return out


def _decode(value: Any, where: str) -> tuple[np.ndarray, int]:
    """A mono float32 waveform and its rate from an undecoded Audio value (bytes or a path)."""
    if isinstance(value, dict) and value.get("bytes"):
        return read_mono(io.BytesIO(value["bytes"]), where)
    file = value.get("path") if isinstance(value, dict) else value
    if not isinstance(file, str):
        raise ConfigError(f"{where}: the audio is {_what(file)}, not a file name")
    why = not_regular(Path(file))  # a FIFO would block the read forever
    if why is not None:
        raise ConfigError(f"{where}: {file} {why}")
    return read_mono(file, where)


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
