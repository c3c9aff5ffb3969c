"""WER/CER and agreement WER against hand-counted edits."""

from __future__ import annotations

import math

import pytest

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.wer import agreement_wer, error_rates, utterance_rows


def test_hand_computed_corpus_rates():
    refs = ["The cat sat on the mat.", "Hello, world!"]
    hyps = ["the bat sat on mat", "hello world"]
    # Normalised: "the cat sat on the mat" / "hello world" (8 words, 22 + 11 = 33 chars).
    # Utterance 1: cat->bat (S), "the" deleted (D): 2 word edits; chars: c->b, "the " deleted: 5.
    r = error_rates(refs, hyps)
    assert (r.word_errors, r.ref_words) == (2, 8)
    assert r.wer == pytest.approx(2 / 8)
    assert (r.char_errors, r.ref_chars) == (5, 33)
    assert r.cer == pytest.approx(5 / 33, rel=1e-6)


def test_normalisation_is_whisper_english():
    # Case, punctuation, contractions and number formatting are not errors after normalisation.
    r = error_rates(["I won't pay ten dollars."], ["i will not pay $10"])
    assert r.wer == 0.0
    raw = error_rates(["I won't pay ten dollars."], ["i will not pay $10"], normalize=False)
    # Raw: 5 reference words, each position differs ("I"/"i", "won't"/"will", ...): 5 / 5.
    assert raw.wer == pytest.approx(5 / 5)


def test_rows_worst_first_and_diff():
    refs = ["cats and dogs play", "alpha beta gamma", "red green blue"]
    base = ["cats and dogs play", "alpha beta gamma", "red green blue"]
    cand = ["cats and dogs play", "alpha delta", "red green blue extra"]
    rows = utterance_rows(refs, base, cand)
    assert [r.index for r in rows] == [1, 2, 0]
    worst = rows[0]
    # beta->delta (S) and gamma deleted (D): 2 extra errors vs the error-free baseline.
    assert (worst.baseline_errors, worst.candidate_errors, worst.agreement_errors) == (0, 2, 2)
    ops = [(c.op, c.ref, c.hyp) for c in worst.diff]
    assert ("equal", "alpha", "alpha") in ops
    edited = [o for o in ops if o[0] != "equal"]
    assert sum(len(o[1].split()) for o in edited) == 2  # beta, gamma changed
    assert rows[1].extra_errors == 1 and rows[1].diff[-1].op == "insert"
    assert rows[2].extra_errors == 0
    assert [(c.op, c.ref) for c in rows[2].diff] == [("equal", "cats and dogs play")]


def test_agreement_wer():
    # Baseline words: 3 + 2 = 5; edits: "b"->"x" and "d" inserted (2), then 0: 2/5.
    assert agreement_wer(["a b c", "e f"], ["a x c d", "e f"]) == pytest.approx(2 / 5)
    assert agreement_wer(["", ""], ["", ""]) == 0.0
    assert math.isinf(agreement_wer([""], ["something"]))


def test_errors():
    with pytest.raises(InputError, match="2 references but 1"):
        error_rates(["a", "b"], ["a"])
    with pytest.raises(InputError, match="at least one"):
        error_rates([], [])
    with pytest.raises(InputError, match="no words"):
        error_rates(["", "  "], ["a", "b"])


def test_corpus_wer_counts_hand_edits_and_refuses_bad_lists():
    # (moved from the zoo's tests with text_norm.word_error_rate: one WER implementation now)
    refs = ["the cat is sleeping", "turn left"]
    assert error_rates(refs, ["The cat is sleeping.", "Turn left!"]).wer == 0.0
    # one substitution + one deletion over six reference words
    assert error_rates(refs, ["the bat is sleeping", "turn"]).wer == pytest.approx(2 / 6)
    assert error_rates(["the cat"], ["The cat."], normalize=False).wer == 1.0
    with pytest.raises(InputError):
        error_rates(refs, ["one"])
    with pytest.raises(InputError, match="no words"):
        error_rates(["uh"], ["x"])


def test_chinese_is_counted_in_characters():
    from opsnn_quant.evaluation.text_norm import normalizer_for
    from opsnn_quant.evaluation.wer import agreement_cer

    zh = normalizer_for("zh")
    refs, base, cand = ["今天天气很好。"], ["今天天气很好"], ["今天天汽很好吗"]
    # 6 reference characters; the candidate: one substitution (气->汽), one insertion (吗)
    r = error_rates(refs, cand, zh)
    assert (r.char_errors, r.ref_chars) == (2, 6)
    assert agreement_cer(base, cand, zh) == pytest.approx(2 / 6)
    (row,) = utterance_rows(refs, base, cand, zh)
    assert (row.ref_words, row.baseline_errors, row.candidate_errors, row.agreement_errors) == (
        6,
        0,
        2,
        2,
    )
    assert [(c.op, c.ref, c.hyp) for c in row.diff if c.op != "equal"] == [
        ("substitute", "气", "汽"),
        ("insert", "", "吗"),
    ]


