"""Synthetic English speech for the Whisper demo: espeak-ng sentences as a ``datasets.Dataset``.

Splits:

* ``eval``: a fixed set committed under ``data/speech-eval/`` (one FLAC of all utterances plus a
  transcript table with sample offsets). It loads without espeak-ng, so WER figures do not
  depend on the installed espeak-ng version. ``python -m opsnn_quant.zoo.speech_data build-eval``
  regenerates it.
* ``calibration`` and ``train``: generated on the fly with espeak-ng from ``seed``.
* ``eval-large``: 512 utterances for the acceptance suite, generated once with espeak-ng into the
  user cache (``$OPSNN_QUANT_CACHE`` or ``platformdirs.user_cache_dir("opsnn-quant")``, under
  ``speech-eval-large/``) and read from there without espeak-ng. Its sentences come from their
  own templates and free sentences (no other split can produce them), with varied voices,
  speeds and pitches and white or pink noise on about a third of the utterances. Its audio
  depends on the espeak-ng version, recorded in the set's manifest: a cache built with another
  version, or one whose files do not match the manifest, is generated again.

Every row has ``audio`` (float32 numpy samples in [-1, 1], 16 kHz mono), ``sampling_rate`` (16000),
``text``, ``voice`` (espeak-ng voice+variant) and ``speed`` (words per minute); the pitch and
noise of an ``eval-large`` utterance are in its table (:func:`eval_large_split` returns them). The datasets
``Audio`` feature is not used on purpose: decoding it needs torchcodec.

Sentences are short, mostly from a small grammar over a controlled vocabulary, plus some free
sentences. Voices and speeds were chosen so that the fp32 tiny.en model transcribes the eval
set well (see :data:`VOICES`; 8.9 % normalised WER on the 100 eval utterances): quantization
damage then shows up in the WER instead of being lost among baseline errors. The varied
``eval-large`` set is harder: 13.8 % on its 512 utterances.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import random
import re
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

from opsnn_quant.errors import CacheError, ConfigError, MissingDependencyError
from opsnn_quant.zoo.cache_dir import build_cache_dir, check_entry, file_sha256, read_cached

logger = logging.getLogger(__name__)

SAMPLING_RATE = 16000
EVAL_DIR = Path(__file__).parent / "data" / "speech-eval"
EVAL_AUDIO = "audio.flac"
EVAL_TABLE = "transcripts.tsv"
EVAL_SIZE = 100
EVAL_SEED = 0
EVAL_LARGE = "eval-large"
SPLITS = ("train", "calibration", "eval", EVAL_LARGE)
CALIBRATION_SIZE = 64
TRAIN_SIZE = 512
EVAL_LARGE_SIZE = 512
EVAL_LARGE_SEED = 0
EVAL_LARGE_DIR_NAME = "speech-eval-large"
EVAL_LARGE_MANIFEST = "manifest.json"
# Bump whenever the eval-large audio changes in a way its utterance list does not show (noise
# shape, mixing, storage): cached sets are generated again.
EVAL_LARGE_FORMAT = 1

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
_SPLIT_OFFSET = {"eval": 0, "calibration": 1, "train": 2, EVAL_LARGE: 3}

# eval-large: each utterance draws a speed and an espeak-ng pitch (``-p``, 0-99, 50 the voice's
# own) from these inclusive ranges; about a third get white or pink noise at an SNR (over the
# whole utterance) drawn from NOISE_SNR_DB. Measured with fp32 tiny.en on 96 utterances: the
# drawn pitch cost nothing (13.6 % WER on the noise-free ones, 14.4 % on the same sentences at
# the voices' own pitch),
# white noise at 10-15 dB lost 44 % of the words (10 utterances), so the SNR starts at 15 dB.
LARGE_SPEEDS = (130, 180)
LARGE_PITCHES = (30, 70)
NOISE_FRACTION = 1 / 3
NOISE_KINDS = ("white", "pink")
NOISE_SNR_DB = (15.0, 30.0)

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

# eval-large's own sentences: templates over the same vocabulary whose fixed words differ from
# every template above, and free sentences of its own, so that no other split (whatever its seed)
# can produce one of them without the calibration and train audio changing (tested by listing
# every sentence the other templates can make). No sentence starts with a name: tiny.en heard a
# leading "anna" or "emma" as "and" (24 % WER on such sentences against 15 % on the others).
_LARGE_TEMPLATES: tuple[str, ...] = (
    "yesterday {name} left the {clothing} at the {building}",
    "my {relative} drinks {drink} every {day}",
    "the {animal} is hiding in the {storage}",
    "my friend {name} is waiting for the {vehicle} {when}",
    "we will meet at the {building} at {number} o'clock",
    "does your {relative} like {drink}",
    "there are {number} {food} on the table",
    "the {place} is closed on {day}",
    "this morning {name} found a {color} {clothing} in the {storage}",
    "please take the {vehicle} to the {place}",
    "my {relative} and {name} are at the {place}",
    "the {animal} likes to sleep on the {furniture}",
)
_LARGE_FREE: tuple[str, ...] = (
    "i left my umbrella on the train",
    "the soup is too hot to eat",
    "we are going camping next summer",
    "he drives to work every morning",
    "the baby is sleeping in the other room",
    "could you turn off the lights please",
    "the shop on the corner sells fresh fish",
    "my grandfather tells funny stories",
    "the plane landed an hour late",
    "she painted the kitchen walls yellow",
    "there is a small lake behind the school",
    "they are watching a film at home",
    "i need a new pair of shoes",
    "the garden looks lovely in the spring",
    "our neighbors have a big white dog",
    "the kettle is on the stove",
    "he is learning to play the guitar",
    "we walked along the river after dinner",
    "the doctor will see you in a moment",
    "please write your name on the form",
    "the cake needs twenty more minutes",
    "the road was closed because of the snow",
    "she always drinks tea with honey",
    "my phone battery is almost empty",
)


def sample_sentence(rng: random.Random, free_pool: str) -> str:
    """One sentence: a filled grammar template, or (a quarter of the time) a free sentence.

    Args:
        rng: The split's random stream.
        free_pool: ``eval`` or ``train`` (the templates of :data:`_TEMPLATES`), or
            ``eval-large`` (its own templates and free sentences).
    """
    large = free_pool == EVAL_LARGE
    if rng.random() < _FREE_FRACTION:
        return rng.choice(_LARGE_FREE if large else _FREE[free_pool])
    template = rng.choice(_LARGE_TEMPLATES if large else _TEMPLATES)
    fill = {key: rng.choice(words) for key, words in _WORDS.items()}
    fill["name2"] = rng.choice([w for w in _WORDS["name"] if w != fill["name"]])
    return template.format(**fill)


@dataclass(frozen=True)
class Utterance:
    """What to synthesize: a sentence, an espeak-ng voice and a speed in words per minute; for
    ``eval-large`` also an espeak-ng pitch and additive noise.

    Attributes:
        text: The sentence.
        voice: espeak-ng voice and variant (``-v``).
        speed: Words per minute (``-s``).
        pitch: espeak-ng pitch adjustment (``-p``, 0-99); None: the voice's own (no ``-p``).
        noise: ``white`` or ``pink`` noise added after synthesis; None: clean.
        snr_db: Speech-to-noise power ratio of the added noise, in dB.
        noise_seed: Seed of the numpy Generator that draws the noise.
    """

    text: str
    voice: str
    speed: int
    pitch: int | None = None
    noise: str | None = None
    snr_db: float | None = None
    noise_seed: int | None = None


def utterance_list(split: str, n: int, seed: int = 0) -> list[Utterance]:
    """Deterministic list of utterances for a split.

    The same ``(split, n, seed)`` always gives the same list (string seeds hash the same in
    every Python process), and a shorter list is a prefix of a longer one. Splits draw from
    different random streams, the generated splits never repeat a sentence of the committed
    eval set, and ``eval-large`` draws from sentences no other split can produce.

    Raises:
        ConfigError: Unknown split or negative ``n``.
    """
    if split not in _SPLIT_OFFSET:
        raise ConfigError(f"unknown speech split {split!r}; known: {', '.join(SPLITS)}")
    if n < 0:
        raise ConfigError(f"number of utterances must be >= 0, got {n}")
    rng = random.Random(f"opsnn-speech/{split}/{seed}")
    if split == EVAL_LARGE:
        return _large_utterances(rng, n)
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


def _large_utterances(rng: random.Random, n: int) -> list[Utterance]:
    """``n`` distinct eval-large sentences, each with a voice, speed, pitch and maybe noise,
    all drawn in order from ``rng`` (so a shorter list is a prefix of a longer one)."""
    seen: set[str] = set()
    out: list[Utterance] = []
    while len(out) < n:
        text = sample_sentence(rng, free_pool=EVAL_LARGE)
        if text in seen:
            continue
        seen.add(text)
        voice = rng.choice(VOICES)
        speed = rng.randint(*LARGE_SPEEDS)
        pitch = rng.randint(*LARGE_PITCHES)
        noise = snr = seed = None
        if rng.random() < NOISE_FRACTION:
            noise = rng.choice(NOISE_KINDS)
            snr = round(rng.uniform(*NOISE_SNR_DB), 1)
            seed = rng.getrandbits(63)
        out.append(Utterance(text, voice, speed, pitch, noise, snr, seed))
    return out


def add_noise(speech: np.ndarray, kind: str, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``speech`` plus white or pink (power 1/f) Gaussian noise at ``snr_db`` (float64).

    The SNR is the mean power of ``speech`` over that of the noise, both over the whole
    utterance (espeak-ng leaves little silence around a sentence).

    Raises:
        ConfigError: Unknown noise kind.
    """
    if kind not in NOISE_KINDS:
        raise ConfigError(f"unknown noise {kind!r}; known: {', '.join(NOISE_KINDS)}")
    speech = np.asarray(speech, dtype=np.float64)
    power = float(np.mean(speech**2)) if speech.size else 0.0
    if power == 0.0:
        return speech
    noise = rng.standard_normal(speech.size)
    if kind == "pink":
        spectrum = np.fft.rfft(noise)
        bins = np.arange(spectrum.size, dtype=np.float64)
        spectrum[0] = 0.0  # no DC offset
        spectrum[1:] /= np.sqrt(bins[1:])  # amplitude 1/sqrt(f): power 1/f
        noise = np.fft.irfft(spectrum, n=speech.size)
    noise *= math.sqrt(power / (float(np.mean(noise**2)) * 10.0 ** (snr_db / 10.0)))
    return speech + noise


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
        if utt.pitch is not None:  # only when asked: the other splits' commands stay as they were
            cmd += ["-p", str(utt.pitch)]
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
    if utt.noise is not None:
        if utt.snr_db is None or utt.noise_seed is None:
            raise ConfigError(f"noisy utterance {utt.text!r} needs snr_db and noise_seed")
        audio = add_noise(audio, utt.noise, utt.snr_db, np.random.default_rng(utt.noise_seed))
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
    """The utterances and audio of a stored set (FLAC + transcript table): the committed eval
    set by default, or the cached ``eval-large`` set (whose table also has pitch and noise).

    Only the audio up to the last utterance kept is decoded (a FLAC prefix is exact).

    Raises:
        ConfigError: The audio is not 16 kHz.
        MissingDependencyError: soundfile is missing.
    """
    rows = _eval_rows(directory)[:limit]
    if not rows:
        return [], []
    frames = max(int(row["start"]) + int(row["length"]) for row in rows)
    pcm, rate = _soundfile().read(
        str(directory / EVAL_AUDIO), frames=frames, dtype="int16", always_2d=False
    )
    if rate != SAMPLING_RATE:
        raise ConfigError(f"{directory / EVAL_AUDIO} is {rate} Hz, expected {SAMPLING_RATE}")
    utts, audios = [], []
    for row in rows:
        start, length = int(row["start"]), int(row["length"])
        audios.append(pcm[start : start + length].astype(np.float32) / 32768.0)
        utts.append(_row_utterance(row))
    return utts, audios


