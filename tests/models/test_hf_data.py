"""Data through Hugging Face ``datasets``: each source form, the column and split choices, and
audio decoded with soundfile (no torchcodec)."""

from __future__ import annotations

import json
import os
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.data import load_records

datasets = pytest.importorskip("datasets")
PCM = np.array([0, 8192, -16384, 32767, -32768, 1], dtype="<i2")


def _prompts(records):
    return [r["prompt"] for r in records]


def test_jsonl_json_csv_and_parquet_files(tmp_path):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": i, "prompt": f"p{i}"}) + "\n"
                                              for i in range(3)))  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps([{"text": "a"}, {"text": "b"}]))
    (tmp_path / "p.csv").write_text("caption,score\nred circle,1\nblue square,2\n")
    datasets.Dataset.from_dict({"sentence": ["x", "y"]}).to_parquet(str(tmp_path / "p.parquet"))
    assert _prompts(load_records(str(tmp_path / "p.jsonl"))) == ["p0", "p1", "p2"]
    assert _prompts(load_records(str(tmp_path / "p.jsonl"), 2)) == ["p0", "p1"]
    assert _prompts(load_records(str(tmp_path / "p.json"))) == ["a", "b"]
    assert _prompts(load_records(str(tmp_path / "p.csv"))) == ["red circle", "blue square"]
    assert _prompts(load_records(str(tmp_path / "p.parquet"))) == ["x", "y"]
    # another column on request; a column that does not exist lists the columns
    assert _prompts(load_records(str(tmp_path / "p.csv"), column="score")) == ["1", "2"]
    with pytest.raises(ConfigError, match=r"has no column 'prompt'; its columns: caption, score"):
        load_records(str(tmp_path / "p.csv"), column="prompt")
    (tmp_path / "q.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="no prompt/text/caption/sentence or audio column"):
        load_records(str(tmp_path / "q.csv"))


def test_a_save_to_disk_dataset_dict_and_its_splits(tmp_path):
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"prompt": ["t0", "t1"]}),
        "test": datasets.Dataset.from_dict({"prompt": ["s0"]}),
    })  # fmt: skip
    dd.save_to_disk(str(tmp_path / "dd"))
    assert _prompts(load_records(str(tmp_path / "dd"))) == ["t0", "t1"]  # train by default
    assert _prompts(load_records(str(tmp_path / "dd"), split="test")) == ["s0"]
    with pytest.raises(ConfigError, match="has splits train, test; no split 'dev'"):
        load_records(str(tmp_path / "dd"), split="dev")
    # a .txt has neither columns nor splits
    (tmp_path / "p.txt").write_text("a\n")
    with pytest.raises(ConfigError, match="has no columns or splits"):
        load_records(str(tmp_path / "p.txt"), column="prompt")


def _wav(path: Path, pcm: np.ndarray) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())


def test_an_audiofolder_with_metadata_decodes_with_soundfile(tmp_path):
    folder = tmp_path / "speech"
    (folder / "clips").mkdir(parents=True)
    _wav(folder / "clips" / "a.wav", PCM)
    soundfile.write(str(folder / "clips" / "b.flac"), PCM[::-1].copy(), 16000, subtype="PCM_16")
    rows = [{"file_name": "clips/a.wav", "transcription": "hello"},
            {"file_name": "clips/b.flac", "transcription": "good morning"}]  # fmt: skip
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_records(str(folder))
    assert [r["text"] for r in records] == ["hello", "good morning"]
    assert np.array_equal(records[0]["audio"], PCM.astype(np.float32) / 32768.0)
    assert np.array_equal(records[1]["audio"], PCM[::-1].astype(np.float32) / 32768.0)
    assert records[0]["sampling_rate"] == 16000


