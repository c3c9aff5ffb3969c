"""Stage hooks, top modules by profiler time, stability runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from opsnn_quant.errors import InputError
from opsnn_quant.evaluation.profile import StageTimer, stability_run, top_modules
from tests.evaluation.test_latency import FakeClock
from tests.tiny_models import TinyAttention, TinyMLP


class SlowFc2(nn.Module):
    """TinyMLP whose fc2 is much bigger, so the profiler must rank it first."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Sequential(nn.Linear(16, 2048), nn.Linear(2048, 2048))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_stage_timer_counts_calls_and_times_with_fake_clock():
    model = TinyMLP()
    clock = FakeClock([0.0])
    # Make each fc1 call "take" 3 ms and each fc2 call 5 ms by advancing the clock in hooks.
    model.fc1.register_forward_hook(lambda *a: setattr(clock, "now", clock.now + 0.003))
    model.fc2.register_forward_hook(lambda *a: setattr(clock, "now", clock.now + 0.005))
    (x,) = model.example_inputs()
    with StageTimer({"encoder": model.fc1, "decoder_step": model.fc2}, clock=clock) as st:
        for _ in range(3):
            model(x)
    rows = {r.stage: r for r in st.rows()}
    assert rows["encoder"].calls == 3 and rows["decoder_step"].calls == 3
    assert rows["encoder"].total_ms == pytest.approx(9.0)
    assert rows["decoder_step"].mean_ms == pytest.approx(5.0)
    assert rows["encoder"].module == "Linear"
    model(x)  # hooks removed on exit
    assert rows["encoder"].calls == 3 and len(st.samples["encoder"]) == 3


def test_stage_timer_nested_module_counted_once():
    outer = nn.Sequential(nn.Linear(4, 4))
    outer.add_module("again", outer[0])  # the same Linear called twice inside one forward
    with StageTimer({"block": outer, "lin": outer[0]}) as st:
        outer(torch.randn(2, 4))
    assert len(st.samples["block"]) == 1 and len(st.samples["lin"]) == 2
    with pytest.raises(InputError):
        StageTimer({})


def test_top_modules_ranks_the_big_layer_first():
    model = SlowFc2()
    x = torch.randn(128, 16)

    def work() -> None:
        # Three calls: one preemption on a busy machine cannot outweigh 3 big matmuls.
        for _ in range(3):
            model(x)

    rows = top_modules(model, work, top=3)
    names = [r.name for r in rows]
    assert names[0] == "fc2.1" and set(names) == {"fc2.0", "fc2.1", "fc1"}
    assert all(r.calls == 3 and r.type == "Linear" for r in rows)
    assert 0 < rows[0].share <= 1.0
    blocks = top_modules(model, work, top=10, leaf_only=False)
    assert blocks[0].name == "fc2" and blocks[0].type == "Sequential"


def test_top_modules_on_attention_block():
    model = TinyAttention()
    (x,) = model.example_inputs()
    rows = top_modules(model, lambda: model(x), top=10)
    assert {r.name for r in rows} <= {n for n, _ in model.named_modules() if n}
    assert len(rows) == 8  # 8 leaf modules, each called once


def test_stability_drift_and_growth():
    # 20 calls: first two 10 ms, last two 15 ms -> decile medians 10 and 15, drift 1.5.
    durations = [0.010, 0.010] + [0.012] * 16 + [0.015, 0.015]
    clock = FakeClock(durations)
    leak: list[bytes] = []

    def work() -> None:
        clock.work()
        leak.append(b"x" * (4 * 1024 * 1024))  # 4 MiB retained per call

    r = stability_run(work, 20, clock=clock)
    assert r.k == 20 and len(r.samples_ms) == 20
    assert r.first_decile_median_ms == pytest.approx(10.0)
    assert r.last_decile_median_ms == pytest.approx(15.0)
    assert r.drift_ratio == pytest.approx(1.5)
    # 19 calls after the first retain 76 MiB; RSS grows by about that.
    assert r.memory_growth_bytes >= 0.8 * 19 * 4 * 1024 * 1024
    assert r.memory_growth_per_call_bytes == pytest.approx(r.memory_growth_bytes / 19)
    assert r.backend == "cpu-reference"
    with pytest.raises(InputError):
        stability_run(work, 1)


def test_the_profilers_own_lines_stay_out_of_the_output():
    # Kineto writes "USDT:... profiler_start/stop" to the process's stderr on every profile:
    # dropped; anything else written there meanwhile (a real warning) is passed on
    import subprocess
    import sys

    code = (
        "import os, torch\n"
        "from opsnn_quant.evaluation.profile import top_modules\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8))\n"
        "def fn():\n"
        "    m(torch.randn(2, 8)); os.write(2, b'a real warning\\n')\n"
        "rows = top_modules(m, fn, top=1, warmup=0)\n"
        "print(rows[0].name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "0"
    assert done.stderr.splitlines() == ["a real warning"]
