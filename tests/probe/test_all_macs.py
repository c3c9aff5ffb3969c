"""The MACs outside Linear/Conv2d, per modality (issue 46: coverage over all MACs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from opsnn_quant.probe.all_macs import COUNTED, OtherMacs, call_macs, paused
from opsnn_quant.probe.hooks import rerunning
from opsnn_quant.types import Modality


def test_macs_of_each_kind_of_call_by_hand():
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 6)
    out = F.scaled_dot_product_attention(q, k, v)
    # 2*4 heads of (5x8 @ 8x7 scores) + (5x7 @ 7x6 values): 8 * 5 * 7 * (8 + 6)
    assert call_macs("scaled_dot_product_attention", (q, k, v), {}, out) == 3920
    kw = {"query": q, "key": k, "value": v}
    assert call_macs("scaled_dot_product_attention", (), kw, out) == 3920
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    assert call_macs("matmul", (a, b), {}, a @ b) == 3 * 5 * 4
    x, y = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    assert call_macs("bmm", (x, y), {}, torch.bmm(x, y)) == 120
    bias = torch.zeros(2, 3, 5)
    assert call_macs("baddbmm", (bias, x, y), {}, torch.baddbmm(bias, x, y)) == 120
    assert call_macs("__rmatmul__", (b, a), {}, a @ b) == 60  # b.__rmatmul__(a) is a @ b
    sig, w = torch.randn(1, 80, 30), torch.randn(16, 80, 3)
    # out (1, 16, 30): each output sums 80 channels x 3 taps
    assert call_macs("conv1d", (sig, w), {}, F.conv1d(sig, w, padding=1)) == 480 * 240
    grouped = torch.randn(20, 8, 3)  # 10 groups: each output sums its group's 8 channels
    assert call_macs("conv1d", (sig, grouped), {}, F.conv1d(sig, grouped, groups=10)) == (
        20 * 28 * 8 * 3
    )
    t, wt = torch.randn(1, 4, 10), torch.randn(4, 6, 3)
    # each input element spreads over 6 output channels x 3 taps
    assert call_macs("conv_transpose1d", (t, wt), {}, F.conv_transpose1d(t, wt)) == 40 * 18
    assert call_macs("add", (a, a), {}, a + a) == 0


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)  # a Linear: the module hooks count it, not this
        self.conv = nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, L, 8)
        h = self.proj(x)
        att = F.scaled_dot_product_attention(h[:, None], h[:, None], h[:, None])[:, 0]
        return self.conv(att.transpose(1, 2)).transpose(1, 2)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Block()
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.encoder(x)
        return self.head(e) @ e.transpose(1, 2)  # (B, L, L): the outer root's own product


def test_calls_are_put_in_the_innermost_root_and_the_probes_own_work_is_not_counted():
    model = Model()
    named = dict(model.named_modules())
    roots = {"": Modality.TEXT_DECODER, "encoder": Modality.AUDIO_ENCODER}
    counter = OtherMacs(roots, named)

    def statistics(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.transpose(-1, -2) @ out  # the probe's own product (e.g. GPTQ's moments)

    hook = model.encoder.proj.register_forward_hook(paused(statistics))
    x = torch.randn(2, 5, 8)
    try:
        with counter.counting():
            model(x)
            with rerunning():  # an fp16 re-run is not the model's forward
                model.encoder(x)
            model.encoder.proj(x)  # outside every root: the hook's product is paused anyway
    finally:
        hook.remove()
    attention = 2 * 5 * 5 * (8 + 8)  # B=2, one head, L=S=5, E=Ev=8
    conv = 2 * 8 * 5 * (8 * 3)
    assert counter.macs == {
        Modality.AUDIO_ENCODER: attention + conv,
        Modality.TEXT_DECODER: 2 * 5 * 5 * 8,  # (5x8 @ 8x5) per sample
    }
    assert counter.unplaced == 0
    assert not model.encoder._forward_pre_hooks and not model._forward_hooks  # removed


def test_the_probe_counts_whispers_convolutions_and_attention_products(tmp_path):
    # The tiny random Whisper of the tests: d_model 16, one encoder layer, 80 mel bins x 3000
    # frames. Per utterance, outside its Linears: conv1 (16 x 3000 outputs of 80 x 3 taps),
    # conv2 (stride 2: 16 x 1500 outputs of 16 x 3 taps), and self-attention's scores and
    # values over 1500 frames (1500 x 1500 x (16 + 16), all heads together).
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.probe.api import probe
    from opsnn_quant.probe.config import ProbeConfig
    from tests.tiny_pipelines import save_tiny_whisper

    path = save_tiny_whisper(tmp_path / "whisper")
    adapter = load_adapter("whisper", str(path), batch_size=2, max_new_tokens=4)
    records = load_records("zoo:speech/calibration", 3)
    cfg = ProbeConfig(fp16=False, attribution=False)  # pass 1 is what counts the MACs
    report = probe(adapter, adapter.forward_loop(records), cfg)
    per_utterance = 16 * 3000 * 80 * 3 + 16 * 1500 * 16 * 3 + 1500 * 1500 * 32
    encoder = report.modalities["audio_encoder"]
    assert encoder.other_macs == 3 * per_utterance
    # its Linears: q, k, v, out (16 x 16 each), fc1 (16 -> 32) and fc2 (32 -> 16), 1500 frames
    assert encoder.pass_macs == 3 * 1500 * (4 * 16 * 16 + 2 * 16 * 32)
    assert encoder.macs == encoder.pass_macs // 2  # per call: batches of 2 and 1 utterances
    assert encoder.linear_share == encoder.pass_macs / (encoder.pass_macs + 3 * per_utterance)
    assert 0.03 < encoder.linear_share < 0.04  # the convolutions and attention dwarf d_model 16
    decoder = report.modalities["text_decoder"]
    assert decoder.other_macs is not None and decoder.other_macs > 0  # its attention


def test_every_spelling_of_a_product_counts_once_and_torch_is_left_as_it_was():
    # ``b.__rmatmul__(a)`` calls ``torch.matmul`` inside: one product, not two; a method, an
    # operator and a function are each one call; the wrapped functions are restored after.
    before = {(id(o), a): o.__dict__.get(a) if isinstance(o, type) else getattr(o, a)
              for o, a, _ in COUNTED}  # fmt: skip
    a, b = torch.randn(3, 4), torch.randn(4, 5)

    class Products(nn.Identity):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            (a @ b, b.__rmatmul__(a), a.matmul(b), torch.mm(a, b), F.conv1d(x, torch.ones(2, 1, 3)))
            return x

    model = Products()
    counter = OtherMacs({"": Modality.DENOISER}, {"": model})
    with counter.counting():
        model(torch.ones(1, 1, 7))
    assert counter.macs == {Modality.DENOISER: 4 * (3 * 5 * 4) + 2 * 5 * 3}
    after = {(id(o), a): o.__dict__.get(a) if isinstance(o, type) else getattr(o, a)
             for o, a, _ in COUNTED}  # fmt: skip
    assert after == before and "__matmul__" not in torch.Tensor.__dict__