def _row_utterance(row: dict[str, str]) -> Utterance:
    """The utterance a table row describes (the eval-large columns are empty or absent when
    unused)."""

    def opt(key: str) -> str | None:
        return row.get(key) or None

    pitch, noise, snr, seed = opt("pitch"), opt("noise"), opt("snr_db"), opt("noise_seed")
    return Utterance(
        row["text"],
        row["voice"],
        int(row["speed"]),
        None if pitch is None else int(pitch),
        noise,
        None if snr is None else float(snr),
        None if seed is None else int(seed),
    )


def eval_large_dir() -> Path:
    """Where the ``eval-large`` set is cached: ``speech-eval-large/`` under the zoo's cache
    root (``$OPSNN_QUANT_CACHE`` or the user cache dir)."""
    from opsnn_quant.zoo.whisper import cache_root

    return cache_root() / EVAL_LARGE_DIR_NAME


@functools.lru_cache(maxsize=1)
def espeak_version() -> str | None:
    """The installed espeak-ng's version (``1.51``), or None when it is not installed."""
    exe = shutil.which(_ESPEAK)
    if exe is None:
        return None
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"text-to-speech:\s*(\S+)", proc.stdout)
    return match.group(1) if match else proc.stdout.strip()[:80] or None


def _utterances_sha256(utts: Sequence[Utterance]) -> str:
    rows = [dataclasses.astuple(u) for u in utts]
    return hashlib.sha256(json.dumps(rows).encode("utf-8")).hexdigest()


