"""Transcript normalisation before an error rate is counted (Whisper's English normaliser).

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
from collections.abc import Callable
from importlib import resources

from opsnn_quant.errors import MissingDependencyError

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
