"""The quantized-module registry: a user adds a module type without editing opsnn_quant.

The type is defined here, as a user would in their own code: a pointwise (kernel 1) Conv1d,
quantized as the same row matmul as QuantLinear, through quantize(), save_quantized and
load_quantized.
"""

import json

import pytest
import torch
from torch import nn

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.checkpoint import load_quantized, save_quantized
from opsnn_quant.quant.api import quantizable_modules, quantize
from opsnn_quant.quant.modules import (
    QuantLinear,
    QuantModule,
    quant_module_class,
    quant_module_named,
    register_quant_module,
)
from opsnn_quant.quant.spec import QuantSpec


class PointwiseConv1d(nn.Conv1d):
    """A user's float layer: Conv1d with kernel 1 (its own type, so nn.Conv1d stays float)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=1)


@register_quant_module(PointwiseConv1d)
class QuantPointwiseConv1d(QuantModule[PointwiseConv1d]):
    """(B, C, L) -> rows (B * L, C) -> the quant matmul -> (B, N, L)."""

    def __init__(self, conv: PointwiseConv1d, spec: QuantSpec, name: str = "") -> None:
        super().__init__()
        if conv.kernel_size != (1,) or conv.groups != 1:
            raise ConfigError(f"module '{name}': kernel 1, groups 1 only")
        self.weight = nn.Parameter(conv.weight.detach().clone(), requires_grad=False)
        self.bias = (
            None
            if conv.bias is None
            else nn.Parameter(conv.bias.detach().clone(), requires_grad=False)
        )
        self.init_quant(spec, conv.out_channels, conv.in_channels, name)

    @classmethod
    def from_float(
        cls, module: PointwiseConv1d, spec: QuantSpec, name: str = ""
    ) -> "QuantPointwiseConv1d":
        return cls(module, spec, name)

    def int8_weight_shape(self) -> tuple[int, ...]:
        return (self.out_n, self.in_k, 1)  # keeps Conv1d's weight layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, length = x.shape
        y = self.matmul_rows(x.transpose(1, 2).reshape(-1, c))
        return y.reshape(b, length, self.out_n).transpose(1, 2)


class PointwiseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = PointwiseConv1d(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(x).transpose(1, 2))


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 8, 5, generator=g) for _ in range(3)]


def _loop(model: nn.Module) -> None:
    for x in _batches():
        model(x)


@pytest.mark.parametrize("spec", ["w8a8", "w8a8_dynamic", QuantSpec("w8a8", smoothquant_alpha=0.5)])
def test_a_registered_user_type_is_quantized_with_the_real_arithmetic(spec):
    model = PointwiseNet().eval()
    assert list(quantizable_modules(model)) == ["proj", "head"]
    linear = nn.Linear(8, 16)  # the same weights as an nn.Linear: the same int8 arithmetic
    linear.load_state_dict(
        {"weight": model.proj.weight.detach()[:, :, 0], "bias": model.proj.bias.detach()}
    )
    reference = nn.Sequential()
    reference.add_module("proj", linear)
    quantize(model, {"*": spec}, _loop)
    quantize(reference, {"*": spec}, lambda m: [m(x.transpose(1, 2)) for x in _batches()])
    assert isinstance(model.proj, QuantPointwiseConv1d) and model.proj.frozen
    assert isinstance(model.head, QuantLinear)
    assert model.proj.weight.dtype == torch.int8 and model.proj.weight.shape == (16, 8, 1)
    x = _batches()[0]
    with torch.no_grad():
        assert torch.equal(model.proj(x).transpose(1, 2), reference.proj(x.transpose(1, 2)))


def test_a_registered_user_type_round_trips_through_a_checkpoint(tmp_path):
    model = PointwiseNet().eval()
    quantize(model, {"proj": "w8a8", "head": "w8a8_dynamic"}, _loop)
    out = save_quantized(model, tmp_path / "quant", source_model="pointwise-net")
    description = json.loads((out / "description.json").read_text())
    assert description["modules"]["proj"]["type"] == "QuantPointwiseConv1d"
    restored = load_quantized(PointwiseNet().eval(), out)
    assert isinstance(restored.proj, QuantPointwiseConv1d) and restored.proj.frozen
    x = _batches()[2]
    with torch.no_grad():
        assert torch.equal(restored(x), model(x))


def test_registry_lookups_and_misuse():
    assert quant_module_class(PointwiseConv1d) is QuantPointwiseConv1d
    assert quant_module_class(nn.Conv1d) is None  # exact types: the base class stays float
    assert quant_module_class(nn.Linear) is QuantLinear
    assert quant_module_named("QuantPointwiseConv1d") is QuantPointwiseConv1d
    assert QuantPointwiseConv1d.float_type is PointwiseConv1d
    with pytest.raises(TypeError, match="QuantModule subclasses"):
        register_quant_module(nn.Linear)(nn.Linear)  # type: ignore[type-var]
    with pytest.raises(TypeError):
        QuantModule()  # type: ignore[abstract]  # abstract: from_float is missing


def test_the_onnx_export_refuses_a_type_it_has_no_form_for(tmp_path):
    from opsnn_quant.formats.atc.onnx.export import export_onnx

    model = PointwiseNet().eval()
    quantize(model, {"*": "w8a8"}, _loop)
    with pytest.raises(ConfigError, match="'proj' is a QuantPointwiseConv1d; the QDQ export"):
        export_onnx(model, (_batches()[0],), tmp_path / "m.onnx")
