"""Synthetic English speech for the Whisper demo: espeak-ng sentences as a ``datasets.Dataset``.

Splits:

* ``eval``: a fixed set committed under ``data/speech-eval/`` (one FLAC of all utterances plus a
  transcript table with sample offsets). It loads without espeak-ng, so WER figures do not
  depend on the installed espeak-ng version. ``python -m opsnn_quant.zoo.speech_data build-eval``
  regenerates it.
* ``calibration`` and ``train``: generated on the fly with espeak-ng from ``seed``.

Every row has ``audio`` (float32 numpy samples in [-1, 1], 16 kHz mono), ``sampling_rate`` (16000),
``text``, ``voice`` (espeak-ng voice+variant) and ``speed`` (words per minute). The datasets
``Audio`` feature is not used on purpose: decoding it needs torchcodec.

Sentences are short, mostly from a small grammar over a controlled vocabulary, plus some free
sentences. Voices and speeds were chosen so that the fp32 tiny.en model transcribes the eval
set well (see :data:`VOICES`; 8.9 % normalised WER on the 100 eval utterances): quantization
damage then shows up in the WER instead of being lost among baseline errors.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import random
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opsnn_quant.errors import ConfigError, MissingDependencyError

logger = logging.getLogger(__name__)

SAMPLING_RATE = 16000
EVAL_DIR = Path(__file__).parent / "data" / "speech-eval"
EVAL_AUDIO = "audio.flac"
EVAL_TABLE = "transcripts.tsv"
EVAL_SIZE = 100
EVAL_SEED = 0
SPLITS = ("train", "calibration", "eval")
CALIBRATION_SIZE = 64
TRAIN_SIZE = 512

# espeak-ng voices (language + variant), speeds (words per minute) and the pause between words
# (``-g``, in units of 10 ms). Chosen by measuring fp32 tiny.en on 16-24 sentences per setting:
# without a word gap the voices gave 13-47 % normalised WER (word boundaries blur: "put the" ->
# "but in the", "cups of orange" -> "cup samar in"); with a 20 ms gap these six gave 2-7 %.
# Without a gap the other female variants were worse than f2 (f1 47 %, f3 33 %, f4 34 %).
VOICES: tuple[str, ...] = ("en-us+m6", "en-us+m3", "en-us+m1", "en-us+f2", "en-us", "en+m3")
SPEEDS: tuple[int, ...] = (140, 155, 170)
WORD_GAP = 2

_ESPEAK = "espeak-ng"
_ESPEAK_HINT = "apt-get install espeak-ng"
_SPLIT_OFFSET = {"eval": 0, "calibration": 1, "train": 2}

# Controlled vocabulary: everyday words in sentences that make sense, so that the decoder's
# language model helps the way it does on real speech. Short words that espeak-ng renders
# ambiguously in isolation (put/but, bag/back, pen/pan) were left out after listening tests
# with tiny.en.
_WORDS: dict[str, tuple[str, ...]] = {
    "animal": ("cat", "dog", "rabbit", "kitten", "puppy", "parrot"),
    "furniture": ("sofa", "carpet", "blanket", "pillow", "kitchen floor"),
    "name": ("anna", "peter", "maria", "david", "sarah", "michael", "emma", "robert"),
    "place": ("station", "library", "hospital", "museum", "supermarket", "airport", "beach"),
    "day": ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"),
    "number": ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    "drink": ("coffee", "tea", "water", "milk", "orange juice", "hot chocolate"),
    "vehicle": ("car", "truck", "bicycle", "motorbike", "school bus"),
    "building": ("post office", "hotel", "restaurant", "bakery", "police station"),
    "when": ("tomorrow morning", "this evening", "after lunch", "next week", "tonight"),
    "relative": ("brother", "sister", "mother", "father", "uncle", "grandmother", "cousin"),
    "food": ("apples", "bananas", "oranges", "lemons", "tomatoes", "potatoes", "carrots"),
    "color": ("red", "green", "blue", "yellow", "black", "white", "purple"),
    "clothing": ("jacket", "sweater", "dress", "shirt", "scarf", "umbrella"),
    "storage": ("closet", "drawer", "suitcase", "basket", "garage"),
    "side": ("left", "right"),
}
_TEMPLATES: tuple[str, ...] = (
    "the {animal} is sleeping on the {furniture}",
    "{name} is going to the {place} on {day}",
    "i would like {number} cups of {drink}",
    "the {vehicle} is parked next to the {building}",
    "can you call me {when}",
    "my {relative} lives near the {place}",
    "we bought {number} {food} at the market",
    "the {color} {clothing} is in the {storage}",
    "turn {side} after the {building}",
    "{name} and {name2} will visit us {when}",
)
# Free sentences, split into disjoint pools so generated splits never reuse eval ones.
_FREE: dict[str, tuple[str, ...]] = {
    "eval": (
        "the weather is very nice today",
        "i would like a cup of coffee",
        "she is reading a book in the garden",
        "the train leaves in ten minutes",
        "can you help me with my homework",
        "the children are playing outside",
        "my brother works at the hospital",
        "it is raining again this afternoon",
        "we need to buy some bread and milk",
        "the music was too loud last night",
        "he forgot his keys at the office",
        "this is the best pizza in town",
        "please close the window before you leave",
        "the meeting starts after lunch",
        "they moved to a new house last year",
        "the dog is sleeping on the sofa",
    ),
    "train": (
        "the sun is shining over the hills",
        "i am going to the shop later",
        "our teacher gave us a long test",
        "the phone is ringing in the kitchen",
        "do you know where the station is",
        "the flowers in the park are beautiful",
        "my sister plays the piano every day",
        "the bus was late this morning",
        "we had dinner with our friends",
        "the river is cold in the winter",
        "he likes to walk along the beach",
        "the store opens at nine",
        "she wrote a letter to her mother",
        "the cat is hiding under the bed",
        "let us go for a walk",
        "the computer is running very slowly",
    ),
}
_FREE_FRACTION = 0.25


def sample_sentence(rng: random.Random, free_pool: str) -> str:
    """One sentence: a filled grammar template, or (a quarter of the time) a free sentence."""
    if rng.random() < _FREE_FRACTION:
        return rng.choice(_FREE[free_pool])
    template = rng.choice(_TEMPLATES)
    fill = {key: rng.choice(words) for key, words in _WORDS.items()}
    fill["name2"] = rng.choice([w for w in _WORDS["name"] if w != fill["name"]])
    return template.format(**fill)


@dataclass(frozen=True)
class Utterance:
    """What to synthesize: a sentence, an espeak-ng voice and a speed in words per minute."""

    text: str
    voice: str
    speed: int


def utterance_list(split: str, n: int, seed: int = 0) -> list[Utterance]:
    """Deterministic list of utterances for a split.

    The same ``(split, n, seed)`` always gives the same list (string seeds hash the same in
    every Python process). Splits draw from different random streams, and the generated
    splits never repeat a sentence of the committed eval set.

    Raises:
        ConfigError: Unknown split or negative ``n``.
    """
    if split not in _SPLIT_OFFSET:
        raise ConfigError(f"unknown speech split {split!r}; known: {', '.join(SPLITS)}")
    if n < 0:
        raise ConfigError(f"number of utterances must be >= 0, got {n}")
    rng = random.Random(f"opsnn-speech/{split}/{seed}")
    banned = set() if split == "eval" else _eval_texts()
    seen: set[str] = set()
    out: list[Utterance] = []
    while len(out) < n:
        text = sample_sentence(rng, free_pool="eval" if split == "eval" else "train")
        if text in seen or text in banned:
            continue
        seen.add(text)
        out.append(Utterance(text, rng.choice(VOICES), rng.choice(SPEEDS)))
    return out


def espeak_available() -> bool:
    """Whether the ``espeak-ng`` program is on PATH."""
    return shutil.which(_ESPEAK) is not None


def _require_espeak() -> str:
    path = shutil.which(_ESPEAK)
    if path is None:
        raise MissingDependencyError(f"generated speech splits need espeak-ng: {_ESPEAK_HINT}")
    return path


def _resample(audio: np.ndarray, rate: int) -> np.ndarray:
    """Polyphase resampling (anti-aliased) to 16 kHz; espeak-ng writes 22.05 kHz."""
    if rate == SAMPLING_RATE:
        return audio
    try:
        from scipy.signal import resample_poly
    except ImportError as err:
        raise MissingDependencyError(
            "resampling espeak-ng output needs scipy: pip install 'opsnn-quant[demo]'"
        ) from err
    g = math.gcd(rate, SAMPLING_RATE)
    return np.asarray(resample_poly(audio, SAMPLING_RATE // g, rate // g), dtype=np.float64)


def synthesize(utt: Utterance) -> np.ndarray:
    """Speak one utterance with espeak-ng; float32 mono at 16 kHz.

    Raises:
        MissingDependencyError: espeak-ng is not installed.
    """
    exe = _require_espeak()
    with tempfile.TemporaryDirectory(prefix="opsnn-espeak-") as tmp:
        wav_path = Path(tmp) / "out.wav"
        # A file, not --stdout: the streamed WAV header carries no valid length.
        cmd = [exe, "-v", utt.voice, "-s", str(utt.speed), "-g", str(WORD_GAP)]
        cmd += ["-w", str(wav_path), "--", utt.text]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not wav_path.is_file():
            raise MissingDependencyError(
                f"espeak-ng failed for voice {utt.voice!r}: {proc.stderr.strip()[:200]}"
            )
        with wave.open(str(wav_path), "rb") as wav:
            if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
                raise MissingDependencyError("espeak-ng did not write 16-bit mono WAV")
            rate = wav.getframerate()
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    audio = _resample(pcm.astype(np.float64) / 32768.0, rate)
    return np.clip(audio, -1.0, 1.0).astype(np.float32)


def synthesize_all(utts: Sequence[Utterance]) -> list[np.ndarray]:
    """:func:`synthesize` each utterance, in order; one espeak-ng process per core at a time
    (each is a single-threaded subprocess: the waiting is parallel, the audio the same)."""
    workers = max(1, min(len(utts), os.cpu_count() or 1))
    if workers == 1:
        return [synthesize(u) for u in utts]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(synthesize, utts))


def to_dataset(utterances: Sequence[Utterance], audios: Sequence[np.ndarray]) -> Any:
    """Rows ``audio, sampling_rate, text, voice, speed`` as a ``datasets.Dataset``."""
    import datasets

    features = datasets.Features(
        {
            "audio": datasets.Sequence(datasets.Value("float32")),
            "sampling_rate": datasets.Value("int32"),
            "text": datasets.Value("string"),
            "voice": datasets.Value("string"),
            "speed": datasets.Value("int32"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "audio": [np.asarray(a, dtype=np.float32) for a in audios],
            "sampling_rate": [SAMPLING_RATE] * len(utterances),
            "text": [u.text for u in utterances],
            "voice": [u.voice for u in utterances],
            "speed": [u.speed for u in utterances],
        },
        features=features,
    ).with_format("numpy", columns=["audio"], output_all_columns=True)


def _eval_rows(directory: Path = EVAL_DIR) -> list[dict[str, str]]:
    with (directory / EVAL_TABLE).open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def _eval_texts() -> set[str]:
    try:
        return {row["text"] for row in _eval_rows()}
    except OSError:
        return set()


def _soundfile() -> Any:
    try:
        import soundfile
    except (ImportError, OSError) as err:
        raise MissingDependencyError(
            f"reading the committed speech eval set needs soundfile: pip install "
            f"'opsnn-quant[demo]' ({err})"
        ) from err
    return soundfile


def load_eval(limit: int | None = None, directory: Path = EVAL_DIR) -> Any:
    """The committed eval set (no espeak-ng needed)."""
    return to_dataset(*eval_split(limit, directory))


def eval_split(
    limit: int | None = None, directory: Path = EVAL_DIR
) -> tuple[list[Utterance], list[np.ndarray]]:
    """The committed eval set's utterances and audio."""
    rows = _eval_rows(directory)[:limit]
    pcm, rate = _soundfile().read(str(directory / EVAL_AUDIO), dtype="int16", always_2d=False)
    if rate != SAMPLING_RATE:
        raise ConfigError(f"{directory / EVAL_AUDIO} is {rate} Hz, expected {SAMPLING_RATE}")
    utts, audios = [], []
    for row in rows:
        start, length = int(row["start"]), int(row["length"])
        audios.append(pcm[start : start + length].astype(np.float32) / 32768.0)
        utts.append(Utterance(row["text"], row["voice"], int(row["speed"])))
    return utts, audios