def test_an_audio_feature_dataset_saved_and_in_a_data_files_directory(tmp_path):
    # datasets' Audio feature (LibriSpeech-style) decoded here with soundfile: save_to_disk of
    # undecoded audio, and parquet shards in a hub-cache-like snapshot directory
    _wav(tmp_path / "a.wav", PCM)
    ds = datasets.Dataset.from_dict({"audio": [str(tmp_path / "a.wav")], "text": ["hi there"]})
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    ds.save_to_disk(str(tmp_path / "saved"))
    for source in (tmp_path / "saved",):
        records = load_records(str(source))
        assert records[0]["text"] == "hi there"
        assert np.array_equal(records[0]["audio"], PCM.astype(np.float32) / 32768.0)
    snapshot = tmp_path / "hub" / "datasets--me--speech" / "snapshots" / "abc" / "data"
    snapshot.mkdir(parents=True)
    ds = datasets.Dataset.from_dict({"sentence": ["one", "two"]})
    ds.to_parquet(str(snapshot / "train-00000-of-00001.parquet"))
    assert _prompts(load_records(str(snapshot.parent))) == ["one", "two"]


# ---- issue 41: files a metadata file names; prompts that are not strings; streaming -------


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name", ["../outside/secret.wav", "ABS", "../" * 32 + "etc/passwd"])
def test_a_metadata_file_naming_a_file_out_of_its_folder_is_refused(name, tmp_path):
    # before: opened (../outside/secret.wav was read silently)
    folder = tmp_path / "speech"
    folder.mkdir()
    (tmp_path / "outside").mkdir()
    _wav(folder / "a.wav", PCM)
    _wav(tmp_path / "outside" / "secret.wav", PCM)
    name = str(tmp_path / "outside" / "secret.wav") if name == "ABS" else name
    meta = _jsonl(folder / "metadata.jsonl", [{"file_name": "a.wav", "text": "hi"}, {},
                                              {"file_name": name, "text": "yo"}])  # fmt: skip
    meta.write_text(meta.read_text().replace("{}\n", "\n"))  # a blank line 2: line 3 named
    with pytest.raises(ConfigError) as err:
        load_records(str(folder))
    assert str(err.value) == (
        f"{meta} line 3: file_name {name!r} resolves to {os.path.realpath(folder / name)}, "
        f"outside {folder}; a metadata file names files inside its folder"
    )
    # the same from a metadata.csv (its data rows counted as records)
    meta.unlink()
    (folder / "metadata.csv").write_text(f"file_name,text\na.wav,hi\n{name},yo\n")
    with pytest.raises(ConfigError, match=r"metadata\.csv record 2: file_name .* outside"):
        load_records(str(folder))


def test_a_metadata_file_naming_a_fifo_or_a_link_out_is_refused(tmp_path):
    folder = tmp_path / "speech"
    (folder / "clips").mkdir(parents=True)
    _wav(tmp_path / "secret.wav", PCM)
    os.mkfifo(folder / "clips" / "a.wav")  # before: soundfile waited on it forever
    meta = _jsonl(folder / "metadata.jsonl", [{"file_name": "clips/a.wav", "text": "x"}])
    with pytest.raises(ConfigError) as err:
        load_records(str(folder))
    assert str(err.value) == (
        f"{meta} line 1: file_name 'clips/a.wav' is a named pipe (FIFO), not a regular file; a "
        "metadata file names files inside its folder"
    )
    (folder / "clips" / "a.wav").unlink()
    (folder / "clips" / "a.wav").symlink_to(tmp_path / "secret.wav")
    with pytest.raises(ConfigError, match=r"line 1: file_name 'clips/a\.wav' resolves to"):
        load_records(str(folder))
    (folder / "clips" / "a.wav").unlink()
    (folder / "clips" / "a.wav").symlink_to("../real.wav")  # a link inside: fine
    _wav(folder / "real.wav", PCM)
    assert load_records(str(folder))[0]["text"] == "x"
    _jsonl(meta, [{"file_name": 3, "text": "x"}])
    with pytest.raises(ConfigError, match=r"line 1: file_name is a number \(3\), not a string"):
        load_records(str(folder))


def test_a_hub_cache_dataset_snapshot_links_into_its_blobs(tmp_path):
    repo = tmp_path / "hub" / "datasets--me--speech"
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    _wav(repo / "blobs" / "h1", PCM)
    _jsonl(repo / "blobs" / "h2", [{"file_name": "a.wav", "transcription": "hello"}])
    (snap / "a.wav").symlink_to("../../blobs/h1")
    (snap / "metadata.jsonl").symlink_to("../../blobs/h2")
    assert load_records(str(snap))[0]["text"] == "hello"