def _large_manifest(utts: Sequence[Utterance], seed: int) -> dict[str, Any]:
    """The manifest fields that depend on what is asked for (the files' hashes come after)."""
    return {
        "format": EVAL_LARGE_FORMAT,
        "split": EVAL_LARGE,
        "seed": seed,
        "count": len(utts),
        "utterances_sha256": _utterances_sha256(utts),
    }


def _large_problem(directory: Path, expected: dict[str, Any]) -> str | None:
    """Why the cached set in ``directory`` cannot be used (None: it can).

    A set is reused when its manifest matches ``expected`` (format, seed, count, utterance
    list), its files match the manifest's hashes, and it was generated by the installed
    espeak-ng (not checked where espeak-ng is missing: the set then loads as it is).

    Raises:
        CacheError: a file of it is no regular file inside the cache (a FIFO, a device, a link
            loop or a link out of it): refused, never opened
            (:func:`~opsnn_quant.zoo.cache_dir.check_entry`).
    """
    check_entry(directory, directory.parent)  # a FIFO or link loop there: refused, not read
    try:
        manifest = json.loads(read_cached(directory / EVAL_LARGE_MANIFEST, directory.parent))
    except FileNotFoundError:
        return "none cached yet" if not directory.exists() else "its manifest is missing"
    except (OSError, ValueError) as err:
        return f"its manifest is unreadable ({err})"
    if not isinstance(manifest, dict):
        return "its manifest is not a JSON object"
    for key, value in expected.items():
        if manifest.get(key) == value:
            continue
        if key == "utterances_sha256":  # a hash in the log would tell the reader nothing
            return "its utterance list is not the one this version of opsnn-quant draws"
        return f"its {key} is {manifest.get(key)!r}, expected {value!r}"
    installed = espeak_version()
    if installed is not None and manifest.get("espeak_ng") != installed:
        return f"it was generated by espeak-ng {manifest.get('espeak_ng')}, this is {installed}"
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != {EVAL_AUDIO, EVAL_TABLE}:
        return "its manifest lists no file hashes"
    for name, digest in files.items():
        try:
            if file_sha256(directory / name, directory.parent) != digest:
                return f"{name} does not match its hash"
        except OSError as err:
            return f"{name} is unreadable ({err})"
    return None


