"""Synthetic Mandarin speech for the multilingual Whisper demo (``zoo:speech-zh/<split>``).

Sentences are drawn from templates (who, when, where, what) and a few fixed sentences, and
spoken by espeak-ng's Mandarin voice ``cmn-latn-pinyin``: espeak-ng turns the characters into
tonal pinyin and speaks it. (Its plain ``cmn`` voice reads that pinyin back as English on
espeak-ng 1.51: "jin1" as "gin one"; Whisper then hears English and digits.) The voice is
robotic and monotonous next to real speech: Whisper base transcribes it with a high character
error rate (most errors are homophones, the tones being flat), which is still a fixed float
baseline to measure a quantized candidate against; the acceptance suite judges how far the
candidate moves from it (CER delta and agreement CER), not the absolute rate.

Splits, each generated on the fly from its own random stream (``seed``): ``calibration`` (32),
``train`` (128: what a measured search's slice reads) and ``eval`` (64: the acceptance suite's);
no ``calibration`` or ``train`` sentence is an ``eval`` sentence. Records: ``audio`` (float32,
16 kHz), ``sampling_rate``, ``text``, ``voice``, ``speed``. The audio depends on the installed
espeak-ng (its version is not pinned here), the sentences do not.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np

from opsnn_quant.errors import ConfigError
from opsnn_quant.zoo.speech_data import (
    SAMPLING_RATE,
    Utterance,
    _require_espeak,
    synthesize_all,
    to_dataset,
)

VOICE = "cmn-latn-pinyin"
# words per minute: below 120 Whisper base's CER on 16 eval utterances fell from 1.04 to 0.62
SPEEDS = (100, 110)
SIZES = {"calibration": 32, "train": 128, "eval": 64}
SPLITS = tuple(SIZES)

_WHO = ("我", "我们", "他", "她", "老师", "我的朋友", "妈妈", "爸爸", "同学们", "王经理", "小李")
_WHEN = ("今天", "明天", "昨天", "下午", "晚上", "周末", "早上", "下个星期", "每天")
_WHERE = ("北京", "上海", "公园", "学校", "图书馆", "超市", "公司", "医院", "火车站", "饭馆")
_DO = ("看书", "开会", "工作", "吃饭", "买东西", "学习中文", "打电话", "写报告", "休息", "见朋友")
_HOW = ("很好", "不错", "很冷", "很热", "有点忙", "特别安静", "非常方便")
_TEMPLATES = (
    "{who}{when}去{where}{do}。",
    "{when}{who}要在{where}{do}。",
    "{who}想{when}去{where}。",
    "{where}今天{how}，{who}在那里{do}。",
    "{when}的天气{how}，{who}不想{do}。",
    "请问{where}怎么走？",
    "{who}觉得{where}{how}。",
)
_FIXED = (
    "今天天气很好，我们一起去公园散步吧。",
    "请把窗户打开。",
    "这个问题我们明天再讨论。",
    "火车马上就要开了。",
    "我每天早上六点起床。",
    "你好，很高兴认识你。",
    "这本书非常有意思。",
    "我们下午三点在公司见面。",
)
_FIXED_FRACTION = 0.15


def sentence(rng: random.Random) -> str:
    """One sentence: a filled template, or (now and then) a fixed one."""
    if rng.random() < _FIXED_FRACTION:
        return rng.choice(_FIXED)
    template = rng.choice(_TEMPLATES)
    words = {"who": _WHO, "when": _WHEN, "where": _WHERE, "do": _DO, "how": _HOW}
    return template.format(**{k: rng.choice(v) for k, v in words.items()})


def _draw(split: str, n: int, seed: int, banned: frozenset[str]) -> list[Utterance]:
    rng = random.Random(f"opsnn-speech-zh/{split}/{seed}")
    seen: set[str] = set()
    out: list[Utterance] = []
    for _ in range(100 * n + 1000):  # the templates make thousands of sentences
        if len(out) == n:
            break
        text = sentence(rng)
        if text in seen or text in banned:
            continue
        seen.add(text)
        out.append(Utterance(text, VOICE, rng.choice(SPEEDS)))
    return out


@functools.cache
def _eval_texts(seed: int) -> frozenset[str]:
    return frozenset(u.text for u in _draw("eval", SIZES["eval"], seed, frozenset()))


def utterance_list(split: str, n: int | None = None, seed: int = 0) -> list[Utterance]:
    """The first ``n`` utterances of ``split`` (all of them: None), the same in every process;
    a shorter list is a prefix of a longer one.

    Raises:
        ConfigError: an unknown split, or ``n`` beyond the split's size or negative.
    """
    if split not in SIZES:
        raise ConfigError(f"unknown speech-zh split {split!r}; known: {', '.join(SPLITS)}")
    size = SIZES[split]
    n = size if n is None else n
    if not 0 <= n <= size:
        raise ConfigError(f"speech-zh {split} has {size} utterances; asked for {n}")
    banned = frozenset() if split == "eval" else _eval_texts(seed)
    return _draw(split, size, seed, banned)[:n]


def split_records(split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """A split as records (see the module docstring), synthesized with espeak-ng.

    Raises:
        ConfigError: an unknown split.
        MissingDependencyError: espeak-ng is not installed.
    """
    size = SIZES.get(split)
    utts = utterance_list(split, None if limit is None or size is None else min(limit, size), seed)
    _require_espeak()
    audios = synthesize_all(utts)
    return [
        {"audio": np.asarray(a, dtype=np.float32), "sampling_rate": SAMPLING_RATE,
         "text": u.text, "voice": u.voice, "speed": u.speed}
        for u, a in zip(utts, audios, strict=True)
    ]  # fmt: skip


def load_split(split: str, limit: int | None = None, seed: int = 0) -> Any:
    """A split as a ``datasets.Dataset`` (the rows of :func:`split_records`)."""
    rows = split_records(split, limit, seed)
    utts = [Utterance(r["text"], r["voice"], r["speed"]) for r in rows]
    return to_dataset(utts, [r["audio"] for r in rows])
