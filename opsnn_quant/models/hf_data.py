"""Data sources in the forms Hugging Face ``datasets`` keeps them, read here as far as needed.

A source is one of:

* a ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file;
* a ``save_to_disk`` directory (a ``Dataset`` or a ``DatasetDict``, whose ``split`` is taken),
  opened with ``datasets.load_from_disk`` (memory-mapped: nothing is copied);
* an ``audiofolder`` / ``imagefolder``-style directory: files beside a ``metadata.jsonl`` or
  ``metadata.csv`` whose ``file_name`` column names them;
* a directory of data files, e.g. a dataset snapshot in the local hub cache: its splits found by
  ``datasets``' own file-name patterns, each file read as above.

Every file is read here, record by record, and only up to the records asked for (``limit``):
a ``.jsonl`` (and a ``.json`` that is not an array) line by line, a ``.json`` array one element
at a time, a ``.csv`` one record at a time (:mod:`csv`), a ``.parquet`` one row group at a time
and only the columns a record can use (``pyarrow``). No record may be longer than
:data:`MAX_RECORD_BYTES`: a longer one is refused once that much of it is read (a parquet row
group whose text column holds more than that per row, before it is read). Nothing goes through
``datasets.load_dataset``, so nothing is converted to Arrow or written to the ``datasets`` cache.

Records come back in this package's form: ``{"prompt": text}`` for a text column,
``{"audio": float32 array, "sampling_rate": rate, "text": transcript}`` for an audio column. The
column is ``column`` or, by default, the audio column (by feature type, or a ``file_name`` naming
an audio file) else the first of :data:`TEXT_COLUMNS`. Audio is decoded with ``soundfile``
(``datasets``' own Audio decoding needs torchcodec, which is not installed with this package),
only for the records used. A prompt or transcript must be a string (a ``.csv`` cell is text; an
empty one is refused).

Confinement (:mod:`opsnn_quant.models.confine`): a file a data file names (an audio column, a
metadata file's ``file_name``) is relative to the directory holding that data file and must be
a regular file inside the directory the user named (the data file's own directory for a file
source): no ``..``, absolute path, link out, FIFO or device. Every path is checked before any
audio is decoded.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.confine import escape

TEXT_COLUMNS = ("prompt", "text", "caption", "sentence")
# the reference transcript of an audio record, by the names common speech datasets use
TRANSCRIPT_COLUMNS = ("text", "sentence", "transcript", "transcription", "normalized_text")
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
AUDIO_NAME_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
MAX_RECORD_BYTES = 2**20
"""The longest record (a line of a ``.txt``/``.jsonl``, an element of a ``.json``, a ``.csv``
record, a parquet cell of text) and the longest prompt read (1 MiB): a longer one is refused
after reading that much, never loaded whole."""

_CHUNK = 1 << 16  # a .json array is read this much at a time
_TOO_LONG = "is longer than 1048576 bytes (1 MiB), the most one record may hold"


def is_hf_source(path: Path) -> bool:
    """Whether ``path`` is a source this module reads (see the module docstring)."""
    if path.is_file():
        return path.suffix in FILE_BUILDERS
    if not path.is_dir():
        return False
    if any((path / name).exists() for name in SAVED_MARKERS):
        return True
    if any((path / name).exists() for name in METADATA_FILES):
        return True
    if any(f.suffix in (".wav", ".flac") for f in path.iterdir()):
        return False  # a plain audio folder (opsnn_quant.models.data reads it)
    return any(f.suffix in FILE_BUILDERS for f in path.rglob("*") if f.is_file())


def hf_records(
    path: Path, *, column: str | None = None, split: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The records of a source (the first ``limit``; nothing past them is read or decoded).

    Raises:
        ConfigError: an unreadable source, an unknown split or column (the known ones listed),
            a record too long, a file named that leads out of the source's directory.
    """
    if limit is not None and limit <= 0:
        return []
    return _records(_rows(path, split, limit, column), column, str(path))


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
                raise ConfigError(f"{path} line {number} {_TOO_LONG}; split it or shorten it")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{path} is not UTF-8 text (byte {offset + exc.start}: {exc.reason})"
                ) from exc
            offset += len(raw)
            yield number, text.removeprefix("\ufeff") if number == 1 else text


