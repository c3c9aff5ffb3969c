"""QuantLinear / QuantConv2d outputs against an independent numpy int64 computation."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.modules import QuantConv2d, QuantLinear
from opsnn_quant.quant.spec import QuantSpec
from tests.tiny_models import TinyConvBlock, TinyMLP, forward_loop_for


def fp19_np(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def calibrated_linear(spec, seed=0, batches=3):
    torch.manual_seed(seed)
    lin = nn.Linear(48, 24)
    calib = [torch.randn(5, 48) * (1 + i) for i in range(batches)]
    model = nn.Sequential(lin)
    quantize(model, {"0": spec}, lambda m: [m(x) for x in calib])
    return lin, model[0], calib


def test_static_w8a8_matches_numpy_integer_pipeline():
    lin, q, calib = calibrated_linear("w8a8")
    w = lin.weight.detach().numpy().astype(np.float32)
    b = lin.bias.detach().numpy().astype(np.float32)
    # Calibration formulas, recomputed: activation absmax / 127; weight row absmax / 127.
    absmax = max(float(x.abs().max()) for x in calib)
    assert float(q.input_quantizer.scale) == pytest.approx(absmax / 127, rel=1e-6)
    s_w = np.abs(w).max(axis=1) / np.float32(127)
    np.testing.assert_allclose(q.weight_quantizer.scale.numpy(), s_w, rtol=1e-6)
    w_q = np.clip(np.rint(w / s_w[:, None]), -128, 127).astype(np.int64)
    assert np.array_equal(q.weight.numpy().astype(np.int64), w_q)

    x = torch.randn(7, 48).numpy().astype(np.float32)
    inv = np.float32(q.input_quantizer.inv_scale.numpy()[0])
    x_q = np.clip(np.rint(x * inv), -128, 127).astype(np.int64)
    deq = (np.float64(q.input_quantizer.scale.item()) * s_w.astype(np.float64)).astype(np.float32)
    bias_i = np.rint(b.astype(np.float64) / deq.astype(np.float64)).astype(np.int64)
    acc = x_q @ w_q.T + bias_i
    want = (acc.astype(np.float32) * fp19_np(deq)).astype(np.float16)
    got = q(torch.from_numpy(x))
    assert got.dtype == torch.float32
    assert np.array_equal(got.numpy().astype(np.float16), want)
    assert np.array_equal(got.numpy(), want.astype(np.float32))


def test_asymmetric_w8a8_folds_offset_into_bias():
    spec = QuantSpec("w8a8", activation_symmetric=False)
    torch.manual_seed(1)
    lin = nn.Linear(16, 8)
    calib = [torch.rand(6, 16) * 3.0]  # all-positive activations, as after a ReLU/GELU
    model = nn.Sequential(lin)
    quantize(model, {"0": spec}, lambda m: [m(x) for x in calib])
    q = model[0]
    scale, offset = float(q.input_quantizer.scale), float(q.input_quantizer.offset)
    lo, hi = 0.0, float(calib[0].max())
    assert scale == pytest.approx((hi - lo) / 255, rel=1e-6)
    assert offset == -128.0
    w_q = q.weight.numpy().astype(np.int64)
    s_w = q.weight_quantizer.scale.numpy()
    deq = (np.float64(scale) * s_w.astype(np.float64)).astype(np.float32)
    b = lin.bias.detach().numpy().astype(np.float64)
    want_bias = np.rint(b / deq.astype(np.float64)) - offset * w_q.sum(axis=1)
    assert np.array_equal(q.quant_bias.numpy().astype(np.int64), want_bias.astype(np.int64))
    x = torch.rand(4, 16).numpy() * 3
    x_q = np.clip(np.rint(x * np.float32(1 / scale) + np.float32(offset)), -128, 127).astype(
        np.int64
    )
    acc = x_q @ w_q.T + want_bias.astype(np.int64)
    want = (acc.astype(np.float32) * fp19_np(deq)).astype(np.float16).astype(np.float32)
    assert np.array_equal(q(torch.from_numpy(x)).numpy(), want)
    ref = lin(torch.from_numpy(x)).detach().numpy()
    assert np.abs(want - ref).max() < 0.05 * np.abs(ref).max()


def test_dynamic_w8a8_uses_per_token_formula():
    lin, q, _ = calibrated_linear("w8a8_dynamic")
    x = (torch.randn(6, 48) * torch.tensor([[0.1], [1], [10], [0.5], [3], [100.0]])).numpy()
    # A2 DynamicQuant kernel order (ops-nn quant/dynamic_quant/op_kernel/dynamic_quant_multi_row.h):
    # inv = 127 / rowmax, q = rint(x * inv), scale = rowmax * fp32(1/127), all in fp32.
    rowmax = np.abs(x).max(axis=1).astype(np.float32)
    s_t = rowmax * (np.float32(1) / np.float32(127))
    x_q = np.clip(np.rint(x * (np.float32(127) / rowmax)[:, None]), -128, 127).astype(np.int64)
    w_q = q.weight.numpy().astype(np.int64)
    s_w = q.weight_quantizer.scale.numpy()
    acc = (x_q @ w_q.T).astype(np.float32)
    y = (acc * s_w[None, :]) * s_t[:, None] + lin.bias.detach().numpy()
    want = y.astype(np.float16).astype(np.float32)
    assert np.array_equal(q(torch.from_numpy(x)).numpy(), want)


def test_w8a16_dequantizes_weights():
    lin, q, _ = calibrated_linear("w8a16")
    x = torch.randn(3, 48)
    w = q.weight.float() * q.weight_quantizer.scale[:, None]
    assert torch.allclose(q(x), x @ w.T + lin.bias, atol=1e-5)


def test_static_and_dynamic_choose_different_arithmetic():
    torch.manual_seed(0)
    lin = nn.Linear(48, 24, bias=False)
    calib = [torch.randn(8, 48)]
    qs = quantize(nn.Sequential(copy.deepcopy(lin)), {"0": "w8a8"}, lambda m: m(calib[0]))[0]
    qd = quantize(nn.Sequential(copy.deepcopy(lin)), {"0": "w8a8_dynamic"}, None)[0]
    assert hasattr(qs, "deq_scale_packed") and not hasattr(qd, "deq_scale_packed")
    x = torch.randn(2, 48)
    x[0] *= 1e-3  # a tiny row: per-token scaling keeps it, the per-tensor scale rounds it to 0
    ref = lin(x).detach()
    assert torch.equal(qs(x)[0], torch.zeros(24))
    rel_d = float((qd(x)[0] - ref[0]).norm() / ref[0].norm())
    assert rel_d < 0.05


def test_quant_conv2d_equals_im2col_reference():
    model = TinyConvBlock()
    float_model = copy.deepcopy(model)
    quantize(model, {"conv1": "w8a8", "conv2": "w8a8"}, forward_loop_for(model))
    assert isinstance(model.conv1, QuantConv2d)
    (x,) = model.example_inputs(seed=9)
    q = model.conv1
    cols = F.unfold(x, 3, padding=1).transpose(1, 2).reshape(-1, 4 * 9).numpy()
    x_q = np.clip(np.rint(cols * np.float32(q.input_quantizer.inv_scale.item())), -128, 127).astype(
        np.int64
    )
    w_q = q.weight.reshape(32, -1).numpy().astype(np.int64)
    acc = x_q @ w_q.T + q.quant_bias.numpy().astype(np.int64)
    want = (
        (acc.astype(np.float32) * fp19_np(q.deq_scale.numpy()))
        .astype(np.float16)
        .astype(np.float32)
    )
    want = want.reshape(2, 64, 32).transpose(0, 2, 1).reshape(2, 32, 8, 8)
    assert np.array_equal(q(x).numpy(), want)
    ref = float_model(x).detach()
    out = model(x)
    assert float((out - ref).pow(2).mean() / ref.pow(2).mean()) < 1e-2


def test_smoothquant_is_folded_into_the_quantize_scale_vector():
    model = TinyMLP()
    quantize(
        model,
        {"fc1": QuantSpec("w8a8", smoothquant_alpha=0.5), "fc2": "w8a8"},
        forward_loop_for(model),
    )
    iq = model.fc1.input_quantizer
    assert iq.inv_scale.shape == (64,)
    want = 1.0 / (iq.scale.double() * iq.smooth.double())
    assert torch.allclose(iq.inv_scale.double(), want, rtol=1e-6)


def test_from_float_keeps_float_module_untouched():
    lin = nn.Linear(8, 4)
    w = lin.weight.detach().clone()
    q = QuantLinear.from_float(lin, QuantSpec("w8a16"), "x")
    q.freeze()
    assert torch.equal(lin.weight, w)
    assert q.weight.dtype == torch.int8


def test_from_float_shares_the_float_weight_until_freeze_replaces_it():
    # quantize() of a whole UNet held a second float copy while every module was swapped
    lin = nn.Linear(8, 4)
    q = QuantLinear.from_float(lin, QuantSpec("w8a8_dynamic"), "x")
    assert q.weight.data_ptr() == lin.weight.data_ptr()
    q.freeze()
    assert q.weight.dtype == torch.int8 and lin.weight.dtype == torch.float32


@pytest.mark.parametrize("spec", ["w8a8", "w8a8_dynamic"])
def test_only_few_row_calls_keep_an_fp32_weight_copy_and_results_are_the_same(spec, fp32_int8_gemm):
    # The copy speeds up a decoder's per-token calls on fp32 GEMMs; a model run on big calls
    # (an encoder, a UNet) must not grow a float copy of its quantized weights.
    _, q, _ = calibrated_linear(spec)
    x = torch.randn(300, 48) * 3
    big = q(x)
    assert q.weight_cache_bytes == 0
    small = torch.cat([q(x[i : i + 4]) for i in range(0, 300, 4)])
    assert q.weight_cache_bytes == 48 * q.out_n * 4  # fp32 (K, N)
    assert torch.equal(big, small)  # exact products: the copy changes speed only


@pytest.mark.parametrize("spec", ["w8a8", "w8a8_dynamic"])
def test_a_native_int8_gemm_keeps_no_weight_copy_and_gives_the_fp32_path_results(spec, monkeypatch):
    import opsnn_quant.ascend.matmul as matmul
    from opsnn_quant.ascend.gemm_path import ENV

    _, q, _ = calibrated_linear(spec)
    x = torch.randn(300, 48) * 3

    def use_native(native: bool) -> None:
        # Both the kernel's exactness and the race decide the path: force the path, so the
        # test means the same on a VNNI machine (the race picks native) and an AVX2 one.
        monkeypatch.setattr(matmul, "int8_gemm_is_exact", lambda: native)
        monkeypatch.setenv(ENV, "native" if native else "fp32-chunk")

    # a stand-in for an exact native GEMM wherever this runs: int64 products, cast to int32
    calls = []

    def int_mm(a, b):
        calls.append(a.shape)
        return (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)

    monkeypatch.setattr(torch, "_int_mm", int_mm)
    use_native(True)
    native = torch.cat([q(x[i : i + 4]) for i in range(0, 300, 4)])
    assert len(calls) == 75 and q.weight_cache_bytes == 0
    use_native(False)
    fp32_path = torch.cat([q(x[i : i + 4]) for i in range(0, 300, 4)])
    assert len(calls) == 75 and q.weight_cache_bytes > 0
    assert torch.equal(native, fp32_path)


def test_no_weight_copies_holds_off_the_copy_and_restores_the_setting(fp32_int8_gemm):
    from opsnn_quant.quant.modules import no_weight_copies

    _, q, _ = calibrated_linear("w8a8")
    holder = nn.Sequential(q)
    x = torch.randn(4, 48)
    with no_weight_copies(holder):
        inside = q(x)
        assert q.weight_cache_bytes == 0
    assert q.cache_weight_float
    assert torch.equal(q(x), inside) and q.weight_cache_bytes > 0


@pytest.mark.parametrize("spec", ["w8a8", "w8a8_dynamic", QuantSpec("w8a8", smoothquant_alpha=0.5)])
def test_reference_row_chunks_are_bit_identical(spec, monkeypatch):
    import opsnn_quant.quant.qmodule as modules

    _, q, _ = calibrated_linear(spec)
    x = torch.randn(1000, 48) * 3
    whole = q(x)
    # 256 rows is the floor of a chunk: 1000 rows -> 4 chunks, the last one short.
    monkeypatch.setattr(modules, "ROW_CHUNK_ELEMENTS", 1)
    calls = []
    orig = modules.QuantModule._quant_rows
    monkeypatch.setattr(
        modules.QuantModule,
        "_quant_rows",
        lambda self, rows, backend: calls.append(rows.shape[0]) or orig(self, rows, backend),
    )
    chunked = q(x)
    assert calls == [256, 256, 256, 232]
    assert torch.equal(whole, chunked)


@pytest.mark.parametrize("output_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_a_quantized_conv_from_its_int8_map_equals_its_im2col_rows(symmetric, output_dtype):
    # The reference backend convolves the quantized feature map directly; the im2col rows
    # through npu_quant_matmul are the independent expectation (the padding is the quantized
    # zero in both: the offset of an asymmetric input).
    from opsnn_quant.types import Precision

    torch.manual_seed(0)
    conv = nn.Conv2d(150, 12, 3, stride=2, padding=1)  # K = 1350: two channel blocks
    x = torch.randn(2, 150, 9, 10) * 2 + (0.0 if symmetric else 1.0)
    spec = QuantSpec(Precision.W8A8, activation_symmetric=symmetric, output_dtype=output_dtype)
    q = QuantConv2d.from_float(conv, spec, "c")
    q(x)
    q.freeze()
    direct = q(x)
    rows = q._direct_rows(x)
    assert rows is not None
    cols = F.unfold(x, q.kernel_size, q.dilation, q.padding, q.stride)
    via_rows = q.matmul_rows(cols.transpose(1, 2).reshape(-1, q.in_k))
    assert torch.equal(rows, via_rows)
    assert torch.equal(direct, via_rows.reshape(2, -1, 12).transpose(1, 2).reshape(direct.shape))


@pytest.mark.parametrize("spec", ["w8a8", "w8a8_dynamic"])
def test_freeze_with_a_siblings_int8_weight_equals_its_own(spec):
    # The probe shares one int8 weight between candidates of the same (un)smoothed weight
    # (LocalProbe.shadow): freezing with it must give exactly the buffers of a module that
    # quantized its own weight (int8 weight, scales, folded int32 bias, packed deq scale).
    torch.manual_seed(0)
    lin = nn.Linear(48, 24)
    calib = [torch.randn(5, 48) * (1 + i) for i in range(3)]
    own, shared = (QuantLinear.from_float(lin, QuantSpec.coerce(spec)) for _ in range(2))
    for q in (own, shared):
        for x in calib:
            q(x)
    own.freeze()
    shared.freeze((own.weight.clone(), own.weight_quantizer.scale.clone()))
    own_state, shared_state = own.state_dict(), shared.state_dict()
    assert own_state.keys() == shared_state.keys()
    for key, value in own_state.items():
        assert torch.equal(value, shared_state[key]), key
    x = torch.randn(7, 48)
    assert torch.equal(own(x), shared(x))
