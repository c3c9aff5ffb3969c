"""``opsnn-quant evaluate``: acceptance of a quantized model against its float baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opsnn_quant.cli import _ui
from opsnn_quant.outputs import CalibrateOutput, DirectoryKind, classify


def _float_source(candidate: Path, baseline: str | None, kind: DirectoryKind) -> str:
    """The float model the candidate is compared with (and, for AscendV1, loaded into)."""
    from opsnn_quant.deploy.candidate import check_ascendv1_candidate, recorded_source
    from opsnn_quant.errors import ConfigError
    from opsnn_quant.quant.checkpoint import read_description

    if kind is DirectoryKind.ASCENDV1:
        check_ascendv1_candidate(candidate)  # whole (every header, every tensor) before output
        source = baseline or recorded_source(candidate)
        if not source:
            raise ConfigError(
                f"{candidate} is an AscendV1 directory: pass --baseline, the float model "
                "it was quantized from"
            )
        return str(source)
    if kind is DirectoryKind.CALIBRATE_OUTPUT:
        return str(
            baseline or read_description(CalibrateOutput(candidate).quant).get("source_model")
        )
    return baseline or str(candidate)


def _check_options(
    candidate_dtype: str, latency: str, device: str, dtype: str, target: str | None
) -> None:
    """Bad options fail before any model is loaded."""
    from opsnn_quant.backends.devices import resolve_device, resolve_dtype
    from opsnn_quant.errors import ConfigError
    from opsnn_quant.evaluation.gate import check_latency_mode
    from opsnn_quant.policy.targets import get_target

    if candidate_dtype not in ("float32", "float16"):
        raise ConfigError(f"--candidate-dtype must be float32 or float16, got {candidate_dtype!r}")
    check_latency_mode(latency)
    resolve_device(device)
    resolve_dtype(dtype)
    if target is not None:
        get_target(target)


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
) -> None:
    """Run baseline and candidate on the suite; write report.{json,md,html}. Exit 0 PASS, 3 FAIL."""
    import torch

    from opsnn_quant.backends.devices import resolve_device
    from opsnn_quant.evaluation.evaluate import (
        candidate_inputs,
        cast_adapter,
        evaluate,
        load_candidate,
        policy_summary,
    )
    from opsnn_quant.evaluation.render import OUTPUT_KIND, write_report
    from opsnn_quant.evaluation.report import fmt
    from opsnn_quant.evaluation.suite import load_suite, suite_inputs
    from opsnn_quant.io import check_output_dir
    from opsnn_quant.models import check_weights, load_adapter
    from opsnn_quant.sources import local_paths

    _check_options(candidate_dtype, latency, device, dtype, target)
    s = load_suite(suite)
    kind = classify(candidate)
    ascendv1 = kind is DirectoryKind.ASCENDV1
    source = _float_source(candidate, baseline, kind)
    holder = CalibrateOutput.holding(candidate) if ascendv1 else None
    inputs = [*candidate_inputs(candidate), *suite_inputs(suite)]
    inputs += [str(p) for p in local_paths(str(source))]
    check_weights(str(source), allow_pickle=allow_pickle)
    check_output_dir(out, OUTPUT_KIND, force=force, inputs=inputs)
    with _ui.phases(quiet) as say:
        say("loading models")
        cand, sensitivity = load_candidate(
            candidate, device=device, dtype=dtype, baseline=str(source) if ascendv1 else None,
            allow_pickle=allow_pickle,
        )  # fmt: skip
        if candidate_dtype == "float16":
            cast_adapter(cand, torch.float16)
        base = load_adapter(
            None, str(source), device=device, dtype=dtype,
            allow_pickle=allow_pickle,
        )  # fmt: skip
        report = evaluate(
            base,
            cand,
            s,
            # our export sits in OUT/export/ascendv1: its policy (target) is OUT's
            policy=policy_summary(holder.root if holder is not None else candidate),
            sensitivity=sensitivity,
            progress=say,
            latency=latency,
            target=target,
            # an AscendV1 model runs the engines' int8 arithmetic, not plain eager float
            candidate_backend=f"{resolve_device(device).type}-reference" if ascendv1 else None,
            allow_pickle=allow_pickle,
        )
        write_report(
            report,
            out,
            force=force,
        )
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
