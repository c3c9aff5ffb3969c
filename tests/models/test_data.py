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


# ---- issue 41: files named by a data folder, prompts files read as far as asked ------------


def _big_line(path: Path, head: str, size: int = 32 * 2**20) -> None:
    """``head`` then one line of ``size`` bytes (no newline), written in pieces."""
    with path.open("w") as f:
        f.write(head)
        for _ in range(size // 2**20):
            f.write("a" * 2**20)


def _peak(fn):
    """``fn()``'s result and the peak of Python allocations while it ran."""
    import tracemalloc

    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_txt_of_prompts_is_read_only_up_to_the_limit(tmp_path):
    # before: the whole file was read (a 1 GiB one-line file: the OOM killer)
    data = tmp_path / "p.txt"
    _big_line(data, "\ufeffa red circle\r\n\n  a blue square \rthird\n")
    records, peak = _peak(lambda: load_records(str(data), 3))
    assert [r["prompt"] for r in records] == ["a red circle", "a blue square", "third"]
    assert peak < 2**20  # the 32 MiB line after them was never read
    # asked for more: the huge line is refused once 1 MiB of it is read
    with pytest.raises(ConfigError) as err:
        _peak(lambda: load_records(str(data), 4))
    assert str(err.value) == (
        f"{data} line 4 is longer than 1048576 bytes (1 MiB), the most one record may hold; "
        "split it or shorten it"
    )

    def whole() -> str:
        with pytest.raises(ConfigError) as err:
            load_records(str(data))
        return str(err.value)

    said, peak = _peak(whole)
    assert "line 4 is longer than" in said and peak < 4 * 2**20
    # not UTF-8: the byte is named, as before
    (tmp_path / "q.txt").write_bytes(b"ok\ncaf\xe9\n")
    with pytest.raises(ConfigError, match=r"q\.txt is not UTF-8 text \(byte 6: invalid"):
        load_records(str(tmp_path / "q.txt"))


def test_an_audio_folder_reads_only_regular_files_inside_it(tmp_path):
    import os

    folder = tmp_path / "wavs"
    folder.mkdir()
    _wav(folder / "a.wav", PCM)
    _wav(tmp_path / "secret.wav", PCM)
    (folder / "b.wav").symlink_to("a.wav")  # a link inside: read as the file it names
    assert [r["id"] for r in load_records(str(folder))] == ["a.wav", "b.wav"]
    (folder / "c.wav").symlink_to(tmp_path / "secret.wav")
    with pytest.raises(ConfigError) as err:
        load_records(str(folder))
    assert str(err.value) == (
        f"{folder}/c.wav resolves to {tmp_path}/secret.wav, outside {folder}; an audio "
        "folder's files must be regular files inside it"
    )
    (folder / "c.wav").unlink()
    os.mkfifo(folder / "c.wav")  # before: skipped; a FIFO named .flac blocked soundfile
    with pytest.raises(ConfigError, match=r"c\.wav is a named pipe \(FIFO\), not a regular file"):
        load_records(str(folder))
    (folder / "c.wav").unlink()
    os.mkfifo(folder / "transcripts.tsv")  # before: read_text waited on it forever
    with pytest.raises(ConfigError, match=r"transcripts\.tsv is a named pipe \(FIFO\)"):
        load_records(str(folder))
    (folder / "transcripts.tsv").unlink()
    (folder / "transcripts.tsv").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match=r"transcripts\.tsv resolves to /etc/passwd, outside"):
        load_records(str(folder))


def test_compressed_audio_is_read_and_a_wrong_rate_names_the_file(tmp_path):
    # .mp3, Ogg Opus and Ogg Vorbis, decoded by libsndfile: the same 440 Hz tone comes back
    # (lossy: compared by correlation), each with its transcript
    from opsnn_quant.errors import CalibrationError
    from opsnn_quant.models.data import audio_from

    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    soundfile.write(tmp_path / "a.mp3", tone, 16000, format="MP3")
    soundfile.write(tmp_path / "b.opus", tone, 16000, format="OGG", subtype="OPUS")
    soundfile.write(tmp_path / "c.ogg", tone, 16000, format="OGG", subtype="VORBIS")
    (tmp_path / "transcripts.tsv").write_text("a\tone\nb.opus\ttwo\nc\tthree\n")
    records = load_records(str(tmp_path))
    assert [(r["id"], r["text"], r["sampling_rate"]) for r in records] == [
        ("a.mp3", "one", 16000),
        ("b.opus", "two", 16000),
        ("c.ogg", "three", 16000),
    ]
    for r in records:
        audio = r["audio"]
        n = min(len(audio), len(tone)) - 2000  # codec delay and padding at the ends
        lag = int(np.argmax(np.correlate(audio[:4000], tone[:2000], "valid")))
        corr = np.corrcoef(audio[lag : lag + n], tone[:n])[0, 1]
        assert corr > 0.95, (r["id"], corr)
    _wav(tmp_path / "d.wav", np.zeros(2205, dtype="<i2"), rate=22050)
    with pytest.raises(CalibrationError) as info:
        audio_from(load_records(str(tmp_path)))
    assert str(info.value) == (
        "d.wav (sample 3) is sampled at 22050 Hz; the model needs 16000 Hz "
        "(e.g. ffmpeg -i FILE -ac 1 -ar 16000 OUT.wav)"
    )
