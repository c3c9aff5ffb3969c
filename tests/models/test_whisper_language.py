"""Whisper's ``language`` and ``task`` settings: checked against the checkpoint's generation config
before anything loads, and the decoder prompt they make (openai/whisper's and transformers'
``WhisperGenerationMixin._retrieve_init_tokens``: start, language, task, no-timestamps)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from opsnn_quant.errors import ConfigError
from opsnn_quant.models import load_adapter
from opsnn_quant.models.settings import WhisperSettings, check_fits, settings_for
from tests.tiny_pipelines import (
    MULTILINGUAL_TOKENS as T,
)
from tests.tiny_pipelines import (
    save_tiny_multilingual_whisper,
    save_tiny_whisper,
)


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    return save_tiny_multilingual_whisper(tmp_path_factory.mktemp("ml") / "whisper")


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    return save_tiny_whisper(tmp_path_factory.mktemp("en") / "whisper")


def test_a_typo_lists_the_keys_whisper_takes():
    with pytest.raises(ConfigError) as info:
        settings_for("whisper", {"languag": "zh"})
    assert str(info.value) == (
        "whisper settings: languag: Extra inputs are not permitted; did you mean 'language'?; "
        "the keys: batch_size, max_new_tokens, num_beams, language, task"
    )
    with pytest.raises(ConfigError, match=r"task: Input should be 'transcribe' or 'translate'"):
        settings_for("whisper", {"task": "transcrib"})
    with pytest.raises(ConfigError, match=r"language: String should match pattern"):
        settings_for("whisper", {"language": "Chinese"})


def test_language_and_task_are_checked_against_the_checkpoint(multilingual, english):
    check_fits(multilingual, WhisperSettings(max_new_tokens=4, language="zh", task="translate"))
    with pytest.raises(ConfigError) as info:
        check_fits(multilingual, WhisperSettings(max_new_tokens=4, language="fr"), where="--set ")
    assert str(info.value) == (
        f"--set language: fr is not one of the 3 languages of {multilingual} "
        f"({multilingual}/generation_config.json lang_to_id: de, en, zh)"
    )
    check_fits(english, WhisperSettings(max_new_tokens=4, language="en", task="transcribe"))
    with pytest.raises(
        ConfigError, match=r"language: zh is not English, and .* is an English-only"
    ):
        check_fits(english, WhisperSettings(max_new_tokens=4, language="zh"))
    with pytest.raises(ConfigError, match=r"task: translate needs a multilingual Whisper model"):
        check_fits(english, WhisperSettings(max_new_tokens=4, task="translate"))


def _prompt(adapter) -> list[int]:
    """The decoder's first input ids when ``adapter`` transcribes one second of noise."""
    seen: list[list[int]] = []

    def grab(module, args, kwargs):
        ids = kwargs.get("decoder_input_ids")
        if ids is not None and not seen:
            seen.append(ids[0].tolist())

    handle = adapter.model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        audio = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
        adapter.generate([{"audio": {"array": audio, "sampling_rate": 16000}}])
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize(
    ("settings", "prompt"),
    [
        ({"language": "zh"}, [T["sot"], T["zh"], T["transcribe"], T["notimestamps"]]),
        ({"language": "de", "task": "translate"}, [T["sot"], T["de"], T["translate"], T["notimestamps"]]),
        ({"language": "en"}, [T["sot"], T["en"], T["transcribe"], T["notimestamps"]]),
    ],
)  # fmt: skip
def test_a_multilingual_model_decodes_in_the_given_language(multilingual, settings, prompt):
    torch.manual_seed(0)
    adapter = load_adapter("whisper", str(multilingual), max_new_tokens=4, **settings)
    assert _prompt(adapter) == prompt


def test_an_english_only_model_takes_en_as_its_default(english):
    # tiny.en's prompt (<|startoftranscript|><|notimestamps|>) with or without language=en
    plain = load_adapter("whisper", str(english), max_new_tokens=4)
    given = load_adapter("whisper", str(english), max_new_tokens=4, language="en")
    assert _prompt(plain) == _prompt(given) == [50257, 50362]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="zoo:speech-zh needs espeak-ng")
def test_calibrate_in_mandarin_is_judged_by_characters_end_to_end(multilingual, tmp_path):
    # the command on a tiny random multilingual Whisper: --set language=zh, generated
    # Mandarin, --evaluate a suite in Mandarin: CER and agreement CER with their intervals, no WER
    import json

    from opsnn_quant.cli import main

    suite = tmp_path / "zh.yaml"
    suite.write_text(
        "schema_version: 1\nname: tiny-zh\ntask: asr\n"
        "data: {dataset: speech-zh, split: eval, samples: 4}\n"
        "generation: {max_new_tokens: 8, batch_size: 2, language: zh}\n"
        "metrics: {fid_features: null, thresholds: {cer_delta_max_points: 50.0, "
        "agreement_cer_max_points: 80.0}}\n"
    )
    out = tmp_path / "out"
    argv = ["calibrate", "--model", str(multilingual), "--data", "zoo:speech-zh/calibration",
            "--limit", "4", "--set", "language=zh", "--set", "max_new_tokens=8",
            "--set", "batch_size=2", "--evaluate", str(suite), "--latency", "none",
            "-o", str(out), "--quiet"]  # fmt: skip
    assert main(argv) in (0, 3, 4)  # the verdict of a random model's transcripts is no matter
    report = json.loads((out / "report" / "report.json").read_text())
    judged = {c["key"]: c for c in report["criteria"]}
    assert {"cer_delta_max_points", "agreement_cer_max_points"} <= set(judged)
    for key in ("cer_delta_max_points", "agreement_cer_max_points"):
        c = judged[key]
        assert c["n"] == 4 and c["ci_low"] is not None and c["ci_low"] <= c["value"] <= c["ci_high"]
    assert [q["metric"] for q in report["quality"]] == [
        "CER",
        "agreement CER (candidate vs baseline)",
    ]
    assert report["notes"][0].startswith("error rates after Whisper basic normalisation (zh)")
    assert "language: zh" in (out / "recipe.yaml").read_text()  # the run repeats in Mandarin
    # what a rerun must match to give the same transcripts: the suite's batch size, the threads
    depend = report["outputs_depend_on"]
    assert depend["batch_size"] == 2 and depend["threads"] == torch.get_num_threads()
    assert depend["device"] == "cpu" and depend["torch"] == torch.__version__
    assert depend["float_gemm_rows_invariant"] is True  # MKL's strict reproducibility is on
    assert not any("round by the batch's row count" in n for n in report["notes"])
    assert "outputs depend on: batch_size 2, threads" in (out / "report" / "report.md").read_text()


def test_a_setting_given_by_set_is_named_so_in_its_error(english, tmp_path, capsys):
    from opsnn_quant.cli import main

    out = tmp_path / "out"
    argv = ["calibrate", "--model", str(english), "--data", "zoo:speech/calibration",
            "--set", "language=zh", "-o", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --set language: zh is not English, and "), (
        err
    )
    assert not out.exists()
