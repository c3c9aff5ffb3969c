"""Backend dispatch: one decision point, and the torch_npu call sequence (with a stand-in).

torch_npu cannot be installed here. ``FakeTorchNpu`` is a stand-in module that records every call
and computes with our reference functions, so the test checks which torch_npu functions a
quantized module calls, with which argument dtypes; it does not check the NPU's own results.
"""

import sys
import types

import pytest
import torch

from opsnn_quant import ascend
from opsnn_quant.backends import NpuBackend, ReferenceBackend, get_backend
from opsnn_quant.quant.api import quantize
from opsnn_quant.quant.spec import QuantSpec
from tests.tiny_models import TinyMLP, forward_loop_for


class FakeTorchNpu(types.ModuleType):
    """Stand-in for torch_npu: records calls, computes with the reference."""

    def __init__(self):
        super().__init__("torch_npu")
        self.calls = []

    def npu_quantize(self, x, scales, zero_points, dtype, axis=1, div_mode=True):
        self.calls.append(("npu_quantize", x.dtype, scales.dtype, dtype, axis, div_mode))
        return ascend.npu_quantize(x, scales, zero_points, dtype, axis, div_mode)

    def npu_dynamic_quant(self, x, *, smooth_scales=None):
        self.calls.append(
            ("npu_dynamic_quant", x.dtype, None if smooth_scales is None else smooth_scales.dtype)
        )
        return ascend.npu_dynamic_quant(x, smooth_scales=smooth_scales)

    def npu_quant_matmul(
        self, x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None
    ):
        self.calls.append(
            (
                "npu_quant_matmul",
                scale.dtype,
                pertoken_scale is not None,
                None if bias is None else bias.dtype,
                output_dtype,
            )
        )
        return ascend.npu_quant_matmul(
            x1,
            x2,
            scale,
            offset=offset,
            pertoken_scale=pertoken_scale,
            bias=bias,
            output_dtype=output_dtype,
        )

    def npu_weight_quant_batchmatmul(
        self, x, weight, antiquant_scale, antiquant_offset=None, bias=None, antiquant_group_size=0
    ):
        # torch_npu's documented keywords (op-plugin npu_weight_quant_batchmatmul.md)
        self.calls.append(
            ("npu_weight_quant_batchmatmul", x.dtype, antiquant_scale.dtype, tuple(weight.shape),
             weight.dtype, antiquant_group_size)
        )  # fmt: skip
        return ascend.npu_weight_quant_batchmatmul(
            x, weight, antiquant_scale, antiquant_offset, bias=bias,
            antiquant_group_size=antiquant_group_size,
        )  # fmt: skip

    def npu_fused_infer_attention_score(self, query, key, value, **kwargs):
        self.calls.append(
            ("npu_fused_infer_attention_score", query.dtype, kwargs["dequant_scale1"].dtype,
             kwargs["quant_scale1"].dtype, kwargs["dequant_scale2"].dtype, kwargs["input_layout"])
        )  # fmt: skip
        return ascend.npu_fused_infer_attention_score(query, key, value, **kwargs)


def test_get_backend_is_the_single_decision_point():
    assert isinstance(get_backend(torch.device("cpu")), ReferenceBackend)
    assert isinstance(get_backend("cuda:0"), ReferenceBackend)
    assert isinstance(get_backend("npu:1"), NpuBackend)
    assert isinstance(get_backend("npu"), NpuBackend)


def test_importing_the_package_never_imports_torch_npu():
    assert "torch_npu" not in sys.modules or isinstance(sys.modules["torch_npu"], FakeTorchNpu)


