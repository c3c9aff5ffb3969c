"""Int8 attention (``a8``): the SDPA call caught in an attention module's forward and run as
the A2 fused int8 attention (opsnn_quant/quant/attention.py), calibrated, saved and loaded.

Expectations are independent of the module under test: hand-computed scales and int8 values,
the fused op of :mod:`opsnn_quant.ascend.attention` called by hand with the scales the FIA doc
names (``deq_scale1`` after QK^T, ``quant_scale1`` on P, ``deq_scale2`` after PV), float SDPA,
and round trips.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention
from torch import nn

from opsnn_quant import ascend
from opsnn_quant.core.timesteps import at_step
from opsnn_quant.errors import CalibrationError, CheckpointError, ConfigError
from opsnn_quant.formats.checkpoint import load_quantized, read_description, save_quantized
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.attention import (
    QuantizedAttention,
    attention_modules,
    call_ranges,
    frozen_attention,
    int8_sdpa,
    read_call,
    scales_of,
    smooth_k,
)
from opsnn_quant.quant.spec import QuantSpec
from opsnn_quant.types import Precision


def _sqnr_db(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.detach(), ref.detach()
    return float(10 * torch.log10(ref.pow(2).mean() / (y - ref).pow(2).mean()))


class _TwoAttentions(nn.Module):
    """A self-attention and a cross-attention (diffusers ``Attention``, head dim 32)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention(query_dim=64, heads=2, dim_head=32)
        self.cross = Attention(query_dim=64, cross_attention_dim=48, heads=2, dim_head=32)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.cross(self.attn(x), encoder_hidden_states=context)


def _model_and_data(
    seed: int = 0,
) -> tuple[_TwoAttentions, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(seed)
    model = _TwoAttentions().eval()
    data = [(torch.randn(2, 40, 64), torch.randn(2, 7, 48)) for _ in range(3)]
    return model, data


def _loop(data: list[tuple[torch.Tensor, torch.Tensor]]):
    def loop(model: nn.Module) -> None:
        for x, c in data:
            model(x, c)

    return loop


# ----------------------------------------------------------------------------- the arithmetic


def test_scales_are_amax_over_127_and_one_for_an_all_zero_tensor() -> None:
    s = scales_of(torch.tensor([2.54, 0.0, 127.0]))
    assert s.tolist() == pytest.approx([0.02, 1.0, 1.0])


def test_int8_sdpa_is_the_fused_op_on_int8_qkv_with_the_documented_scales() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 32) for _ in range(3))
    sq, sk, sv = 0.03, 0.02, 0.025
    # by hand: AscendQuantV2 rounds x / s half to even and saturates (npu_quantize)
    q8, k8, v8 = (torch.clamp(torch.round(t / s), -128, 127).to(torch.int8) for t, s in ((q, sq), (k, sk), (v, sv)))  # fmt: skip
    expected, _ = ascend.npu_fused_infer_attention_score(
        q8, k8, v8,
        dequant_scale1=torch.tensor([sq * sk], dtype=torch.float32),
        quant_scale1=torch.tensor([127.0]),
        dequant_scale2=torch.tensor([sv / 127.0], dtype=torch.float32),
        num_heads=2, num_key_value_heads=2, scale=32**-0.5, input_layout="BNSD",
    )  # fmt: skip
    call = read_call((q, k, v), {})
    got = int8_sdpa(call, torch.tensor([sq, sk, sv]), k_mean=False)
    # x * (1 / s) against x / s: equal here but at ties, which random normals do not hit
    assert torch.equal(got, expected.to(torch.float32))
    assert got.dtype == torch.float32


def test_int8_sdpa_is_close_to_float_sdpa() -> None:
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 2, 64, 32) for _ in range(3))
    call = read_call((q, k, v), {"scale": 0.2})
    amax = torch.stack([t.abs().amax() for t in (q, k, v)])
    got = int8_sdpa(call, scales_of(amax), k_mean=False)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.2)
    assert _sqnr_db(got, ref) > 30.0


def test_k_mean_leaves_float_attention_unchanged_and_helps_an_offset_key() -> None:
    torch.manual_seed(3)
    q, v = torch.randn(1, 2, 48, 32), torch.randn(1, 2, 48, 32)
    k = torch.randn(1, 2, 48, 32) + 6.0  # a large offset common to every key
    ref = F.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(F.scaled_dot_product_attention(q, smooth_k(k), v), ref, atol=1e-5)
    call = read_call((q, k, v), {})
    plain = int8_sdpa(call, scales_of(torch.stack([q.abs().amax(), k.abs().amax(), v.abs().amax()])), False)  # fmt: skip
    smoothed = int8_sdpa(call, scales_of(torch.stack([q.abs().amax(), smooth_k(k).abs().amax(), v.abs().amax()])), True)  # fmt: skip
    assert _sqnr_db(smoothed, ref) > _sqnr_db(plain, ref) + 3.0


