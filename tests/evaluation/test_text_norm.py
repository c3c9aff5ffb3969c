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
