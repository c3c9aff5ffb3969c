"""Whisper's English text normalisation and word error rate.

WER figures for Whisper are quoted after OpenAI's ``EnglishTextNormalizer`` (lower case, no
punctuation, contractions expanded, numbers as digits, British spellings mapped to American),
so that formatting choices of the model are not counted as recognition errors. transformers
ships the normalizer class (``transformers.models.whisper.english_normalizer``) but not its
British->American spelling table, which the Hub keeps in each tokenizer's ``normalizer.json``.
The same table (OpenAI's ``english.json``, MIT) is read here from the ``whisper-normalizer``
package's data, so normalisation works offline and identically everywhere.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from importlib import resources

from opsnn_quant.errors import InputError, MissingDependencyError

_SPELLING_PACKAGE = "whisper_normalizer"
_SPELLING_FILE = ("normalizers", "english.json")
INSTALL_HINT = "pip install 'opsnn-quant[eval]'"


@functools.cache
def english_spelling_mapping() -> dict[str, str]:
    """OpenAI Whisper's British -> American spelling table (about 1,700 words).

    Raises:
        MissingDependencyError: ``whisper-normalizer`` (which ships the table) is not installed.
    """
    try:
        path = resources.files(_SPELLING_PACKAGE).joinpath(*_SPELLING_FILE)
        text = path.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise MissingDependencyError(
            f"English WER normalisation needs the whisper-normalizer spelling table: {INSTALL_HINT}"
        ) from err
    mapping = json.loads(text)
    if not isinstance(mapping, dict) or not mapping:
        raise MissingDependencyError(
            f"{path} is not a spelling table; reinstall whisper-normalizer"
        )
    return {str(k): str(v) for k, v in mapping.items()}


@functools.cache
def _normalizer() -> Callable[[str], str]:
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer(english_spelling_mapping())


def normalize_english(text: str) -> str:
    """Normalise an English transcript the way Whisper's evaluations do.

    Example: ``"Mr. Smith won't pay £10."`` -> ``"mister smith will not pay £10"``.
    """
    return _normalizer()(text).strip()


def word_error_rate(
    references: Sequence[str], hypotheses: Sequence[str], normalize: bool = True
) -> float:
    """Corpus-level word error rate: total edits / total reference words.

    Args:
        references: Ground-truth transcripts.
        hypotheses: Model transcripts, same length and order.
        normalize: Apply :func:`normalize_english` to both sides first (the usual Whisper
            figure); ``False`` gives the raw WER on whitespace-split words.

    Raises:
        InputError: The lists differ in length, are empty, or a reference has no words left.
    """
    import jiwer

    if len(references) != len(hypotheses):
        raise InputError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if not references:
        raise InputError("word_error_rate needs at least one reference")
    prep = normalize_english if normalize else (lambda s: " ".join(s.split()))
    refs = [prep(r) for r in references]
    hyps = [prep(h) for h in hypotheses]
    empty = [i for i, r in enumerate(refs) if not r]
    if empty:
        raise InputError(f"references {empty[:5]} have no words after normalisation")
    return float(jiwer.wer(refs, hyps))
