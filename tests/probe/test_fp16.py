"""fp16 overflow probe: planted overflows are all flagged and clean modules never are."""

import torch
from torch import nn

from opsnn_quant.probe.api import ProbeConfig, probe


class Planted(nn.Module):
    """Known overflows: ``big`` (Linear output > 65504) and ``ln_var`` (LayerNorm variance)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin1 = nn.Linear(16, 32)
        self.big = nn.Linear(32, 32)
        self.act = nn.GELU()
        self.ln_var = nn.LayerNorm(32)
        self.lin_out = nn.Linear(32, 8)
        with torch.no_grad():
            self.big.weight.mul_(1e5)  # outputs of order 1e5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.lin1(x))
        h = self.big(h) * 1e-4  # back to a normal range before the next module
        h = self.ln_var(h * 1e3)  # inputs ~1e3: mean of squares ~1e6 > 65504, |x| itself fits
        return self.lin_out(h)


def loop(model):
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        model(torch.randn(8, 16, generator=g))


def run():
    return probe(
        Planted(), loop, ProbeConfig(w8a8=False, attribution=False), modalities={"": "denoiser"}
    )


def test_all_planted_modules_flagged_and_no_clean_one():
    report = run()
    flagged = {m.name for m in report.modules if m.fp16 is not None and m.fp16.overflow}
    assert flagged == {"big", "ln_var"}
    assert report.modalities["denoiser"].overflowing == 2


def test_evidence_and_both_ascend_modes():
    report = run()
    big = report.module("big").fp16
    assert big.output_absmax > 65504 and big.headroom_out < 1
    assert big.inf_nan_count > 0  # INF_NAN mode
    assert big.rel_error_fp16 is None  # undefined with inf outputs
    assert big.rel_error_fp16_saturate is not None and big.rel_error_fp16_saturate > 1e-3  # silent
    assert big.rel_error_bf16 is not None and big.rel_error_bf16 < 1e-2  # bf16 has the range
    assert any("inf/nan" in r for r in big.reasons)
    ln = report.module("ln_var").fp16
    assert ln.sumsq_absmax > 65504 and ln.input_absmax < 32752
    assert any("variance" in r for r in ln.reasons)
    clean = report.module("lin_out").fp16
    assert clean.inf_nan_count == 0 and clean.rel_error_fp16 < 1e-2
    assert clean.headroom_out > 100


def test_headroom_threshold_flags_near_overflow():
    class Near(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4, bias=False)
            with torch.no_grad():
                self.lin.weight.copy_(torch.eye(4) * 40000.0)

        def forward(self, x):
            return self.lin(x)

    def near_loop(m):
        m(torch.ones(2, 4))

    strict = probe(
        Near(), near_loop, ProbeConfig(w8a8=False, min_headroom=2.0), modalities={"": "other"}
    )
    lax = probe(
        Near(), near_loop, ProbeConfig(w8a8=False, min_headroom=1.0), modalities={"": "other"}
    )
    assert strict.module("lin").fp16.overflow  # 40000 > 65504 / 2
    assert not lax.module("lin").fp16.overflow  # fits fp16
