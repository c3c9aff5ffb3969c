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