# ----------------------------------------------------------------------------- masks, refusals


def test_a_bool_mask_is_inverted_and_a_causal_call_masks_the_future() -> None:
    q = k = v = torch.zeros(1, 2, 3, 32)
    attend = torch.tensor([[True, False, True]] * 3)
    call = read_call((q, k, v), {"attn_mask": attend})
    assert call.problem is None and call.masked is not None
    assert call.masked.shape == (1, 1, 3, 3)
    assert call.masked[0, 0].tolist() == [[False, True, False]] * 3
    causal = read_call((q, k, v), {"is_causal": True})
    assert causal.masked is not None
    assert causal.masked[0, 0].tolist() == [
        [False, True, True],
        [False, False, True],
        [False, False, False],
    ]


def test_an_additive_mask_of_zero_and_lowest_is_a_mask_a_bias_is_not() -> None:
    q = k = v = torch.zeros(2, 2, 3, 32)
    low = torch.finfo(torch.float32).min
    mask = torch.tensor([[0.0, low, 0.0]]).expand(2, 1, 3, 3)
    call = read_call((q, k, v, mask), {})
    assert call.problem is None and call.masked is not None
    assert call.masked[:, 0].tolist() == [[[False, True, False]] * 3] * 2
    bias = read_call((q, k, v, mask + 0.5), {})
    assert bias.problem is not None and "bias" in bias.problem


@pytest.mark.parametrize(
    ("shape_q", "kwargs", "word"),
    [
        ((1, 2, 1, 32), {}, "decode"),  # FIA doc l.429: no int8 Q/K/V at Q_S = 1
        ((1, 2, 4, 40), {}, "head dim 40"),  # FIA doc l.78: 32-byte aligned int8 D
        ((1, 2, 4, 32), {"dropout_p": 0.1}, "dropout"),
    ],
)
def test_calls_the_op_refuses_are_named(shape_q: tuple[int, ...], kwargs: dict, word: str) -> None:
    q = torch.zeros(shape_q)
    k = v = torch.zeros(1, 2, 4, shape_q[-1])
    call = read_call((q, k, v), kwargs)
    assert call.problem is not None and word in call.problem
    with pytest.raises(ConfigError, match="cannot run"):
        int8_sdpa(call, torch.ones(3), k_mean=False)


def test_a_mask_that_differs_between_heads_is_refused() -> None:
    q = k = v = torch.zeros(1, 2, 3, 32)
    mask = torch.ones(1, 2, 3, 3, dtype=torch.bool)
    mask[0, 1, 0, 0] = False
    assert "heads" in str(read_call((q, k, v), {"attn_mask": mask}).problem)


# ----------------------------------------------------------------------------- quantize()


def test_quantize_converts_attention_in_place_and_keeps_every_float_name() -> None:
    model, data = _model_and_data()
    keys = set(model.state_dict())
    ref = [model(x, c) for x, c in data]
    quantize(model, {"attn": "a8", "cross": Precision.A8}, _loop(data))
    assert isinstance(model.attn, Attention) and isinstance(model.attn, QuantizedAttention)
    assert type(model.attn).__name__ == "Int8Attention"
    assert set(model.state_dict()) == keys | {"attn.attn_scales", "cross.attn_scales"}
    # the self-attention's query range is the calibration's: amax of to_q's outputs / 127
    amax = max(model.attn.to_q(x).abs().amax().item() for x, _ in data)
    assert model.attn.attn_scales[0, 0].item() == pytest.approx(amax / 127, rel=1e-6)
    for (x, c), r in zip(data, ref, strict=True):
        assert _sqnr_db(model(x, c), r) > 30.0


def test_an_a8_rule_applies_to_attention_modules_only() -> None:
    model, data = _model_and_data()
    quantize(model, {"attn": "a8", "*": "w8a8"}, _loop(data))
    assert isinstance(model.attn, QuantizedAttention)
    assert not isinstance(model.cross, QuantizedAttention)  # taken by "*": its Linears only
    assert type(model.cross.to_q).__name__ == "QuantLinear"
    with pytest.raises(ConfigError, match="matches no attention module"):
        quantize(_model_and_data()[0], {"*to_q": "a8"}, _loop(data))
    with pytest.raises(ConfigError, match="not an attention module"):

        class Policy:
            def module_specs(self, model: nn.Module) -> dict[str, str]:
                return {"attn.to_q": "a8"}

        quantize(_model_and_data()[0], Policy(), _loop(data))