@dataclass
class Rows:
    """Records read from a source, each with where it was read (``p.jsonl line 3``) and the
    directory the file names in it are relative to.

    Attributes:
        rows: the records, as read (a column it lacks: absent).
        where: each record's place, for messages.
        bases: each record's directory (the data file's).
        root: the directory every file a record names must be inside.
        columns: the source's columns (all of them, even those not read).
        audio: the columns typed ``Audio`` (by the source's features).
        textual: every cell is text (a ``.csv``).
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    bases: list[Path] = field(default_factory=list)
    root: Path = Path(".")
    columns: list[str] = field(default_factory=list)
    audio: set[str] = field(default_factory=set)
    textual: bool = False

    @property
    def column_names(self) -> list[str]:
        """The source's columns, those of the rows read where the source names none."""
        return self.columns or list(dict.fromkeys(k for r in self.rows for k in r))

    def add(self, row: dict[str, Any], where: str, base: Path) -> None:
        """Append one record."""
        self.rows.append(row)
        self.where.append(where)
        self.bases.append(base)

    def full(self, limit: int | None) -> bool:
        """Whether ``limit`` records are read (nothing more is)."""
        return limit is not None and len(self.rows) >= limit

    def extend(self, other: Rows) -> None:
        """Append another file's records (the next file of a split)."""
        self.textual = other.textual if not self.rows else self.textual and other.textual
        self.rows += other.rows
        self.where += other.where
        self.bases += other.bases
        self.columns = list(dict.fromkeys([*self.columns, *other.columns]))
        self.audio |= other.audio

    @classmethod
    def of_jsonl(cls, path: Path, limit: int | None, root: Path | None = None) -> Rows:
        """The first ``limit`` records of a JSON Lines file (blank lines skipped); reading stops
        there.

        Raises:
            ConfigError: a line that is not a JSON object, or too long (:func:`text_lines`).
        """
        out = cls(root=root or path.parent)
        if out.full(limit):
            return out
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
            out.add(row, f"{path} line {number}", path.parent)
            if out.full(limit):
                break  # the next line is not read
        return out

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)


def _rows(path: Path, split: str | None, limit: int | None, column: str | None) -> Rows:
    """The source's first ``limit`` records, each checked no longer than the cap."""
    if path.is_file():
        _only_train(path, split)
        return _file_rows(path, limit, column, path.parent)
    if any((path / name).exists() for name in SAVED_MARKERS):
        return _saved_rows(path, split, limit)
    if any((path / name).exists() for name in METADATA_FILES):
        _only_train(path, split)
        return _metadata_folder(path, limit)
    return _data_files_rows(path, split, limit, column)


def _only_train(path: Path, split: str | None) -> None:
    if split not in (None, "train"):
        raise ConfigError(f"data source {path} has splits train; no split {split!r}")


def _file_rows(path: Path, limit: int | None, column: str | None, root: Path) -> Rows:
    """One data file's first ``limit`` records, by its suffix."""
    if path.suffix == ".jsonl":
        return Rows.of_jsonl(path, limit, root)
    if path.suffix == ".json":
        return _json_rows(path, limit, root)
    if path.suffix == ".csv":
        return _csv_rows(path, limit, root)
    return _parquet_rows(path, limit, column, root)


# ---- .json: an array streamed element by element, or JSON Lines ------------------------------


