"""``opsnn-quant evaluate``: acceptance of a quantized model against its float baseline."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opsnn_quant.cli import _ui

if TYPE_CHECKING:
    from opsnn_quant.evaluation.report import AcceptanceReport
    from opsnn_quant.pipeline.evaluate import EvaluateJob


CandidateOpt = Annotated[
    Path,
    typer.Option(
        help="calibrate output directory (holds quant/), an AscendV1 directory "
        "(needs --baseline unless ours), or a model source"
    ),
]
SuiteOpt = Annotated[str, typer.Option(help="suite YAML path or built-in name")]
ReportOutOpt = Annotated[Path, typer.Option("-o", "--out", help="report directory")]
ForceOpt = Annotated[bool, typer.Option("--force", help=_ui.FORCE_HELP)]
BaselineOpt = Annotated[
    str | None, typer.Option(help="float model (default: the candidate's source)")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q")]
DeviceOpt = Annotated[str, typer.Option(help="place both models on cpu | npu | npu:N | cuda:N")]
DtypeOpt = Annotated[str, typer.Option(help="load both models in float32 | float16 | bfloat16")]
CandidateDtypeOpt = Annotated[
    str, typer.Option(help="float32 or float16: dtype of the candidate's float modules")
]
LatencyOpt = Annotated[
    str,
    typer.Option(
        help="what to time: target (the figure the suite's latency criteria read), "
        "all (also eager timing, profile and stability of both models), none"
    ),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        help="deployment target latency is judged for (default: the candidate's "
        "policy.yaml); latency on any other backend is reported, not judged"
    ),
]
AllowPickleOpt = Annotated[
    bool,
    typer.Option("--allow-pickle", help=_ui.ALLOW_PICKLE_HELP + " (also a suite's CLIP)"),
]
AllowBrokenBaselineOpt = Annotated[
    bool,
    typer.Option(
        "--allow-broken-baseline",
        help="judge the candidate even when the float baseline is broken (a random model: "
        "outputs mostly empty, flat or one token repeated, WER above 100%, NaN)",
    ),
]
NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        help="processes on this host, one per device, each with whole requests (launches "
        "torchrun's elastic agent; across hosts run torchrun -m opsnn_quant evaluate)",
    ),
]
DistBackendOpt = Annotated[
    str | None,
    typer.Option(
        "--dist-backend", help="hccl | nccl | gloo [default: hccl on npu, nccl on cuda, gloo]"
    ),
]


def evaluate_cmd(
    candidate: CandidateOpt,
    suite: SuiteOpt,
    out: ReportOutOpt,
    force: ForceOpt = False,
    baseline: BaselineOpt = None,
    quiet: QuietOpt = False,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    candidate_dtype: CandidateDtypeOpt = "float32",
    latency: LatencyOpt = "target",
    target: TargetOpt = None,
    allow_pickle: AllowPickleOpt = False,
    allow_broken_baseline: AllowBrokenBaselineOpt = False,
    nproc: NprocOpt = None,
    dist_backend: DistBackendOpt = None,
) -> None:
    """Run baseline and candidate on the suite; write report.{json,md,html}. Exit 0 PASS, 3
    FAIL, 4 INCONCLUSIVE.

    Each quality figure (but FD) carries its paired bootstrap interval (the suite's
    metrics.confidence, 95% by default): a criterion passes when the whole interval meets its
    threshold, fails when none of it does, and is INCONCLUSIVE otherwise, with about how many
    samples would decide it. Verdict: FAIL if any criterion fails, else INCONCLUSIVE if any
    is, else PASS.

    Under torchrun (or with --nproc) the suite's requests are shared by rank; rank 0 writes.
    """
    import dataclasses

    from opsnn_quant import distributed as dist
    from opsnn_quant.pipeline.evaluate import check_evaluate, run_evaluate

    def check(on: str) -> EvaluateJob:
        return check_evaluate(
            candidate, suite, out, baseline=baseline, target=target, device=on, dtype=dtype,
            candidate_dtype=candidate_dtype, latency=latency, allow_pickle=allow_pickle,
            force=force, allow_broken_baseline=allow_broken_baseline,
        )  # fmt: skip

    if nproc is not None and not dist.launched():
        raise typer.Exit(launch(check(device), nproc, dist_backend))
    world = dist.init_world(device, dist_backend)
    try:
        # rank 0 checks (one writer: only it may repair or replace OUT); every rank gets the job
        on = world.device if world.distributed else device  # each rank its own device
        job = dataclasses.replace(world.from_main(lambda: check(on)), device=on)
        quiet = quiet or not world.is_main
        with _ui.phases(quiet) as say:
            report = run_evaluate(job, progress=say)
    finally:
        dist.finish_world()
    if not quiet:
        print_report(report, candidate, out)
    raise typer.Exit(report.exit_code)


def print_report(report: AcceptanceReport, candidate: Path, out: Path) -> None:
    """Each criterion on one line (status, figure, interval, threshold), then the verdict and
    what to try next."""
    from opsnn_quant.evaluation.render import interval_text
    from opsnn_quant.evaluation.report import fmt

    for c in report.criteria:
        ci = interval_text(c)
        _ui.console.print(
            f"{c.status:12} {c.label} [{c.backend}]: {fmt(c.value)} "
            + ("" if ci == "-" else f"{ci} n={c.n} ")
            + f"(threshold {c.comparator} {fmt(c.threshold)})"
            + (f"; {c.note}" if c.note else ""),
            markup=False,
        )
    _ui.console.print(f"[b]{report.verdict}[/b]: wrote {out}/report.html")
    for line in report.next_steps(str(candidate)):
        _ui.console.print(line, markup=False)


def launch(job: EvaluateJob, nproc: int, backend: str | None) -> int:
    """``--nproc N``: the checked command again in N processes on this host (torchrun's
    elastic agent); returns the run's exit code."""
    from opsnn_quant import distributed as dist
    from opsnn_quant.evaluation.evaluate import suite_records

    dist.check_nproc(nproc, len(suite_records(job.suite)))
    dist.check_devices(job.device.split(":")[0], nproc)
    dist.check_backend(
        backend or {"npu": "hccl", "cuda": "nccl"}.get(job.device.split(":")[0], "gloo")
    )
    return _ui.relaunch(nproc)


def register(app: typer.Typer) -> None:
    """Add ``evaluate`` to ``app``."""
    app.command("evaluate")(evaluate_cmd)