@pytest.fixture
def fake_npu(monkeypatch):
    fake = FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    # Route CPU tensors to the NPU backend: the stand-in plays the device.
    # (the row matmuls look the backend up in qmodule, QuantConv2d's direct path in modules)
    for where in ("opsnn_quant.quant.qmodule", "opsnn_quant.quant.modules"):
        monkeypatch.setattr(f"{where}.get_backend", lambda device: NpuBackend())
    return fake


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            QuantSpec("w8a8"),
            [
                ("npu_quantize", torch.float16, torch.float16, torch.qint8, -1, False),
                ("npu_quant_matmul", torch.int64, False, torch.int32, torch.float16),
            ],
        ),
        (
            QuantSpec("w8a8", output_dtype="bfloat16"),
            [
                ("npu_quantize", torch.float16, torch.float16, torch.qint8, -1, False),
                ("npu_quant_matmul", torch.float32, False, torch.int32, torch.bfloat16),
            ],
        ),
        (
            QuantSpec("w8a8_dynamic", smoothquant_alpha=0.5),
            [
                ("npu_dynamic_quant", torch.float16, torch.float16),
                ("npu_quant_matmul", torch.float32, True, torch.float32, torch.float16),
            ],
        ),
        (
            QuantSpec("w8a16"),
            [
                (
                    "npu_weight_quant_batchmatmul",
                    torch.float16,
                    torch.float16,
                    (64, 128),
                    torch.int8,
                    0,
                )
            ],
        ),
        (
            # int4 words (K // 8, N) as a transposed view, scales per group of 32 input channels
            QuantSpec("w4a16", group_size=32),
            [
                (
                    "npu_weight_quant_batchmatmul",
                    torch.float16,
                    torch.float16,
                    (8, 128),
                    torch.int32,
                    32,
                )
            ],
        ),
    ],
)
def test_npu_path_calls_torch_npu_with_documented_dtypes(fake_npu, spec, expected):
    model = TinyMLP()
    quantize(model, {"fc1": spec}, forward_loop_for(model))
    (x,) = model.example_inputs()
    reference = model.fc1(x.half())  # the reference run is CPU math on the same module...
    fake_npu.calls.clear()
    y = model.fc1(x.half())
    assert fake_npu.calls == expected
    assert torch.equal(
        y, reference
    )  # ...and gives what the stand-in computed through torch_npu's API


def test_npu_quant_matmul_has_torch_npus_signature_and_the_cache_changes_no_bit():
    # Issue 13: a call written for torch_npu runs unchanged; the fp32 weight cache lives in
    # quant_matmul_cached, which the reference backend uses.
    import inspect

    params = list(inspect.signature(ascend.npu_quant_matmul).parameters)
    assert params == [
        "x1",
        "x2",
        "scale",
        "offset",
        "pertoken_scale",
        "bias",
        "output_dtype",
        "x1_dtype",
        "x2_dtype",
        "pertoken_scale_dtype",
        "scale_dtype",
        "group_sizes",
        "y_scale",
    ]  # fmt: skip  (op-plugin op_plugin/config/op_plugin_functions.yaml, master)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (7, 96), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (96, 40), dtype=torch.int8, generator=g)
    s = torch.rand(40, generator=g) * 1e-3
    pt = torch.rand(7, generator=g)
    want = x.to(torch.int64) @ w.to(torch.int64)
    got = ReferenceBackend().quant_matmul(
        x, w, s, pertoken_scale=pt, bias=None, output_dtype=torch.bfloat16, w_float_t=w.float()
    )
    ref = (want.to(torch.float32) * s * pt.unsqueeze(-1)).to(torch.bfloat16)  # doc formula order
    assert torch.equal(got, ref)
    assert torch.equal(
        got, ascend.npu_quant_matmul(x, w, s, pertoken_scale=pt, output_dtype=torch.bfloat16)
    )


def test_quant_attention_calls_fia_with_int8_qkv_and_float32_scales(monkeypatch):
    fake = FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-128, 128, (1, 2, 5, 32), dtype=torch.int8, generator=g)
    k = torch.randint(-128, 128, (1, 1, 7, 32), dtype=torch.int8, generator=g)
    v = torch.randint(-128, 128, (1, 1, 7, 32), dtype=torch.int8, generator=g)
    kw = dict(
        deq_scale1=torch.tensor([2e-4]), quant_scale1=torch.tensor([127.0]),
        deq_scale2=torch.tensor([3e-5]), num_heads=2, num_key_value_heads=1, scale=0.125,
        input_layout="BNSD",
    )  # fmt: skip
    got = NpuBackend().quant_attention(q, k, v, **kw)
    assert fake.calls == [
        ("npu_fused_infer_attention_score", torch.int8, torch.float32, torch.float32,
         torch.float32, "BNSD")
    ]  # fmt: skip
    want = ReferenceBackend().quant_attention(q, k, v, **kw)
    assert got.dtype == torch.float16 and torch.equal(got, want)
    assert torch.equal(
        want,
        ascend.npu_prompt_flash_attention(
            q, k, v, deq_scale1=kw["deq_scale1"], quant_scale1=kw["quant_scale1"],
            deq_scale2=kw["deq_scale2"], num_heads=2, num_key_value_heads=1, scale_value=0.125,
            input_layout="BNSD", next_tokens=2147483647,
        ),
    )  # fmt: skip
