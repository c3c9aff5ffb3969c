"""Data sources (opsnn_quant.models.data): audio folders of .wav and .flac with either
transcript file name."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile

from opsnn_quant.errors import ConfigError
from opsnn_quant.models.data import load_records

PCM = np.array([0, 16384, -32768, 32767, -1], dtype="<i2")


def _wav(path: Path, pcm: np.ndarray, rate: int = 16000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def test_an_audio_folder_reads_wav_and_flac_with_a_tsv_of_names_or_stems(tmp_path):
    _wav(tmp_path / "a.wav", PCM)
    soundfile.write(str(tmp_path / "b.flac"), PCM[::-1].copy(), 16000, subtype="PCM_16")
    (tmp_path / "notes.md").write_text("not audio\n")
    # LibriSpeech-style ids (the stem) and file names both key a transcript
    (tmp_path / "transcripts.tsv").write_text("a.wav\thello there\nb\tgood morning\n")
    records = load_records(str(tmp_path))
    assert [r["id"] for r in records] == ["a.wav", "b.flac"]  # sorted by file name
    assert [r["text"] for r in records] == ["hello there", "good morning"]
    # 16-bit samples / 32768 exactly, from either container
    assert np.array_equal(records[0]["audio"], PCM.astype(np.float32) / 32768.0)
    assert np.array_equal(records[1]["audio"], PCM[::-1].astype(np.float32) / 32768.0)
    assert {r["sampling_rate"] for r in records} == {16000}


def test_transcripts_txt_still_works_and_both_files_are_ambiguous(tmp_path):
    _wav(tmp_path / "a.wav", PCM)
    (tmp_path / "transcripts.txt").write_text("a.wav\tone\n")
    assert load_records(str(tmp_path))[0]["text"] == "one"
    (tmp_path / "transcripts.tsv").write_text("a.wav\ttwo\n")
    with pytest.raises(ConfigError, match=r"both transcripts\.tsv and transcripts\.txt"):
        load_records(str(tmp_path))


def test_a_stereo_or_corrupt_flac_is_one_clear_error(tmp_path):
    soundfile.write(str(tmp_path / "s.flac"), np.zeros((8, 2), np.int16), 16000)
    with pytest.raises(ConfigError, match=r"s\.flac: only mono audio is supported"):
        load_records(str(tmp_path))
    (tmp_path / "s.flac").write_bytes(b"fLaC but not really")
    with pytest.raises(ConfigError, match=r"s\.flac is not a readable \.flac file"):
        load_records(str(tmp_path))
