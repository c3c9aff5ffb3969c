"""``opsnn-quant evaluate``: acceptance of a quantized model against its float baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opsnn_quant.cli import _ui


def evaluate_cmd(
    candidate: Annotated[
        Path,
        typer.Option(
            help="calibrate output directory (holds quant/), an AscendV1 directory "
            "(needs --baseline unless ours), or a model source"
        ),
    ],
    suite: Annotated[str, typer.Option(help="suite YAML path or built-in name")],
    out: Annotated[Path, typer.Option("-o", "--out", help="report directory")],
    force: Annotated[
        bool, typer.Option("--force", help="replace OUT even if it is not a report")
    ] = False,
    baseline: Annotated[
        str | None, typer.Option(help="float model (default: the candidate's source)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    device: Annotated[
        str, typer.Option(help="place both models on cpu | npu | npu:N | cuda:N")
    ] = "cpu",
    dtype: Annotated[
        str, typer.Option(help="load both models in float32 | float16 | bfloat16")
    ] = "float32",
    candidate_dtype: Annotated[
        str, typer.Option(help="float32 or float16: dtype of the candidate's float modules")
    ] = "float32",
    latency: Annotated[
        str,
        typer.Option(
            help="what to time: target (the figure the suite's latency criteria read), "
            "all (also eager timing, profile and stability of both models), none"
        ),
    ] = "target",
    target: Annotated[
        str | None,
        typer.Option(
            help="deployment target latency is judged for (default: the candidate's "
            "policy.yaml); latency on any other backend is reported, not judged"
        ),
    ] = None,
    allow_pickle: Annotated[
        bool,
        typer.Option("--allow-pickle", help=_ui.ALLOW_PICKLE_HELP + " (also a suite's CLIP)"),
    ] = False,
    allow_broken_baseline: Annotated[
        bool,
        typer.Option(
            "--allow-broken-baseline",
            help="judge the candidate even when the float baseline's outputs are mostly empty "
            "or flat (a broken or random model)",
        ),
    ] = False,
) -> None:
    """Run baseline and candidate on the suite; write report.{json,md,html}. Exit 0 PASS, 3 FAIL."""
    from opsnn_quant.evaluation.report import fmt
    from opsnn_quant.pipeline.evaluate import check_evaluate, run_evaluate

    job = check_evaluate(
        candidate, suite, out, baseline=baseline, target=target, device=device, dtype=dtype,
        candidate_dtype=candidate_dtype, latency=latency, allow_pickle=allow_pickle, force=force,
        allow_broken_baseline=allow_broken_baseline,
    )  # fmt: skip
    with _ui.phases(quiet) as say:
        report = run_evaluate(job, progress=say)
    if not quiet:
        for c in report.criteria:
            _ui.console.print(
                f"{c.status:10} {c.label} [{c.backend}]: {fmt(c.value)} "
                f"(threshold {c.comparator} {fmt(c.threshold)})"
                + (f"; {c.note}" if c.note else ""),
                markup=False,
            )
        _ui.console.print(f"[b]{report.verdict}[/b]: wrote {out}/report.html")
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    """Add ``evaluate`` to ``app``."""
    app.command("evaluate")(evaluate_cmd)
