"""Machine-proof verdicts (issue 44 §5): a shipped recipe's acceptance verdict may become
INCONCLUSIVE on another CPU kind, never flip between PASS and FAIL.

Why: the shipped ``whisper-tiny-en`` recipe judged by its suite gave +1.34 WER points (FAIL) on an
AVX2 EPYC and +0.45 (PASS) on an AVX-512 one, same code and data: the float kernels round
differently and a few words flip. The verdicts now stand on paired bootstrap intervals; this
test perturbs the float kernels the way another CPU kind does and judges again.

The other machine is this one computing as the next older CPU kind does: a fresh process whose
MKL GEMMs (``MKL_CBWR``), oneDNN convolutions (``ONEDNN_MAX_CPU_ISA``) and torch's own
vectorised kernels (``ATEN_CPU_CAPABILITY``) take the AVX2 code paths on an AVX-512 machine
(the issue's two machines; SSE4.2 below an AVX2 one), with the other intra-op thread count and
the other int8 GEMM path (``OPSNN_QUANT_INT8_GEMM=fp32-chunk`` there, native here where it is
exact: the int8 modules must give the same integers on both). Both run the shipped recipe's
candidate and its float model through :func:`~opsnn_quant.evaluation.evaluate.evaluate` on the
suite with its data set to the first :data:`WHISPER_UTTERANCES` utterances of the committed eval
split (the figures below were measured there; the suite itself judges eval-large, whose audio
depends on the local espeak-ng); the test asserts that the other
machine changed at least one transcript (else it proves nothing) and that, over the four
pairings of each model's transcripts from either machine, no criterion and no verdict is PASS
in one and FAIL in another. The old point-estimate rule (``value <= threshold``:
:func:`~opsnn_quant.evaluation.runner.verdict` without intervals) is printed beside.

Measured on this machine (AMD EPYC with AVX-512, 2 busy cores, 16 utterances, 115 words):

=================================  ========================  =============================
figure (threshold)                 here (AVX-512, 1 thread)  other (AVX2, 2 threads,
                                                             fp32-chunk int8 GEMM)
=================================  ========================  =============================
WER delta, points (<= 1.0)         -0.87 [-2.61, 0.00] PASS  +1.74 [-1.77, 5.93] INCONCL.
CER delta, points (<= 1.0)         -0.18 [-0.54, 0.00] PASS  +1.07 [-0.36, 2.86] INCONCL.
agreement WER, points (<= 5.0)     0.87 [0.00, 2.61] PASS    3.48 [0.00, 7.44] INCONCL.
verdict (intervals)                PASS                      INCONCLUSIVE
old point rule: WER / CER / agr.   PASS / PASS / PASS        FAIL / FAIL / PASS
=================================  ========================  =============================

The other CPU kind changed 4 of the candidate's 16 transcripts ("four" -> "4", "Garage" ->
"garage", "hot" -> "heart", "They moved" -> "May move") and none of the float model's: the
old rule flips the WER and CER criteria PASS -> FAIL, as in the issue; the interval rule goes
PASS -> INCONCLUSIVE. The two mixed pairings give the same figures as the machine of the
candidate's transcripts. Tried before (same slice, in one process): the other thread count
alone and the fp32-chunk int8 GEMM alone change no transcript (MKL_CBWR=AUTO,STRICT is set
for the tests; the int8 paths give the same integers); seeded noise ``y * eps * N(0, 1)`` on
every float Linear/Conv/LayerNorm output, which moves the encoder output by a relative RMS of
1.0e-6 at 1 ulp, 1.7e-6 at 4 and 5.8e-6 at 16 (the AVX2 kernels move it by 1.5e-6), changed 0
to 4 candidate transcripts per seed (eps 1, 4, 16 ulps; none of the float model's) and, at 16
ulps, also flipped the old rule's WER criterion PASS -> FAIL where the interval rule said
INCONCLUSIVE. The real kernels are used here: no noise model to argue about. Wall time about
70 s on 2 busy cores (the other machine runs beside this one).

Not covered: the shapes-t2i recipe. Its calibrate (the measured probe its search reads) took
295 s here, and its figures sit far from the suite's thresholds (32 prompts: PSNR median
37.1 [36.2, 39.2] dB against >= 20, SSIM 0.963 [0.956, 0.968] against >= 0.70, CLIP delta
-0.15 [-0.42, 0.10] against >= -1.0): no rounding of another CPU can move them there.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._deps import needs_espeak

ROOT = Path(__file__).resolve().parents[2]
WHISPER_UTTERANCES = 16  # the first N utterances of the committed eval split

DECIDED = {"PASS", "FAIL"}
SIDES = ("baseline", "candidate")
# This CPU's vector ISA (torch's dispatch) -> the environment of the next older CPU kind: MKL's
# GEMMs (conditional numerical reproducibility branch), oneDNN's convolutions and torch's own
# vectorised kernels (LayerNorm, softmax, GELU) all take its code paths.
LOWER_ISA = {
    "AVX512": {"MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2",
               "ATEN_CPU_CAPABILITY": "avx2"},
    "AVX2": {"MKL_CBWR": "SSE4_2,STRICT", "ONEDNN_MAX_CPU_ISA": "SSE41",
             "ATEN_CPU_CAPABILITY": "default"},
}  # fmt: skip


def other_cpu_kind() -> dict[str, str]:
    """The environment that makes a fresh process compute like the next older CPU kind, with
    the other thread count and the other int8 GEMM path; skips where there is none."""
    from opsnn_quant.ascend.gemm_path import ENV

    isa = torch.backends.cpu.get_cpu_capability()
    if isa not in LOWER_ISA:
        pytest.skip(f"no older x86 vector ISA to emulate below {isa}")
    threads = 2 if torch.get_num_threads() == 1 else 1
    return {**LOWER_ISA[isa], ENV: "fp32-chunk", "OPSNN_QUANT_TEST_THREADS": str(threads)}


def judge_slice(calibrated: Path, samples: int) -> tuple[Any, Any, Any]:
    """``evaluate`` of the calibrated candidate against its float model on the first
    ``samples`` utterances of the committed eval split: the suite so sliced, the float model
    and the report (with both models' transcripts)."""
    from opsnn_quant.evaluation.evaluate import evaluate
    from opsnn_quant.evaluation.suite import load_suite
    from opsnn_quant.formats.candidates import load_candidate
    from opsnn_quant.models import load_adapter

    suite = load_suite("whisper-tiny-en")
    data = suite.data.model_copy(update={"split": "eval", "samples": samples})
    suite = suite.model_copy(update={"data": data})
    candidate, _ = load_candidate(calibrated)
    baseline = load_adapter(None, "zoo:whisper-tiny.en")
    return suite, baseline, evaluate(baseline, candidate, suite, latency="none", created="")


def child(calibrated: str, samples: int, out: str) -> None:
    """The other machine's run (a fresh process, started with :func:`other_cpu_kind`'s
    environment): its transcripts and criteria as JSON."""
    torch.set_num_threads(int(os.environ["OPSNN_QUANT_TEST_THREADS"]))
    _, _, report = judge_slice(Path(calibrated), samples)
    info = {"isa": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    Path(out).write_text(json.dumps({"outputs": report.outputs, "figures": figures(report),
                                     "nan": nan_shares(report), "info": info}))  # fmt: skip


NAN_KEYS = ("baseline_nan_share", "candidate_nan_share")


def nan_shares(report: Any) -> dict[str, float]:
    """The share of each model's outputs computed from NaN, as the report measured them (what
    evaluate adds to the quality figures: a model's own, whichever machine judges it)."""
    return {k: report.measured[k] for k in NAN_KEYS}


def figures(report: Any) -> dict[str, tuple[Any, ...]]:
    """Each judged criterion: (value, ci_low, ci_high, status)."""
    return {
        c.key: (c.value, c.ci_low, c.ci_high, c.status)
        for c in report.criteria
        if c.status != "NOT JUDGED"
    }


def point_rule(suite: Any, report: Any) -> dict[str, str]:
    """The statuses the old point-estimate rule (no intervals) gives the report's figures."""
    from opsnn_quant.evaluation.runner import verdict

    return {
        c.key: c.status
        for c in verdict(suite, report.measured, quality_backend="cpu-reference")
        if c.status != "NOT JUDGED"
    }


def assert_no_flip(runs: dict[str, Any], rule: str) -> None:
    """No criterion, and no verdict, both PASS and FAIL across ``runs`` (name -> statuses)."""
    keys = set().union(*runs.values())
    for key in sorted(keys):
        seen = {statuses[key] for statuses in runs.values() if key in statuses}
        assert not seen >= DECIDED, f"{rule}: {key} flips between PASS and FAIL: {runs}"


@pytest.fixture(scope="session")
def whisper_calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped ``whisper-tiny-en`` recipe calibrated with the policy its measured search
    chose (``--strategy all-w8a8-dynamic``). Dynamic W8A8 reads no activation statistics, so
    one calibration utterance, no holdout and no fp16/bf16 probe give the same
    ``quant/model.safetensors`` bytes as the recipe's full run (checked once by hand: ``cmp``
    equal) in a fraction of the time."""
    from opsnn_quant.pipeline.calibrate import run_calibrate
    from opsnn_quant.pipeline.recipe import load_recipe
    from opsnn_quant.policy.schema import PrecisionPolicy
    from opsnn_quant.types import Precision

    recipe = load_recipe("whisper-tiny-en").with_strategy("all-w8a8-dynamic")
    recipe = recipe.model_copy(update={
        "data": recipe.data.model_copy(update={"limit": 1, "holdout": None,
                                               "holdout_limit": None}),
        "probe": recipe.probe.model_copy(update={"fp16": False, "bf16": False}),
    })  # fmt: skip
    out = tmp_path_factory.mktemp("machine-proof") / "whisper"
    run_calibrate(recipe, out, latency="none")
    rules = PrecisionPolicy.load(out / "policy.yaml").rules
    assert len(rules) > 40 and {r.precision for r in rules} == {Precision.W8A8_DYNAMIC}
    return out


@pytest.mark.slow
@needs_espeak
def test_whisper_verdict_never_flips_between_pass_and_fail_on_another_cpu_kind(
    whisper_calibrated, tmp_path, monkeypatch
):
    import opsnn_quant.ascend.matmul as matmul
    from opsnn_quant.ascend.gemm_path import ENV
    from opsnn_quant.evaluation.evaluate import QualityInputs, suite_records
    from opsnn_quant.evaluation.runner import build_report

    started = time.perf_counter()
    env = {**os.environ, **other_cpu_kind()}
    there = tmp_path / "other.json"
    code = (
        f"from tests.evaluation.test_machine_proof import child; "
        f"child({str(whisper_calibrated)!r}, {WHISPER_UTTERANCES}, {str(there)!r})"
    )
    # the other machine runs meanwhile (a fresh process: the ISA is chosen at start-up)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    if matmul.int8_gemm_is_exact():  # here the native int8 GEMM, there fp32-chunk
        monkeypatch.setenv(ENV, "native")
    suite, baseline, here = judge_slice(whisper_calibrated, WHISPER_UTTERANCES)
    log, _ = proc.communicate()
    assert proc.returncode == 0, log[-3000:]
    other = json.loads(there.read_text())
    outputs = {"here": here.outputs, "other": tuple(other["outputs"])}
    changed = [
        f"{side} #{i}: {x!r} -> {y!r}"
        for side, a, b in zip(SIDES, outputs["here"], outputs["other"], strict=True)
        for i, (x, y) in enumerate(zip(a, b, strict=True))
        if x != y
    ]
    print(f"here {torch.backends.cpu.get_cpu_capability()}, other {other['info']}:")
    print("\n".join(changed))
    assert changed, "the other CPU kind changed no transcript: the test proves nothing"

    # Each model's transcripts from one machine with the other's from the other (a float
    # baseline run on one CPU kind, the candidate on the other): two more pairs at no cost,
    # judged as evaluate judges (checked on the pairs it made itself).
    inputs = QualityInputs.load(suite, baseline, suite_records(suite))
    level = suite.metrics.confidence
    pairs = {}
    nan = {"here": nan_shares(here), "other": other["nan"]}
    for bn, cn in itertools.product(outputs, repeat=2):
        quality = inputs.quality(outputs[bn][0], outputs[cn][1], confidence=level)
        quality.measured.update(baseline_nan_share=nan[bn]["baseline_nan_share"],
                                candidate_nan_share=nan[cn]["candidate_nan_share"])  # fmt: skip
        pairs[f"baseline {bn}, candidate {cn}"] = build_report(suite, quality, created="")
    assert figures(pairs["baseline here, candidate here"]) == figures(here)
    assert (
        json.loads(json.dumps(figures(pairs["baseline other, candidate other"])))
        == other["figures"]
    )
    for name, r in pairs.items():
        print(f"{name}: {r.verdict} {figures(r)}; point rule {point_rule(suite, r)}")
    print(f"wall {time.perf_counter() - started:.1f} s")
    assert_no_flip({n: {k: v[3] for k, v in figures(r).items()} for n, r in pairs.items()},
                   "intervals")  # fmt: skip
    assert not {r.verdict for r in pairs.values()} >= DECIDED
