"""The generated Mandarin speech of the zoo (zoo:speech-zh)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from opsnn_quant import zoo
from opsnn_quant.errors import ConfigError
from opsnn_quant.zoo import speech_zh as zh


def test_splits_are_fixed_prefix_stable_and_apart():
    for split, size in zh.SIZES.items():
        full = zh.utterance_list(split)
        assert len(full) == size == len({u.text for u in full})
        assert zh.utterance_list(split, 5) == full[:5] == zh.utterance_list(split, 5)
        assert {u.voice for u in full} == {"cmn-latn-pinyin"}
        assert all(u.speed in zh.SPEEDS and u.text[-1] in "。？" for u in full)
    judged = {u.text for u in zh.utterance_list("eval")}
    assert not judged & {u.text for u in zh.utterance_list("calibration")}
    assert not judged & {u.text for u in zh.utterance_list("train")}
    assert zh.utterance_list("eval", seed=1) != zh.utterance_list("eval")
    with pytest.raises(ConfigError, match="unknown speech-zh split 'test'; known: calibration"):
        zh.utterance_list("test")
    with pytest.raises(ConfigError, match="speech-zh eval has 64 utterances; asked for 65"):
        zh.utterance_list("eval", 65)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_records_are_spoken_mandarin_at_16_khz():
    rows = zoo.records("speech-zh", "calibration", limit=2)
    assert [r["text"] for r in rows] == [u.text for u in zh.utterance_list("calibration", 2)]
    for r in rows:
        audio = r["audio"]
        assert r["sampling_rate"] == 16000 and audio.dtype == np.float32
        # about 0.35-0.6 s a syllable at 100-110 wpm: more than a second of sound, not silence
        assert len(audio) > 16000 and float(np.abs(audio).max()) > 0.05
