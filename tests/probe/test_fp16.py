"""fp16 overflow probe: planted overflows are all flagged and clean modules never are."""

import numpy as np
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


# ---- the Ascend Cube emulation of the re-runs (probe/fp16.run_as, mode="emulate") -------------


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 -> float32, round to nearest even, on the bit pattern."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_emulation_is_fp16_operands_fp32_accumulation_one_fp16_output_rounding():
    # Hand-checkable Linear: operands with few significant bits, so every product and sum is
    # exact in fp32 and the one rounding is the fp16 output's: 65504 stays, 65512 rounds to the
    # even neighbour 65504, 65520 and beyond overflow to inf (INF_NAN) or clamp (saturation).
    from opsnn_quant.probe.fp16 import run_as

    lin = nn.Linear(2, 4, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 0.5], [1.0, 1.0], [0.25, -3.0]]))
        lin.bias.copy_(torch.tensor([0.0, 0.0, 16.0, 1.5]))
    x = torch.tensor([[65504.0, 16.0], [-65504.0, 0.125]])
    want = np.array([[65504.0, 65512.0, 65536.0, 16376.0 - 48.0 + 1.5],
                     [-65504.0, -65504.0 + 0.0625, -65504.0 + 16.125, -16376.0 - 0.375 + 1.5]])  # fmt: skip
    inf_nan = want.astype(np.float16).astype(np.float32)  # numpy: RNE, overflow to inf
    saturated = np.clip(want, -65504, 65504).astype(np.float16).astype(np.float32)
    got = run_as(lin, (x,), torch.float16, saturate=False, mode="emulate")
    assert np.array_equal(got.numpy(), inf_nan, equal_nan=True)
    assert np.isinf(got[0, 2]) and got[0, 1] == 65504.0
    got_sat = run_as(lin, (x,), torch.float16, saturate=True, mode="emulate")
    assert np.array_equal(got_sat.numpy(), saturated) and got_sat[0, 2] == 65504.0


def test_emulation_in_bf16_rounds_the_operands_to_bf16():
    from opsnn_quant.probe.fp16 import run_as

    torch.manual_seed(3)
    lin = nn.Linear(3, 2, bias=False)
    x = torch.randn(4, 3)
    w = _bf16_round(lin.weight.detach().numpy())
    want = _bf16_round(
        (_bf16_round(x.numpy()).astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)
    )
    got = run_as(lin, (x,), torch.bfloat16, saturate=False, mode="emulate")
    assert np.array_equal(got.numpy(), want)


def test_emulation_flags_exactly_what_the_real_fp16_run_flags(tmp_path):
    # The planted pipeline (every kind of overflow the probe knows) probed twice: with CPU fp16
    # kernels and with the Cube emulation. The same modules are flagged.
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from tests.planted import save_planted_sd

    save_planted_sd(tmp_path / "pipe")
    (tmp_path / "p.txt").write_text("a red circle\n")
    adapter = load_adapter("diffusers-sd", str(tmp_path / "pipe"), steps=1, batch_size=1)
    loop = adapter.forward_loop(load_records(str(tmp_path / "p.txt")))
    flagged = {}
    for mode in ("native", "emulate"):
        report = probe(adapter, loop, ProbeConfig(w8a8=False, fp16_rerun=mode))
        flagged[mode] = {m.name for m in report.modules if m.fp16 and m.fp16.overflow}
        infs = {m.name for m in report.modules if m.fp16 and m.fp16.inf_nan_count}
        flagged[mode + " inf"] = infs
    assert flagged["native"] == flagged["emulate"] and len(flagged["emulate"]) >= 5
    assert flagged["native inf"] == flagged["emulate inf"] and flagged["emulate inf"]


def test_fp16_reruns_sample_calls_1_4_16_and_every_call_near_65504(monkeypatch):
    # The emulated re-run can only overflow where the fp32 range nears 65504, so the calls in
    # between are skipped; a call past 65504 / 8 is always re-run (bf16 too), whatever its index.
    import opsnn_quant.probe.fp16 as fp16

    ran: list[tuple[int, str]] = []
    real = fp16.run_as

    def counting(module, args, dtype, **kw):
        ran.append((acc.calls, "bf16" if dtype == torch.bfloat16 else "fp16"))
        return real(module, args, dtype, **kw)

    monkeypatch.setattr(fp16, "run_as", counting)
    lin = nn.Linear(4, 4)
    acc = fp16.Fp16Accumulator(rerun=True)
    for call in range(1, 21):
        x = torch.randn(2, 4) * (1e4 if call == 7 else 1.0)  # call 7: |x| > 65504 / 8
        acc.update(lin, x, lin(x), (x,))
    fp16_calls = sorted({c for c, kind in ran if kind == "fp16"})
    assert fp16_calls == [1, 4, 7, 16]
    assert sorted({c for c, kind in ran if kind == "bf16"}) == [1, 7]
    assert [n for n in range(1, 300) if fp16.is_sampled_call(n)] == [1, 4, 16, 64, 256]


def test_a_sampled_call_far_from_65504_reruns_on_a_strided_subset_of_samples(monkeypatch):
    # Call 1 (sampled, |x| ~ 1) re-runs on every 4th sample of 8 (RERUN_ROWS = 1024 rows, 512
    # rows per sample: 2 samples); call 4 (sampled, |x| past 65504 / 8) re-runs whole.
    import opsnn_quant.probe.fp16 as fp16

    ran: list[tuple[int, torch.Size]] = []
    real = fp16.run_as

    def recording(module, args, dtype, **kw):
        ran.append((acc.calls, args[0].shape))
        return real(module, args, dtype, **kw)

    monkeypatch.setattr(fp16, "run_as", recording)
    g = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    acc = fp16.Fp16Accumulator(rerun=True)
    xs = [torch.randn(8, 3, 16, 32, generator=g) for _ in range(4)]
    xs[3] = xs[3] * 1e4
    for x in xs:
        with torch.no_grad():
            acc.update(conv, x, conv(x), (x,))
    assert ran[0] == (1, torch.Size([2, 3, 16, 32]))  # samples 0 and 4
    assert {shape for call, shape in ran if call == 4} == {torch.Size([8, 3, 16, 32])}
    assert {call for call, _ in ran} == {1, 4}
    # the subset's error is exactly the error of those samples re-run alone
    whole, alone = fp16.Fp16Accumulator(rerun=True), fp16.Fp16Accumulator(rerun=True)
    with torch.no_grad():
        whole.update(conv, xs[0], conv(xs[0]), (xs[0],))
        sub = xs[0][::4]
        alone.update(conv, sub, conv(sub), (sub,))
    assert float(whole.err16.signal) > 0
    assert whole.err16.ratio() == alone.err16.ratio()
    assert whole.err_bf16.ratio() == alone.err_bf16.ratio()


def test_re_runs_are_chosen_by_the_call_s_place_in_the_data():
    import opsnn_quant.probe.fp16 as fp16

    # calls 1, 4, 16 of batches 0, 3, 15: log-spaced in both
    sampled = [(b, c) for b in range(20) for c in range(1, 20) if fp16.is_sampled_position(b, c)]
    assert sampled == [(b, c) for b in (0, 3, 15) for c in (1, 4, 16)]
