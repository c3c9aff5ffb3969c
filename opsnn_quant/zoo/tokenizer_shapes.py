"""A CLIP BPE tokenizer generated locally from the shapes caption vocabulary.

The vocabulary follows CLIP's layout: the 256 byte-level symbols, the same symbols with the
``</w>`` end-of-word suffix, one entry per learned merge, then ``<|startoftext|>`` and
``<|endoftext|>`` (last, as in CLIP). The merges are learned by plain BPE on the caption words
until every word is one token, so CLIP's BPE (which applies merges by rank) rebuilds each
caption word as a single ``word</w>`` token; any other text still tokenizes, character by
character.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.zoo.shapes_data import vocabulary

if TYPE_CHECKING:
    from transformers import CLIPTokenizer

logger = logging.getLogger(__name__)

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"
# Longest caption: 17 words + BOS + EOS = 19; 24 leaves room and stays a multiple of 8.
MODEL_MAX_LENGTH = 24
_SUFFIX = "</w>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable unicode table."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def learn_merges(words: list[str]) -> list[tuple[str, str]]:
    """Learn BPE merges until every word is a single ``word</w>`` symbol.

    Ties between equally frequent pairs are broken lexicographically so the result is a pure
    function of the word list.

    Args:
        words: Distinct lower-case words.

    Returns:
        Merges in rank order.
    """
    segs = [[*w[:-1], w[-1] + _SUFFIX] for w in words]
    merges: list[tuple[str, str]] = []
    while True:
        counts: dict[tuple[str, str], int] = {}
        for seg in segs:
            for pair in itertools.pairwise(seg):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            return merges
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        for k, seg in enumerate(segs):
            out: list[str] = []
            i = 0
            while i < len(seg):
                if i + 1 < len(seg) and (seg[i], seg[i + 1]) == best:
                    out.append(seg[i] + seg[i + 1])
                    i += 2
                else:
                    out.append(seg[i])
                    i += 1
            segs[k] = out


def vocab_and_merges(words: list[str] | None = None) -> tuple[dict[str, int], list[str]]:
    """Build CLIP-format ``vocab.json`` content and ``merges.txt`` lines.

    Args:
        words: Caption words; defaults to :func:`opsnn_quant.zoo.shapes_data.vocabulary`.

    Returns:
        ``(token -> id, merge lines "a b")``.
    """
    words = vocabulary() if words is None else words
    chars = list(_bytes_to_unicode().values())
    tokens = chars + [c + _SUFFIX for c in chars]
    merges = learn_merges(words)
    tokens += ["".join(m) for m in merges]
    tokens += [BOS, EOS]
    return {t: i for i, t in enumerate(tokens)}, [f"{a} {b}" for a, b in merges]


def write_tokenizer_files(out_dir: str | Path, words: list[str] | None = None) -> Path:
    """Write ``vocab.json`` and ``merges.txt`` and save a ``CLIPTokenizer`` in ``out_dir``.

    Args:
        out_dir: Directory (created) that ``CLIPTokenizer.from_pretrained`` can load offline.
        words: Caption words; defaults to :func:`opsnn_quant.zoo.shapes_data.vocabulary`
            (the videos' are :func:`opsnn_quant.zoo.shapes_video.vocabulary`).

    Returns:
        The directory.
    """
    from transformers import CLIPTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = vocab_and_merges(words)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    # The tokenizers BPE model takes (left, right) pairs; the type hint only names strings.
    pairs: Any = [tuple(m.split()) for m in merges]
    tok = CLIPTokenizer(
        vocab=vocab,
        merges=pairs,
        model_max_length=MODEL_MAX_LENGTH,
    )
    tok.save_pretrained(str(out))
    check_single_tokens(tok, words)
    logger.info("wrote shapes tokenizer (%d tokens) to %s", len(vocab), out)
    return out


def check_single_tokens(tokenizer: CLIPTokenizer, words: list[str] | None = None) -> None:
    """Raise ``ValueError`` unless every caption word tokenizes to exactly one known token."""
    words = vocabulary() if words is None else words
    for w in words:
        ids = tokenizer(w, add_special_tokens=False)["input_ids"]
        if len(ids) != 1 or tokenizer.convert_ids_to_tokens(ids)[0] != w + _SUFFIX:
            raise ValueError(f"word {w!r} tokenizes to {ids}, not one token")