def load_split(split: str, limit: int | None = None, seed: int = 0) -> Any:
    """Load a speech split as a ``datasets.Dataset`` (the rows of :func:`split_records`).

    Args:
        split: ``eval`` (committed), ``calibration`` or ``train`` (espeak-ng).
        limit: Keep only the first ``limit`` utterances.
        seed: Seed of the generated splits (the eval set is fixed).

    Raises:
        ConfigError: Unknown split.
        MissingDependencyError: espeak-ng (generated splits) or soundfile (eval) is missing.
    """
    utts, audios = _split(split, limit, seed)
    return to_dataset(utts, audios)


def split_records(split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """A speech split as records ``audio`` (float32), ``sampling_rate``, ``text``, ``voice``,
    ``speed``: the rows of :func:`load_split` without building a ``datasets.Dataset`` (its
    Arrow conversion cost calibrate ~0.5 s per 64 utterances).

    Args, Raises: as :func:`load_split`.
    """
    utts, audios = _split(split, limit, seed)
    return [
        {"audio": np.asarray(a, dtype=np.float32), "sampling_rate": SAMPLING_RATE,
         "text": u.text, "voice": u.voice, "speed": u.speed}
        for u, a in zip(utts, audios, strict=True)
    ]  # fmt: skip


def _split(split: str, limit: int | None, seed: int) -> tuple[list[Utterance], list[np.ndarray]]:
    """The utterances of a split and their audio.

    Args:
        split: ``eval`` (committed), ``calibration`` or ``train`` (espeak-ng).
        limit: Keep only the first ``limit`` utterances.
        seed: Seed of the generated splits (the eval set is fixed).

    Raises:
        ConfigError: Unknown split.
        MissingDependencyError: espeak-ng (generated splits) or soundfile (eval) is missing.
    """
    if split == "eval":
        return eval_split(limit)
    if split not in _SPLIT_OFFSET:
        raise ConfigError(f"unknown speech split {split!r}; known: {', '.join(SPLITS)}")
    size = CALIBRATION_SIZE if split == "calibration" else TRAIN_SIZE
    n = size if limit is None else min(limit, size)
    _require_espeak()
    utts = utterance_list(split, n, seed)
    return utts, synthesize_all(utts)


def build_eval(directory: Path = EVAL_DIR, n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> Path:
    """Regenerate the committed eval set with espeak-ng (16-bit FLAC + TSV).

    Audio is stored as 16-bit PCM; the eval split returns exactly these samples, so the
    committed files, not espeak-ng, define the evaluation.
    """
    soundfile = _soundfile()
    utts = utterance_list("eval", n, seed)
    pieces = [np.round(a * 32767.0).astype(np.int16) for a in synthesize_all(utts)]
    directory.mkdir(parents=True, exist_ok=True)
    tmp_audio = directory / f".{EVAL_AUDIO}.tmp"
    tmp_table = directory / f".{EVAL_TABLE}.tmp"
    # Maximum FLAC compression: the committed set must stay small (about 5 MB).
    soundfile.write(
        str(tmp_audio),
        np.concatenate(pieces),
        SAMPLING_RATE,
        subtype="PCM_16",
        format="FLAC",
        compression_level=1.0,
    )
    with tmp_table.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "start", "length", "voice", "speed", "text"])
        start = 0
        for i, (utt, piece) in enumerate(zip(utts, pieces, strict=True)):
            writer.writerow([f"eval-{i:04d}", start, len(piece), utt.voice, utt.speed, utt.text])
            start += len(piece)
    tmp_audio.replace(directory / EVAL_AUDIO)
    tmp_table.replace(directory / EVAL_TABLE)
    logger.info("wrote %d utterances (%.1f s) to %s", n, start / SAMPLING_RATE, directory)
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opsnn_quant.zoo.speech_data {build-eval,wer}``."""
    parser = argparse.ArgumentParser(prog="python -m opsnn_quant.zoo.speech_data")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build-eval", help="regenerate the committed eval set with espeak-ng")
    build.add_argument("--out", type=Path, default=EVAL_DIR)
    build.add_argument("-n", type=int, default=EVAL_SIZE)
    wer = sub.add_parser("wer", help="fp32 Whisper tiny.en WER on a split")
    wer.add_argument("--split", default="eval")
    wer.add_argument("--limit", type=int, default=None)
    wer.add_argument("--batch-size", type=int, default=8)
    wer.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "build-eval":
        build_eval(args.out, args.n)
        return 0
    import torch

    from opsnn_quant.zoo.whisper import measure_wer

    if args.threads:
        torch.set_num_threads(args.threads)

    report = measure_wer(load_split(args.split, limit=args.limit), batch_size=args.batch_size)
    for key, value in report.items():
        logger.info("%s: %s", key, value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