@pytest.mark.parametrize(
    ("value", "said"),
    [(None, "null"), (5, "a number (5)"), (["x", "y"], "a list"), ({"a": 1}, "an object"),
     (True, "a boolean (true)")],
)  # fmt: skip
def test_a_prompt_that_is_not_a_string_is_refused(value, said, tmp_path):
    # before: the prompts 'None', '5', "['x', 'y']"
    data = _jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, {"prompt": value}])
    with pytest.raises(ConfigError) as err:
        load_records(str(data))
    assert str(err.value) == f"{data} line 2: prompt is {said}, not a string"
    (tmp_path / "p.json").write_text(json.dumps([{"prompt": "ok"}, {"prompt": value}]))
    with pytest.raises(ConfigError) as err:
        load_records(str(tmp_path / "p.json"))
    assert str(err.value) == f"{tmp_path / 'p.json'} record 2: prompt is {said}, not a string"


def test_prompts_and_transcripts_must_be_text_in_every_form(tmp_path):
    data = _jsonl(tmp_path / "p.jsonl", [{"text": "ok"}, {"prompt": "x"}])
    with pytest.raises(ConfigError, match=r"p\.jsonl line 1: prompt is missing, not a string"):
        load_records(str(data))
    datasets.Dataset.from_dict({"prompt": ["a", None]}).to_parquet(str(tmp_path / "p.parquet"))
    with pytest.raises(ConfigError, match=r"p\.parquet record 2: prompt is null, not a string"):
        load_records(str(tmp_path / "p.parquet"))
    # a .csv cell is text whatever datasets makes of it; an empty one is refused
    (tmp_path / "p.csv").write_text("prompt,n\n007,1\n,2\n")
    with pytest.raises(ConfigError, match=r"p\.csv record 2: prompt is empty$"):
        load_records(str(tmp_path / "p.csv"))
    assert _prompts(load_records(str(tmp_path / "p.csv"), 1)) == ["007"]
    # a transcript: a string (an empty .csv cell is an empty transcript)
    folder = tmp_path / "speech"
    folder.mkdir()
    _wav(folder / "a.wav", PCM)
    meta = _jsonl(folder / "metadata.jsonl", [{"file_name": "a.wav", "sentence": 5}])
    with pytest.raises(ConfigError) as err:
        load_records(str(folder))
    assert str(err.value) == f"{meta} line 1: transcript sentence is a number (5), not a string"
    meta.unlink()
    (folder / "metadata.csv").write_text("file_name,sentence\na.wav,\n")
    assert load_records(str(folder))[0]["text"] == ""
    # lines that are no JSON object, a split a .jsonl has not
    (tmp_path / "q.jsonl").write_text('{"prompt": "a"}\n[1]\n')
    with pytest.raises(ConfigError, match=r"q\.jsonl line 2 is a list, not a JSON object"):
        load_records(str(tmp_path / "q.jsonl"))
    (tmp_path / "q.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ConfigError, match=r"q\.jsonl line 2 is not valid JSON: Expecting"):
        load_records(str(tmp_path / "q.jsonl"))
    assert _prompts(load_records(str(tmp_path / "q.jsonl"), 1)) == ["a"]  # never read line 2
    with pytest.raises(ConfigError, match="has splits train; no split 'test'"):
        load_records(str(tmp_path / "q.jsonl"), 1, split="test")


def test_a_jsonl_is_read_only_up_to_the_limit_and_a_huge_record_refused(tmp_path):
    import tracemalloc

    data = tmp_path / "p.jsonl"
    with data.open("w") as f:
        f.write('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "')
        for _ in range(32):
            f.write("c" * 2**20)
    tracemalloc.start()
    try:
        assert _prompts(load_records(str(data), 2)) == ["a", "b"]
        assert tracemalloc.get_traced_memory()[1] < 2**20  # the 32 MiB line: never read
        with pytest.raises(ConfigError) as err:
            load_records(str(data), 3)
        assert tracemalloc.get_traced_memory()[1] < 4 * 2**20
    finally:
        tracemalloc.stop()
    assert str(err.value) == (
        f"{data} line 3 is longer than 1048576 bytes (1 MiB), the most one record may hold; "
        "split it or shorten it"
    )
    # a prompt past 1 MiB from a source datasets reads
    (tmp_path / "p.json").write_text(json.dumps([{"prompt": "d" * (2**20 + 1)}]))
    with pytest.raises(ConfigError, match=r"p\.json record 1: prompt is longer than 1048576"):
        load_records(str(tmp_path / "p.json"))


# ---- issue 58 case 6: a file a data file names is inside the directory holding it ----------


def _data_file(kind: str, path: Path, rows: list[dict]) -> Path:
    """``rows`` written as a ``kind`` (jsonl, json, csv, parquet) data file at ``path``."""
    file = path.with_suffix(f".{kind}")
    if kind == "jsonl":
        _jsonl(file, rows)
    elif kind == "json":
        file.write_text(json.dumps(rows))
    elif kind == "csv":
        names = list(rows[0])
        file.write_text(",".join(names) + "\n" + "".join(
            ",".join(str(r[n]) for n in names) + "\n" for r in rows))  # fmt: skip
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(file))
    return file