def _json_rows(path: Path, limit: int | None, root: Path) -> Rows:
    """A ``.json``: a top-level array (of objects, or of strings: the ``text`` column, as
    ``datasets`` reads it) one element at a time, else JSON Lines.

    Raises:
        ConfigError: not UTF-8, not valid JSON, an element that is no object or string, one
            longer than :data:`MAX_RECORD_BYTES`.
    """
    if not _starts_an_array(path):
        return Rows.of_jsonl(path, limit, root)
    out = Rows(root=root)
    for number, value in _json_array(path):
        if isinstance(value, str):
            value = {"text": value}
        if not isinstance(value, dict):
            raise ConfigError(f"{path} record {number} is {_what(value)}, not a JSON object")
        out.add(value, f"{path} record {number}", path.parent)
        if out.full(limit):
            break  # the next element is not read
    return out


def _starts_an_array(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(_CHUNK)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return head.removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n").startswith(b"[")


_BLANK = re.compile(r"[ \t\r\n]*")


def _incomplete(exc: json.JSONDecodeError, text: str) -> bool:
    """Whether a decoding error may only be the end of what was read so far (the element goes
    on in the next chunk): an unterminated string, or an error in the last few characters (a
    literal such as ``-Infinity`` cut short). An error earlier stays one whatever follows."""
    return exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 16


def _json_array(path: Path) -> Iterator[tuple[int, Any]]:
    """``(number, element)`` of the top-level array of a ``.json``, decoded one at a time from
    a buffer that holds at most the element being read and a chunk."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    read = 0
    try:
        f = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with f:
        buf, pos, eof = "", 0, False

        def more() -> None:
            nonlocal buf, eof, read
            raw = f.read(_CHUNK)
            try:
                buf += utf8.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{path} is not UTF-8 text (byte {read + exc.start}: {exc.reason})"
                ) from exc
            read += len(raw)
            eof = not raw

        def blanks() -> None:
            nonlocal pos
            while True:
                pos = _BLANK.match(buf, pos).end()  # type: ignore[union-attr]
                if pos < len(buf) or eof:
                    return
                more()

        blanks()
        if buf.startswith("\ufeff", pos):
            pos += 1
            blanks()
        pos += 1  # the "[" (_starts_an_array saw it)
        blanks()
        if buf.startswith("]", pos):
            return
        for number in itertools.count(1):
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                    if end < len(buf) or eof:
                        break  # a number at the end of the buffer may go on: read more
                except json.JSONDecodeError as exc:
                    if eof or not _incomplete(exc, buf):
                        raise ConfigError(
                            f"{path} record {number} is not valid JSON: {exc.msg}"
                        ) from exc
                if len(buf) - pos > MAX_RECORD_BYTES:
                    raise ConfigError(f"{path} record {number} {_TOO_LONG}; split it or shorten it")
                more()
            yield number, value
            pos = end
            blanks()
            if buf.startswith("]", pos):
                return
            if not buf.startswith(",", pos):
                said = "ends" if pos >= len(buf) else f"has {buf[pos]!r}"
                raise ConfigError(
                    f"{path} is not valid JSON: after record {number} it {said} where ',' or "
                    "']' belongs"
                )
            pos += 1
            blanks()
            if pos > _CHUNK:  # keep only what is not decoded yet
                buf, pos = buf[pos:], 0


# ---- .csv: the csv module, one record at a time ----------------------------------------------


def _csv_rows(path: Path, limit: int | None, root: Path) -> Rows:
    """A ``.csv``'s first ``limit`` records: a header line, then one record per row (blank lines
    skipped; an empty cell is missing, as pandas reads it); every cell is text.

    Raises:
        ConfigError: not UTF-8, not valid CSV, a record of more cells than the header names, a
            header naming a column twice, a record longer than :data:`MAX_RECORD_BYTES`.
    """
    out = Rows(root=root, textual=True)
    size = 0  # characters of the record being read (a quoted cell may span lines)

    def lines() -> Iterator[str]:
        nonlocal size
        for _, line in text_lines(path):
            size += len(line)
            if size > MAX_RECORD_BYTES:
                raise ConfigError(
                    f"{path} record {len(out) + 1} {_TOO_LONG}; split it or shorten it"
                )
            yield line

    previous = csv.field_size_limit()
    csv.field_size_limit(max(previous, MAX_RECORD_BYTES))  # records are capped above
    try:
        reader = csv.reader(lines())
        header = next(reader, None)
        if header is None:
            return out
        names = [name or f"Unnamed: {i}" for i, name in enumerate(header)]  # pandas' names
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"{path} header names column {twice[0]!r} twice; rename one")
        out.columns = names
        while not out.full(limit):
            size = 0
            cells = next(reader, None)
            if cells is None:
                break
            if not cells:
                continue  # a blank line
            if len(cells) > len(names):
                raise ConfigError(
                    f"{path} record {len(out) + 1} has {len(cells)} cells, its header names "
                    f"{len(names)} columns"
                )
            row = {n: c for n, c in zip(names, cells, strict=False) if c != ""}
            out.add(row, f"{path} record {len(out) + 1}", path.parent)
    except csv.Error as exc:
        raise ConfigError(f"{path} record {len(out) + 1} is not valid CSV: {exc}") from exc
    finally:
        csv.field_size_limit(previous)
    return out


# ---- .parquet: the row groups and columns needed, nothing else -------------------------------


def _hf_features(schema: Any) -> dict[str, Any]:
    """The ``datasets`` features a parquet file written by ``datasets`` records (its schema's
    ``huggingface`` metadata), by column."""
    meta = (schema.metadata or {}).get(b"huggingface")
    try:
        doc = json.loads(meta) if meta else {}
    except ValueError:
        return {}
    features = doc.get("info", doc).get("features") if isinstance(doc, dict) else None
    return features if isinstance(features, dict) else {}


def _parquet_rows(path: Path, limit: int | None, column: str | None, root: Path) -> Rows:
    """A ``.parquet``'s first ``limit`` records: only the row groups holding them, only the
    columns a record can use (``column``, else the audio, ``file_name`` and text columns, and
    the transcript columns).

    Raises:
        ConfigError: not a parquet file; a text column holding more than
            :data:`MAX_RECORD_BYTES` per record in a row group to read (refused before it is).
    """
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError...
        raise ConfigError(f"{path} is not a readable parquet file: {_first_line(exc)}") from exc
    names = list(pf.schema_arrow.names)
    audio = {
        n for n, f in _hf_features(pf.schema_arrow).items()
        if isinstance(f, dict) and f.get("_type") == "Audio" and n in names
    }  # fmt: skip
    wanted = [column] if column else [*sorted(audio), "file_name", *TEXT_COLUMNS]
    wanted += TRANSCRIPT_COLUMNS
    needed = [n for n in dict.fromkeys(wanted) if n in names]
    out = Rows(root=root, columns=names, audio=audio)
    meta = pf.metadata
    groups: list[int] = []
    count = 0
    for g in range(meta.num_row_groups):
        if limit is not None and count >= limit:
            break
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema
            # a text cell's bytes plus its offset and level; the page headers' slack
            most = group.num_rows * (MAX_RECORD_BYTES + 16) + 2**16
            if name in needed and name not in audio and chunk.total_uncompressed_size > most:
                raise ConfigError(
                    f"{path} records {count + 1}-{count + group.num_rows}: column {name} holds "
                    f"{chunk.total_uncompressed_size} bytes, more than 1048576 bytes (1 MiB) a "
                    "record, the most one record may hold"
                )
        groups.append(g)
        count += group.num_rows
    if not needed:  # no column a record can use: counted, for _records to say so
        for i in range(count if limit is None else min(count, limit)):
            out.add({}, f"{path} record {i + 1}", path.parent)
        return out
    try:
        batches = pf.iter_batches(
            batch_size=min(limit or 1024, 1024), row_groups=groups, columns=needed
        )
        for batch in batches:
            for row in batch.to_pylist():
                out.add(row, f"{path} record {len(out) + 1}", path.parent)
                if out.full(limit):
                    return out
    except Exception as exc:
        raise ConfigError(f"{path} is not a readable parquet file: {_first_line(exc)}") from exc
    return out


# ---- directories: save_to_disk, metadata folders, data files ---------------------------------


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _saved_rows(path: Path, split: str | None, limit: int | None) -> Rows:
    """A ``save_to_disk`` directory's first ``limit`` records (memory-mapped, nothing copied;
    ``Audio`` columns read undecoded)."""
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # "Loading dataset from disk" bars between our phase lines
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises many kinds on a broken source
        raise ConfigError(
            f"data source {path} is not readable by datasets: {_first_line(exc)}"
        ) from exc
    finally:
        if shown:
            datasets.enable_progress_bars()
    ds = _split_of(ds, split, path, list(ds) if isinstance(ds, datasets.DatasetDict) else None)
    audio = {n for n, f in ds.features.items() if isinstance(f, datasets.Audio)}
    for name in audio:
        ds = ds.cast_column(name, datasets.Audio(decode=False))  # soundfile decodes below
    out = Rows(root=path, columns=list(ds.column_names), audio=audio)
    for i in range(len(ds) if limit is None else min(limit, len(ds))):
        out.add(ds[i], f"{path} record {i + 1}", path)
    return out


def _split_of(ds: Any, split: str | None, path: Path, names: list[str] | None) -> Any:
    """The chosen split of ``ds`` (``names``: its splits; None: it has none)."""
    if names is None:
        if split not in (None, "train"):
            raise ConfigError(f"data source {path} has no splits; --split {split} does not apply")
        return ds
    chosen = split or ("train" if "train" in names else names[0] if len(names) == 1 else None)
    if chosen not in names:
        raise ConfigError(
            f"data source {path} has splits {', '.join(names)}; "
            + (f"no split {split!r}" if split else "choose one with --split")
        )
    return ds[chosen]


def _data_files_rows(path: Path, split: str | None, limit: int | None, column: str | None) -> Rows:
    """A directory of data files (a hub cache dataset snapshot): the split's files, found by
    ``datasets``' own file-name patterns (``train-00000-of-00001.parquet``, ``test.csv``...),
    read in order up to ``limit`` records; each must be a regular file inside the directory.
    """
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        files = DataFilesDict.from_patterns(get_data_patterns(str(path)), base_path=str(path))
    except Exception as exc:
        raise ConfigError(
            f"data source {path} is not readable by datasets: {_first_line(exc)}"
        ) from exc
    chosen = [Path(f) for f in _split_of(files, split, path, list(files))]
    chosen = [f for f in chosen if f.suffix in FILE_BUILDERS]
    if not chosen:
        raise ConfigError(f"data source {path} holds no .jsonl/.json/.csv/.parquet file there")
    out = Rows(root=path)
    for file in chosen:
        why = escape(file, path)
        if why is not None:
            raise ConfigError(f"data file {file} {why}; a data directory's files must be inside it")
        out.extend(_file_rows(file, None if limit is None else limit - len(out), column, path))
        if out.full(limit):
            break
    return out


def _metadata_folder(path: Path, limit: int | None) -> Rows:
    """An audiofolder/imagefolder-style directory: its metadata rows, each with ``file_name``
    made a path (decoded in :func:`_records`).

    Raises:
        ConfigError: no ``file_name`` column; a ``file_name`` that is not a string, leads out of
            the folder (``..``, an absolute path, a link) or is no regular file (a FIFO): the
            row named.
    """
    meta = next(path / name for name in METADATA_FILES if (path / name).exists())
    why = escape(meta, path)
    if why is not None:
        raise ConfigError(f"{meta} {why}")
    rows = Rows.of_jsonl(meta, limit, path) if meta.suffix == ".jsonl" else (
        _csv_rows(meta, limit, path)
    )  # fmt: skip
    if len(rows) == 0:
        return rows
    if "file_name" not in rows.column_names:
        raise ConfigError(
            f"{meta} has no file_name column (columns: {', '.join(rows.column_names)})"
        )
    for row, where in zip(rows.rows, rows.where, strict=True):
        name = _text(row.get("file_name", _MISSING), "file_name", where, textual=False)
        why = escape(path / name, path)
        if why is not None:
            raise ConfigError(
                f"{where}: file_name {name!r} {why}; a metadata file names files inside its folder"
            )
        row["file_name"] = str(path / name)
    return rows


# ---- records -------------------------------------------------------------------------------


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
    """``value`` if it is text (a number of a ``textual`` source as it reads); refused
    otherwise, naming ``where``.

    Raises:
        ConfigError: not a string, or longer than :data:`MAX_RECORD_BYTES`.
    """
    if textual and isinstance(value, int | float) and _what(value) != "null":
        value = str(value)
    if not isinstance(value, str):
        said = "empty" if textual else "missing" if value is _MISSING else _what(value)
        raise ConfigError(f"{where}: {what} is {said}" + ("" if textual else ", not a string"))
    if len(value) > MAX_RECORD_BYTES // 4 and len(value.encode("utf-8")) > MAX_RECORD_BYTES:
        raise ConfigError(f"{where}: {what} {_TOO_LONG}")
    return value


_MISSING = object()


def _records(rows: Rows, column: str | None, source: str) -> list[dict[str, Any]]:
    """The rows in this package's record form, from ``column`` (or the default one).

    Raises:
        ConfigError: no such column; a prompt or transcript that is not a string (the record
            named); an audio file named that is not a regular file inside the source.
    """
    if len(rows) == 0:
        return []  # the caller says the source is empty
    columns = rows.column_names
    audio = [c for c in columns if _is_audio(rows, c)]
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
        return _audio_records(rows, chosen, columns)
    return [
        {"prompt": _text(row.get(chosen, _MISSING), chosen, where, rows.textual)}
        for row, where in zip(rows.rows, rows.where, strict=True)
    ]


def _is_audio(rows: Rows, column: str) -> bool:
    if column in rows.audio:
        return True
    return (
        column == "file_name"
        and len(rows) > 0
        and Path(str(rows.rows[0].get(column))).suffix in AUDIO_NAME_SUFFIXES
    )


def _audio_records(rows: Rows, column: str, columns: list[str]) -> list[dict[str, Any]]:
    """Audio records: every file named checked first (confined), then each decoded."""
    transcript = next((c for c in TRANSCRIPT_COLUMNS if c in columns and c != column), None)
    sources = [
        _audio_source(row.get(column), where, base, rows.root)
        for row, where, base in zip(rows.rows, rows.where, rows.bases, strict=True)
    ]
    out = []
    for row, where, source in zip(rows.rows, rows.where, sources, strict=True):
        text = ""
        if transcript:
            value = row.get(transcript, _MISSING)
            empty = rows.textual and value is _MISSING
            text = "" if empty else _text(value, f"transcript {transcript}", where, rows.textual)
        samples, rate = read_mono(source, where)
        out.append({"audio": samples, "sampling_rate": rate, "text": text})
    return out


def _audio_source(value: Any, where: str, base: Path, root: Path) -> Any:
    """What :func:`read_mono` reads for an undecoded audio value: its bytes, or the file it
    names (relative to ``base``), which must be a regular file inside ``root``.

    Raises:
        ConfigError: not a file name; a file that leads out of ``root`` or is no regular file.
    """
    if isinstance(value, dict) and value.get("bytes"):
        return io.BytesIO(value["bytes"])
    file = value.get("path") if isinstance(value, dict) else value
    if not isinstance(file, str):
        raise ConfigError(f"{where}: the audio is {_what(file)}, not a file name")
    path = base / file  # an absolute name stays itself
    why = escape(path, root)
    if why is not None:
        raise ConfigError(
            f"{where}: audio {file!r} {why}; a data file names audio files inside the "
            f"directory holding it ({root})"
        )
    return str(path)


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
