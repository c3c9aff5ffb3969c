"""Transcript normalisation before an error rate is counted, per language (:func:`normalizer_for`).

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
from dataclasses import dataclass, field
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


# Languages written without spaces between words: a word error rate counts whole sentences
# there, so they are judged by characters (openai/whisper's evaluations report CER for Chinese,
# Japanese, Thai, Lao, Burmese; Cantonese and Tibetan, Khmer likewise have no word spaces).
NO_WORD_BOUNDARIES = frozenset({"zh", "yue", "ja", "th", "lo", "my", "km", "bo"})


@functools.cache
def _basic() -> Callable[[str], str]:
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer

    return BasicTextNormalizer()


@dataclass(frozen=True)
class TextNorm:
    """How a language's transcripts are normalised before their errors are counted.

    Attributes:
        name: what the report says it did.
        words: the language separates words with spaces (a word error rate means something);
            False: every space is dropped after normalising, and rates count characters.
        apply: the normaliser of one transcript.
    """

    name: str
    words: bool
    apply: Callable[[str], str] = field(repr=False, compare=False)

    def __call__(self, text: str) -> str:
        """``text`` normalised (spaces dropped where the language has no word boundaries)."""
        out = self.apply(text).strip()
        return out if self.words else "".join(out.split())


ENGLISH = TextNorm("Whisper English normalisation", True, normalize_english)
RAW = TextNorm("raw text (whitespace collapsed)", True, lambda t: " ".join(t.split()))


def normalizer_for(language: str | None) -> TextNorm:
    """The normaliser of ``language`` (a Whisper code): English's for ``en`` and None (the
    English-only models), Whisper's basic normaliser (lower case, no punctuation, symbols or
    bracketed text) for any other, its spaces dropped for a language without word boundaries
    (:data:`NO_WORD_BOUNDARIES`). No script conversion (traditional to simplified Chinese, for
    one): a transcript in the other script counts as errors."""
    if language in (None, "en"):
        return ENGLISH
    words = language not in NO_WORD_BOUNDARIES
    how = "" if words else ", spaces dropped (no word boundaries: judged by characters)"
    if language == "zh":  # Whisper writes Mandarin in either script: both counted as simplified
        how = ", traditional characters as simplified (OpenCC t2s)" + how
        return TextNorm(f"Whisper basic normalisation (zh){how}", words, _simplified)
    return TextNorm(f"Whisper basic normalisation ({language}){how}", words, lambda t: _basic()(t))


@functools.cache
def _t2s() -> Callable[[str], str]:
    try:
        import opencc
    except ImportError as err:
        raise MissingDependencyError(
            f"Chinese transcripts are compared in simplified characters with OpenCC: {INSTALL_HINT}"
        ) from err
    convert: Callable[[str], str] = opencc.OpenCC("t2s").convert
    return convert


def _simplified(text: str) -> str:
    """Whisper's basic normalisation, then traditional characters written as simplified ones."""
    return _t2s()(_basic()(text))


# What a caller asks for: True (English), False (raw) or a language's normaliser.
Normalize = bool | TextNorm


def as_norm(normalize: Normalize) -> TextNorm:
    """``normalize`` as a :class:`TextNorm` (True: English, False: raw)."""
    if isinstance(normalize, TextNorm):
        return normalize
    return ENGLISH if normalize else RAW