def test_repetition_flags_loops_and_made_up_words():
    from opsnn_quant.evaluation.wer import repetition

    # the case: float Whisper looping on one 5-word clip ("aligner" 39 times)
    loop = "the " + "aligner " * 39 + "is here"
    assert repetition(loop, "the aligner is here today") == "'aligner' x39"
    assert repetition("a b c a b c a b c a b c", "a b c") == "'a b c' x4"
    assert repetition("a b a b a b", "a b a b a b") is None  # three times: a sentence may
    assert repetition("one two three four five six seven", "one two three") == (
        "7 words for a reference of 3 (made up)"
    )
    assert repetition("兔子兔子兔子兔子", "我们去公园", words=False) == "'兔子' x4"
    assert repetition("the cat sat on the mat", "the cat sat on the mat") is None


def test_the_report_shows_changes_both_ways_and_what_drives_the_delta():
    from opsnn_quant.evaluation.wer import both_ways, drivers

    refs = [f"word{i} a b c" for i in range(10)]
    base = list(refs)
    cand = list(refs)
    base[3] = "the " + "aligner " * 8  # float loops; the candidate gets it right
    cand[5] = "word5 x y c"  # two more errors
    cand[7] = "word7 a b"  # one more (a deletion)
    rows = utterance_rows(refs, base, cand)
    assert [r.index for r in rows[:2]] == [5, 7] and rows[-1].index == 3
    assert rows[-1].baseline_repeats == "'aligner' x8" and rows[-1].extra_errors < 0
    shown = both_ways(rows, max_rows=3)  # the two losses and the one gain, in worst-first order
    assert [r.index for r in shown] == [5, 7, 3]
    notes = drivers(rows)
    assert notes[0] == (
        "the candidate makes more errors on 2 utterances (3 words in all); the largest: "
        "#5 (+2), #7 (+1) = 100% of them"
    )
    assert notes[1].startswith("the candidate makes fewer errors on 1 utterances (")
    # 4 reference words against 9: 4 substitutions and 5 insertions
    assert notes[2] == (
        "the float model repeats or makes up words on 1 utterances (9 of its errors): "
        "#3 'aligner' x8"
    )


def test_a_transcript_of_one_unit_repeated_is_a_loop_and_one_containing_a_loop_is_not():
    from opsnn_quant.evaluation.wer import one_unit_loop

    # a random Whisper's transcripts: one word, or one character, until the length limit
    assert one_unit_loop("bang bang bang bang bang bang bang bang") == "'bang' x8"
    assert one_unit_loop("mmmmmmmmmmmmmmmm") == "'m' x16"
    assert one_unit_loop("thank you thank you thank you thank you") == "'thank you' x4"
    assert one_unit_loop("haha haha") == "'ha' x4"  # characters, spaces left out
    # below LOOP_REPEATS, a loop inside real words, an empty text: not "nothing but a loop"
    assert one_unit_loop("bang bang bang") is None
    assert one_unit_loop("the the the the truck is parked") is None
    assert one_unit_loop("") is None
    # without word boundaries the characters count (a Chinese transcript)
    assert one_unit_loop("啊啊啊啊啊", words=False) == "'啊' x5"
    assert one_unit_loop("我们在这里", words=False) is None
    # a token without a leading space, decoded eight times: one "word"
    assert one_unit_loop("virtualvirtualvirtualvirtualvirtualvirtualvirtualvirtual") == (
        "'virtual' x8"
    )
    assert one_unit_loop("virtualvirtualvirtual") is None  # three times


def test_edit_counts_are_torchmetrics_counts():
    # torchmetrics' own WER/CER update (functional/text/wer.py _wer_update, cer.py _cer_update:
    # Levenshtein over str.split() words / over characters, total = the reference's length) is
    # the independent expectation for the RapidFuzz counts, on random texts with repeats,
    # empty strings and runs of spaces.
    import random

    from torchmetrics.functional.text.cer import _cer_update
    from torchmetrics.functional.text.wer import _wer_update

    from opsnn_quant.evaluation.wer import edit_counts

    rng = random.Random(0)
    vocab = ["a", "b", "ab", "ba", "the", "cat", ""]

    def text() -> str:
        return "  ".join(rng.choice(vocab) for _ in range(rng.randrange(0, 9)))

    refs = [text() for _ in range(300)]
    hyps = [text() for _ in range(300)]
    for words, update in ((True, _wer_update), (False, _cer_update)):
        edits, lengths = edit_counts(refs, hyps, words=words)
        for r, h, e, n in zip(refs, hyps, edits, lengths, strict=True):
            errors, total = update([h], [r])
            assert (e, n) == (int(errors), int(total)), (words, r, h)
    # hand-counted: "kitten" -> "sitting" is 3 character edits; 2 words -> 1 word is 1 deletion
    assert edit_counts(["kitten"], ["sitting"], words=False) == ([3], [6])
    assert edit_counts(["two words"], ["two"]) == ([1], [2])


def test_rates_round_as_torchmetrics_compute():
    # torchmetrics' compute divides float32 sums: 1 / 3 is float32's 0.3333333432674408, which
    # reports printed before; the figure keeps its bytes.
    r = error_rates(["a b c"], ["a b x"])
    assert r.wer == 0.3333333432674408 and r.word_errors == 1 and r.ref_words == 3