def test_attention_is_listed_once_by_what_it_has() -> None:
    model, _ = _model_and_data()
    assert list(attention_modules(model)) == ["attn", "cross"]


def test_per_step_scales_follow_the_clock() -> None:
    model, data = _model_and_data()

    def loop(m: nn.Module) -> None:
        for step, gain in ((0, 1.0), (1, 1.0), (2, 8.0)):
            with at_step(step):
                for x, c in data:
                    m(x * gain, c)

    spec = QuantSpec(Precision.A8, timestep_bounds=(0, 2))
    quantize(model, {"attn": spec}, loop)
    s = model.attn.attn_scales
    assert s.shape == (2, 3)
    assert s[1, 0] > 4 * s[0, 0]  # the late steps' larger query range has its own scale


def test_an_attention_that_never_reaches_sdpa_is_refused_or_left_float(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, data = _model_and_data()
    with pytest.raises(CalibrationError, match="never called scaled_dot_product_attention"):
        quantize(model, {"attn": "a8", "cross": "a8"}, lambda m: m.attn(data[0][0]))
    model, data = _model_and_data()
    with caplog.at_level(logging.WARNING):
        quantize(model, {"*": "a8"}, lambda m: m.attn(data[0][0]))
    assert isinstance(model.attn, QuantizedAttention)
    assert type(model.cross) is Attention and not hasattr(model.cross, "attn_scales")
    assert "cross (" in caplog.text and "never called" in caplog.text


def test_specs_an_engine_cannot_run_or_a8_cannot_take_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"mindie-sd has no int8 attention: MindIE-SD 3\.1\.0"):
        QuantSpec(Precision.A8, engine="mindie-sd")
    with pytest.raises(ConfigError, match="without SmoothQuant"):
        QuantSpec(Precision.A8, smoothquant_alpha=0.5)
    with pytest.raises(ConfigError, match="a8 only"):
        QuantSpec(Precision.W8A8, k_mean=True)
    assert "k_mean" not in QuantSpec(Precision.A8).to_dict()  # earlier files keep their bytes
    spec = QuantSpec(Precision.A8, k_mean=True, timestep_bounds=(0, 3))
    assert QuantSpec.from_dict(spec.to_dict()) == spec


# ----------------------------------------------------------------------------- Whisper


def _tiny_whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=64, num_mel_bins=8, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=32, max_target_positions=16,
        decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    return WhisperForConditionalGeneration(config).eval()


def test_whisper_encoder_attention_runs_in_int8_and_decode_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _tiny_whisper()
    feats = [torch.randn(2, 8, 64) for _ in range(2)]
    names = list(attention_modules(model))
    assert "model.encoder.layers.0.self_attn" in names
    assert "model.decoder.layers.0.encoder_attn" in names
    ref = [model.model.encoder(f).last_hidden_state for f in feats]

    def loop(m: nn.Module) -> None:
        for f in feats:
            m.generate(f, max_new_tokens=4, do_sample=False)

    with pytest.raises(CalibrationError, match="decode"):
        quantize(_tiny_whisper(), {"model.decoder.layers.0.self_attn": "a8"}, loop)
    with caplog.at_level(logging.WARNING):
        quantize(model, {"*_attn": "a8"}, loop)
    assert isinstance(model.model.encoder.layers[0].self_attn, QuantizedAttention)
    assert not isinstance(model.model.decoder.layers[0].self_attn, QuantizedAttention)
    assert "decode" in caplog.text
    for f, r in zip(feats, ref, strict=True):
        assert _sqnr_db(model.model.encoder(f).last_hidden_state, r) > 25.0


# ----------------------------------------------------------------------------- checkpoints


def test_a_checkpoint_round_trip_gives_the_same_outputs(tmp_path) -> None:
    model, data = _model_and_data()
    spec = QuantSpec(Precision.A8, k_mean=True)
    quantize(model, {"attn": spec, "cross": "a8", "*": "w8a8"}, _loop(data))
    want = [model(x, c) for x, c in data]
    save_quantized(model, tmp_path / "q")
    desc = read_description(tmp_path / "q")
    assert desc["attention"]["attn"] == {
        "type": "Attention",
        "precision": "a8",
        "spec": spec.to_dict(),
    }
    fresh, _ = _model_and_data()
    load_quantized(fresh, tmp_path / "q")
    assert isinstance(fresh.attn, QuantizedAttention) and fresh.attn.attn_spec == spec
    for (x, c), w in zip(data, want, strict=True):
        assert torch.equal(fresh(x, c), w)
    save_quantized(fresh, tmp_path / "again")
    for f in ("model.safetensors", "description.json"):
        assert (tmp_path / "q" / f).read_bytes() == (tmp_path / "again" / f).read_bytes()