def _where(kind: str, file: Path, n: int) -> str:
    return f"{file} line {n}" if kind == "jsonl" else f"{file} record {n}"


KINDS = ["jsonl", "json", "csv", "parquet"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["ABS", "../outside/secret.wav", "link.wav"])
def test_a_data_file_naming_audio_out_of_its_directory_is_refused_before_decoding(
    kind, name, tmp_path, monkeypatch
):
    # before: read whatever the column named (/abs/private/secret.wav, ../, a link out)
    import opsnn_quant.models.hf_data as hf_data

    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "outside").mkdir()
    _wav(data / "a.wav", PCM)
    _wav(tmp_path / "outside" / "secret.wav", PCM)
    (data / "link.wav").symlink_to(tmp_path / "outside" / "secret.wav")
    name = str(tmp_path / "outside" / "secret.wav") if name == "ABS" else name
    file = _data_file(kind, data / "speech", [{"file_name": "a.wav", "text": "hi"},
                                              {"file_name": name, "text": "yo"}])  # fmt: skip
    decoded = []
    monkeypatch.setattr(hf_data, "read_mono", lambda *a, **k: decoded.append(a) or (PCM, 16000))
    with pytest.raises(ConfigError) as err:
        load_records(str(file))
    assert str(err.value) == (
        f"{_where(kind, file, 2)}: audio {name!r} resolves to {tmp_path}/outside/secret.wav, "
        f"outside {data}; a data file names audio files inside the directory holding it ({data})"
    )
    assert decoded == []  # checked before any audio is decoded


@pytest.mark.parametrize("kind", KINDS)
def test_a_relative_audio_name_is_read_from_the_data_file_s_directory(kind, tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "clips").mkdir(parents=True)
    _wav(data / "clips" / "a.wav", PCM)
    os.mkfifo(data / "clips" / "b.wav")
    file = _data_file(kind, data / "speech", [{"file_name": "clips/a.wav", "text": "hi"}])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # before: relative to the working directory
    records = load_records(str(file))
    assert [r["text"] for r in records] == ["hi"]
    assert np.array_equal(records[0]["audio"], PCM.astype(np.float32) / 32768.0)
    file = _data_file(kind, data / "speech", [{"file_name": "clips/b.wav", "text": "x"}])
    with pytest.raises(ConfigError, match=r"audio 'clips/b\.wav' is a named pipe \(FIFO\)"):
        load_records(str(file))


def test_a_parquet_audio_column_naming_a_file_out_of_its_directory(tmp_path):
    # the Audio feature (undecoded: a path, no bytes), as datasets writes it
    data = tmp_path / "data"
    data.mkdir()
    _wav(tmp_path / "secret.wav", PCM)
    _wav(data / "a.wav", PCM)
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = {"audio": {"decode": False, "_type": "Audio"},
                "text": {"dtype": "string", "_type": "Value"}}  # fmt: skip
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    for audio, ok in (("a.wav", True), (str(tmp_path / "secret.wav"), False)):
        table = pa.table({"audio": [{"bytes": None, "path": audio}], "text": ["x"]})
        pq.write_table(table.replace_schema_metadata(meta), data / "s.parquet")
        if ok:
            assert load_records(str(data / "s.parquet"))[0]["text"] == "x"
            continue
        with pytest.raises(ConfigError, match=r"s\.parquet record 1: audio .* outside"):
            load_records(str(data / "s.parquet"))