def ensure_eval_large(n: int | None = None, seed: int = EVAL_LARGE_SEED) -> Path:
    """The cached ``eval-large`` set's directory, generated first where needed.

    Generated once with espeak-ng (one process per core) into a temporary sibling directory,
    the manifest written last, then renamed into place: an interrupted run leaves no set, and
    a set another process finished meanwhile is kept.

    Args:
        n: Number of utterances (default :data:`EVAL_LARGE_SIZE`).
        seed: The set's seed.

    Raises:
        MissingDependencyError: The set must be generated and espeak-ng (or soundfile) is
            missing.
        ConfigError: The cache directory is not writable.
        CacheError: A file of the cached set is no regular file inside the cache, or the set
            does not match its manifest and the cache cannot be rewritten.
    """
    n = EVAL_LARGE_SIZE if n is None else n
    final = eval_large_dir()
    utts = utterance_list(EVAL_LARGE, n, seed)
    expected = _large_manifest(utts, seed)
    problem = _large_problem(final, expected)
    if problem is None:
        return final
    if not espeak_available():
        raise MissingDependencyError(
            f"the speech eval-large split is generated once with espeak-ng into {final} "
            f"({problem}): {_ESPEAK_HINT}"
        )
    log = logger.info if problem == "none cached yet" else logger.warning
    log("generating the speech eval-large split (%d utterances) into %s: %s", n, final, problem)

    def fill(tmp: Path) -> None:
        _write_set(tmp, utts, synthesize_all(utts), EVAL_LARGE)
        manifest = {
            **expected,
            "espeak_ng": espeak_version(),
            "files": {name: file_sha256(tmp / name) for name in (EVAL_AUDIO, EVAL_TABLE)},
        }
        # Written last: a directory without it is never trusted.
        (tmp / EVAL_LARGE_MANIFEST).write_text(
            json.dumps(manifest, indent=2) + "\n", encoding="utf-8"
        )

    def unwritable(err: OSError) -> Exception:
        if problem == "none cached yet":
            return ConfigError(
                f"cannot write the speech cache {final.parent}: {err}; set OPSNN_QUANT_CACHE"
            )
        return CacheError(
            f"the cached speech eval-large set in {final} cannot be used ({problem}) and the "
            f"cache cannot be rewritten ({err.strerror or err}): remove it, or set "
            "OPSNN_QUANT_CACHE to a writable directory"
        )

    return build_cache_dir(final, fill, lambda: _large_problem(final, expected) is None, unwritable)