def test_a_checkpoint_without_attention_has_no_attention_key(tmp_path) -> None:
    model, data = _model_and_data()
    quantize(model, {"*": "w8a8"}, _loop(data))
    save_quantized(model, tmp_path / "q")
    assert "attention" not in read_description(tmp_path / "q")


def test_a_checkpoint_attention_on_another_module_is_refused(tmp_path) -> None:
    model, data = _model_and_data()
    quantize(model, {"attn": "a8"}, _loop(data))
    save_quantized(model, tmp_path / "q")
    other = nn.Module()
    other.attn = nn.Linear(4, 4)
    with pytest.raises(CheckpointError, match="no attention module"):
        load_quantized(other, tmp_path / "q")


def test_a_description_whose_attention_entry_lacks_a_key_is_refused(tmp_path) -> None:
    import json

    model, data = _model_and_data()
    quantize(model, {"attn": "a8"}, _loop(data))
    save_quantized(model, tmp_path / "q")
    path = tmp_path / "q" / "description.json"
    desc = json.loads(path.read_text())
    del desc["attention"]["attn"]["spec"]
    path.write_text(json.dumps(desc))
    with pytest.raises(CheckpointError, match="attention 'attn' lacks spec"):
        read_description(tmp_path / "q")


# ----------------------------------------------------------------------------- per-head scales


def test_per_head_scales_are_each_heads_maxima_and_one_op_call_per_kv_head() -> None:
    torch.manual_seed(5)
    # GQA: 4 query heads over 2 key/value heads; head 1's values 10x larger
    q = torch.randn(2, 4, 6, 32)
    k, v = torch.randn(2, 2, 6, 32), torch.randn(2, 2, 6, 32)
    v[:, 1] *= 10.0
    call = read_call((q, k, v), {"enable_gqa": True})
    ranges = call_ranges(call, k_mean=False, per_head=True)
    # by hand: the query's maxima over each key/value head's two query heads
    want_q = torch.stack([q[:, 0:2].abs().amax(), q[:, 2:4].abs().amax()])
    assert torch.equal(ranges[0], want_q)
    assert torch.equal(ranges[2], torch.stack([v[:, 0].abs().amax(), v[:, 1].abs().amax()]))
    # the per-tensor maxima are the per-head ones' maximum
    assert torch.equal(ranges.amax(dim=-1), call_ranges(call, k_mean=False))
    scales = scales_of(ranges)
    got = int8_sdpa(call, scales, k_mean=False)
    # each key/value head by itself through the per-tensor path, with its own scales
    parts = [
        int8_sdpa(read_call((q[:, 2 * g : 2 * g + 2], k[:, g : g + 1], v[:, g : g + 1]),
                            {"enable_gqa": True}), scales[:, g], k_mean=False)
        for g in range(2)
    ]  # fmt: skip
    assert torch.equal(got, torch.cat(parts, dim=1))
    # head 0's values no longer share head 1's 10x step: closer to float there
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    tensor = int8_sdpa(call, scales_of(call_ranges(call, k_mean=False)), k_mean=False)
    assert _sqnr_db(got[:, :2], ref[:, :2]) > _sqnr_db(tensor[:, :2], ref[:, :2]) + 6
    with pytest.raises(ConfigError, match="3 per-head scales for 2 key/value heads"):
        int8_sdpa(call, torch.ones(3, 3), k_mean=False)


def test_a_per_head_module_sizes_its_scales_from_its_calls_and_round_trips(tmp_path) -> None:
    model, data = _model_and_data()
    spec = QuantSpec(Precision.A8, per_head=True)
    quantize(model, {"attn": spec, "cross": "a8"}, _loop(data))
    assert model.attn.attn_scales.shape == (1, 3, 2)  # two heads
    assert model.cross.attn_scales.shape == (1, 3)
    want = [model(x, c) for x, c in data]
    save_quantized(model, tmp_path / "q")
    assert read_description(tmp_path / "q")["attention"]["attn"]["spec"]["per_head"] is True
    fresh, _ = _model_and_data()
    load_quantized(fresh, tmp_path / "q")
    assert fresh.attn.attn_spec == spec
    for (x, c), w in zip(data, want, strict=True):
        assert torch.equal(fresh(x, c), w)
    with pytest.raises(ConfigError, match=r"expected \(groups, 3, heads\)"):
        frozen_attention(_model_and_data()[0].attn, spec, "attn", torch.ones(1, 3))
    with pytest.raises(ConfigError, match="per_head scales an attention's heads: a8 only"):
        QuantSpec(Precision.W8A8, per_head=True)