# ---- issue 58 case 7: read as far as needed, nothing written to the datasets cache ----------


def _peak(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


BIG = 4 * 2**20  # a 4 MiB cell: past the 1 MiB a record may hold


@pytest.mark.parametrize("kind", ["json", "csv"])
def test_a_text_file_is_read_only_up_to_the_limit(kind, tmp_path):
    # before: datasets.load_dataset read (and converted) the whole file before --limit
    file = tmp_path / f"p.{kind}"
    if kind == "json":
        file.write_text('[{"prompt": "a"}, {"prompt": "' + "b" * BIG + '"}, {oops')
    else:
        file.write_text('prompt\na\n"' + "b" * BIG + '"\nnot,valid,here\n')
    records, peak = _peak(lambda: load_records(str(file), 1))
    assert [r["prompt"] for r in records] == ["a"] and peak < 2**20  # the rest never read
    with pytest.raises(ConfigError) as err:
        _peak(lambda: load_records(str(file), 2))
    where = "record 2" if kind == "json" else "line 3"  # a .csv: the physical line first
    assert str(err.value) == (
        f"{file} {where} is longer than 1048576 bytes (1 MiB), the most one record may hold; "
        "split it or shorten it"
    )

    def whole() -> None:
        with pytest.raises(ConfigError):
            load_records(str(file))

    _, peak = _peak(whole)
    assert peak < 4 * 2**20  # refused once 1 MiB of it is read, never loaded whole


def test_a_json_array_streams_whatever_its_layout(tmp_path):
    file = tmp_path / "p.json"
    file.write_text('\ufeff [\n {"prompt": "a", "n": -Infinity},\n\t{"prompt":'
                    ' "c\\u00e9"} ,{"prompt": "d"}]\n')  # fmt: skip
    assert _prompts(load_records(str(file))) == ["a", "c\u00e9", "d"]
    file.write_text('["bare", "text"]')  # an array of strings: the text column, as datasets
    assert _prompts(load_records(str(file))) == ["bare", "text"]
    file.write_text('[{"prompt": "a"}, 5]')
    with pytest.raises(ConfigError, match=r"p\.json record 2 is a number \(5\), not a JSON"):
        load_records(str(file))
    file.write_text('[{"prompt": "a"} {"prompt": "b"}]')
    with pytest.raises(ConfigError, match=r"after record 1 it has '\{' where ',' or '\]'"):
        load_records(str(file))
    file.write_text('[{"prompt": "a"}, {"prompt": x}]')
    with pytest.raises(ConfigError, match=r"p\.json record 2 is not valid JSON: Expecting value"):
        load_records(str(file))
    file.write_text('[{"prompt": "a"}, {"prompt": "b"')
    with pytest.raises(ConfigError, match=r"record 2 is not valid JSON"):
        load_records(str(file))
    file.write_text("[" + ",".join(f'{{"prompt": "p{i}"}}' for i in range(5000)) + "]")
    assert _prompts(load_records(str(file)))[-1] == "p4999"  # past many chunks


def test_a_parquet_reads_only_the_row_groups_asked_for(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = tmp_path / "p.parquet"
    table = pa.table({"prompt": ["a", "b" * BIG], "other": ["x", "y"]})
    pq.write_table(table, file, row_group_size=1)
    meta = pq.ParquetFile(file).metadata
    second = meta.row_group(1).column(0)
    with file.open("r+b") as f:  # the second row group's pages: garbage now
        f.seek(second.data_page_offset)
        f.write(b"\xff" * 64)
    records, peak = _peak(lambda: load_records(str(file), 1))
    assert _prompts(records) == ["a"] and peak < 2**20  # before: the file was read whole
    pq.write_table(table, file, row_group_size=1)
    with pytest.raises(ConfigError) as err:
        load_records(str(file), 2)
    assert str(err.value).startswith(f"{file} records 2-2: column prompt holds ")
    assert str(err.value).endswith("more than 1048576 bytes (1 MiB) a record, the most one "
                                   "record may hold")  # fmt: skip


def test_nothing_is_written_to_the_datasets_cache(tmp_path, monkeypatch):
    # before: each .json/.csv/.parquet became an Arrow copy in ~/.cache/huggingface/datasets
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    data = tmp_path / "data"
    (data / "snap" / "data").mkdir(parents=True)
    for kind in KINDS:
        _data_file(kind, data / "p", [{"prompt": "a"}, {"prompt": "b"}])
        assert _prompts(load_records(str(data / f"p.{kind}"))) == ["a", "b"]
    datasets.Dataset.from_dict({"prompt": ["c", "d", "e"]}).to_parquet(
        str(data / "snap" / "data" / "train-00000-of-00001.parquet"))  # fmt: skip
    datasets.Dataset.from_dict({"prompt": ["t"]}).to_parquet(
        str(data / "snap" / "data" / "test-00000-of-00001.parquet"))  # fmt: skip
    assert _prompts(load_records(str(data / "snap"), 2)) == ["c", "d"]
    assert _prompts(load_records(str(data / "snap"), split="test")) == ["t"]
    assert not cache.exists() or list(cache.rglob("*")) == []


def test_an_audio_folder_decodes_only_the_records_used(tmp_path, monkeypatch):
    # before: every file of the folder was decoded whatever --limit said
    import opsnn_quant.models.data as data_mod
    import opsnn_quant.models.hf_data as hf_data

    for i in range(9):
        _wav(tmp_path / f"{i}.wav", PCM)
    os.mkfifo(tmp_path / "9.wav")  # past the limit: never looked at
    decoded = []
    real = data_mod._read_audio
    monkeypatch.setattr(data_mod, "_read_audio", lambda f: decoded.append(f.name) or real(f))
    assert [r["id"] for r in load_records(str(tmp_path), 2)] == ["0.wav", "1.wav"]
    assert decoded == ["0.wav", "1.wav"]
    # the same from a metadata file and from a data file's audio column
    (tmp_path / "9.wav").unlink()
    _wav(tmp_path / "9.wav", PCM)
    rows = [{"file_name": f"{i}.wav", "text": str(i)} for i in range(9)] + [{"file_name": 5}]
    calls = []
    real_mono = hf_data.read_mono
    monkeypatch.setattr(hf_data, "read_mono", lambda *a: calls.append(a) or real_mono(*a))
    _data_file("csv", tmp_path / "speech", rows[:9])
    assert [r["text"] for r in load_records(str(tmp_path / "speech.csv"), 2)] == ["0", "1"]
    _jsonl(tmp_path / "metadata.jsonl", rows)
    assert [r["text"] for r in load_records(str(tmp_path), 2)] == ["0", "1"]
    assert len(calls) == 4


def test_a_csv_is_read_record_by_record_as_pandas_reads_its_cells(tmp_path):
    file = tmp_path / "p.csv"
    file.write_text(',prompt,n\n0,"two\nlines, one cell",1\n\n1,"say ""hi""",\n2,,3\n')
    assert _prompts(load_records(str(file), 2)) == ["two\nlines, one cell", 'say "hi"']
    with pytest.raises(ConfigError, match=r"p\.csv record 3: prompt is empty$"):
        load_records(str(file))
    assert load_records(str(file), 1, column="Unnamed: 0") == [{"prompt": "0"}]  # pandas' name
    file.write_text("prompt,prompt\na,b\n")
    with pytest.raises(ConfigError, match=r"header names column 'prompt' twice; rename one"):
        load_records(str(file))
    file.write_text("prompt\na\nb,c\n")
    with pytest.raises(ConfigError, match=r"record 2 has 2 cells, its header names 1 columns"):
        load_records(str(file))
    with file.open("w") as f:  # one quoted cell over many lines, each under the line cap
        f.write('prompt\n"' + ("x" * 2**19 + "\n") * 4 + '"\n')
    with pytest.raises(ConfigError, match=r"p\.csv record 1 is longer than 1048576 bytes"):
        load_records(str(file))