def eval_large_split(limit: int | None = None) -> tuple[list[Utterance], list[np.ndarray]]:
    """The ``eval-large`` set's utterances and audio, from the cache (generated first where
    needed; loading a valid cached set needs no espeak-ng).

    Args:
        limit: Keep only the first ``limit`` utterances.

    Raises:
        MissingDependencyError: The set must be generated and espeak-ng is missing, or
            soundfile is missing.
    """
    return eval_split(limit, ensure_eval_large())


def load_split(split: str, limit: int | None = None, seed: int = 0) -> Any:
    """Load a speech split as a ``datasets.Dataset`` (the rows of :func:`split_records`).

    Args:
        split: ``eval`` (committed), ``calibration`` or ``train`` (espeak-ng), or
            ``eval-large`` (generated once into the cache).
        limit: Keep only the first ``limit`` utterances.
        seed: Seed of the generated splits (the eval sets are fixed).

    Raises:
        ConfigError: Unknown split.
        MissingDependencyError: espeak-ng (generated splits, an eval-large set not cached yet)
            or soundfile (eval, eval-large) is missing.
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
    """The utterances of a split and their audio (arguments and errors: :func:`load_split`)."""
    if split == "eval":
        return eval_split(limit)
    if split == EVAL_LARGE:
        return eval_large_split(limit)
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
    utts = utterance_list("eval", n, seed)
    directory.mkdir(parents=True, exist_ok=True)
    _write_set(directory, utts, synthesize_all(utts), "eval")
    return directory


def _write_set(
    directory: Path,
    utts: Sequence[Utterance],
    audios: Sequence[np.ndarray],
    split: str,
) -> None:
    """One 16-bit FLAC of all utterances and the transcript table with sample offsets; the
    eval-large table also has each utterance's pitch and noise. Each file is written to a
    temporary name, then renamed. Maximum FLAC compression (the committed set must stay small,
    about 5 MB; it costs under a second for the 512 utterances of eval-large)."""
    soundfile = _soundfile()
    pieces = [np.round(a * 32767.0).astype(np.int16) for a in audios]
    tmp_audio = directory / f".{EVAL_AUDIO}.tmp"
    tmp_table = directory / f".{EVAL_TABLE}.tmp"
    soundfile.write(
        str(tmp_audio),
        np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16),
        SAMPLING_RATE,
        subtype="PCM_16",
        format="FLAC",
        compression_level=1.0,
    )
    large = split == EVAL_LARGE
    extra = ["pitch", "noise", "snr_db", "noise_seed"] if large else []
    with tmp_table.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "start", "length", "voice", "speed", *extra, "text"])
        start = 0
        for i, (utt, piece) in enumerate(zip(utts, pieces, strict=True)):
            row: list[Any] = [f"{split}-{i:04d}", start, len(piece), utt.voice, utt.speed]
            if large:
                row += ["" if v is None else v for v in (utt.pitch, utt.noise, utt.snr_db)]
                row.append("" if utt.noise_seed is None else utt.noise_seed)
            writer.writerow([*row, utt.text])
            start += len(piece)
    tmp_audio.replace(directory / EVAL_AUDIO)
    tmp_table.replace(directory / EVAL_TABLE)
    logger.info("wrote %d utterances (%.1f s) to %s", len(utts), start / SAMPLING_RATE, directory)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opsnn_quant.zoo.speech_data {build-eval,build-eval-large,wer}``."""
    parser = argparse.ArgumentParser(prog="python -m opsnn_quant.zoo.speech_data")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build-eval", help="regenerate the committed eval set with espeak-ng")
    build.add_argument("--out", type=Path, default=EVAL_DIR)
    build.add_argument("-n", type=int, default=EVAL_SIZE)
    sub.add_parser(
        "build-eval-large",
        help="generate the eval-large split into the cache now (else its first load does)",
    )
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
    if args.command == "build-eval-large":
        logger.info("eval-large: %s", ensure_eval_large())
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
