"""Whisper's English normaliser (OpenAI's rules, the spelling table from whisper-normalizer)."""

from __future__ import annotations

from opsnn_quant.evaluation.text_norm import english_spelling_mapping, normalize_english


def test_normalize_english() -> None:
    assert normalize_english("Mr. Smith won't pay £10.") == "mister smith will not pay £10"
    assert normalize_english("The colour is grey!") == "the color is gray"  # spelling table
    assert normalize_english("I would like four cups.") == "i would like 4 cups"


def test_the_spelling_table_is_openais() -> None:
    table = english_spelling_mapping()
    assert len(table) > 1500 and table["colour"] == "color" and table["grey"] == "gray"


def test_each_language_has_its_normaliser():
    from opsnn_quant.evaluation.text_norm import ENGLISH, normalizer_for

    assert normalizer_for(None) is ENGLISH and normalizer_for("en") is ENGLISH
    zh = normalizer_for("zh")
    # Whisper's basic normaliser: punctuation (，。！) becomes spaces, [bracketed] text goes;
    # then no word boundaries: every space dropped, so errors count characters
    assert zh("你好，世界！ [笑声] 今天 天气 很好。") == "你好世界今天天气很好"
    assert zh("我們的會議") == zh("我们的会议") == "我们的会议"  # either script, as simplified
    assert not zh.words
    de = normalizer_for("de")
    assert de("Guten Tag, Welt!") == "guten tag welt" and de.words
