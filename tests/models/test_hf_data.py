"""Data through Hugging Face ``datasets``: each source form, the column and split choices, and
audio decoded with soundfile (no torchcodec)."""

from __future__ import annotations

import json
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
